"""One stage, one supervisor: Snakemake killed with kill -9 leaves no stage process of its run,
and a second supervisor never trains into a work folder a live one owns. Real processes: a real Snakemake running
the real train_stage script on a tiny dataset, and owners that are other processes."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml
from stage_specs import small_stage_spec

from stagedyolo.demo import TARGET_CLASSES, DemoSpec, write_demo_dataset
from stagedyolo.engine.hooks import FaultInjection
from stagedyolo.launch import OWNER_FILE, FolderOwned, owning
from stagedyolo.stage import StageFailed, run_stage
from stagedyolo.stage_plan import build_plan

REPO = Path(__file__).resolve().parent.parent
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
SPEC = small_stage_spec(epochs=3, optimizer="SGD")
# The workflow's own script, as the train_stage rule runs it, with only the inputs it reads.
SNAKEFILE = f"""
from stagedyolo.recipe import stage_inputs

rule train_stage:
    input:
        data="data/data.yaml", dataset_report="dataset_report.json", cache="cache.json", weights=[], probe=[], gate=[]
    output: timing="results/r/stages/{{stage}}/timing.json"
    log: "results/r/logs/{{stage}}.log"
    threads: 1
    resources: attempt=lambda wildcards, attempt: attempt
    params: inputs=lambda wildcards: stage_inputs(config, wildcards.stage)
    script: "{REPO}/workflow/scripts/train_stage.py"
"""


def holder(folder: Path, then: str = "time.sleep(60)") -> subprocess.Popen:
    """Another process that owns `folder`, says so on stdout, then runs `then`."""
    code = (
        f"import os, signal, time; from stagedyolo.launch import owning\n"
        f"with owning({str(folder)!r}):\n    print('owning', flush=True); {then}"
    )
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "owning"
    return process


def test_a_second_supervisor_is_refused_while_a_live_one_owns_the_work_folder(tmp_path):
    work = tmp_path / "work" / "s"
    plan = build_plan(
        SPEC,
        stage="s",
        data=str(tmp_path / "data.yaml"),
        weights=None,
        cfg="yolov5n.yaml",
        cache_mode="none",
        threads=1,
        work_dir=work,
    )
    first = holder(work)
    try:
        started = time.monotonic()
        with pytest.raises(StageFailed, match=f"stage s: {work} is in use by process {first.pid} \\(started "):
            run_stage(
                plan,
                stage_dir=tmp_path / "stages" / "s",
                attempt=1,
                log_path=tmp_path / "s.log",
                engine_home=tmp_path / "engine",
            )
        assert time.monotonic() - started < 5  # refused before any worker starts
        assert json.loads((work / OWNER_FILE).read_text())["pid"] == first.pid
    finally:
        first.kill()
        first.wait()


def test_a_dead_owners_file_is_taken_over(tmp_path):
    folder = tmp_path / "work"
    dead = holder(folder, then="os.kill(os.getpid(), signal.SIGKILL)")
    dead.wait()
    assert json.loads((folder / OWNER_FILE).read_text())["pid"] == dead.pid  # left behind by the kill
    (folder / "keep").write_text("")
    with owning(folder):
        assert json.loads((folder / OWNER_FILE).read_text())["pid"] == os.getpid()


def test_a_live_owner_is_refused_even_where_the_lock_is_not_shared(tmp_path):
    """A filesystem whose flock does not reach other clients: the recorded pid and start time still say it."""
    folder = tmp_path / "work"
    folder.mkdir()
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        owner = {"pid": alive.pid, "started": psutil.Process(alive.pid).create_time()}
        (folder / OWNER_FILE).write_text(json.dumps(owner))
        with pytest.raises(FolderOwned, match=f"in use by process {alive.pid}"):
            with owning(folder):
                pass
    finally:
        alive.kill()
        alive.wait()


def wait_for_the_worker(snakemake: subprocess.Popen, log: Path, within_s: float = 300) -> None:
    deadline = time.monotonic() + within_s
    while "Starting training" not in (log.read_text() if log.exists() else ""):
        assert snakemake.poll() is None, "snakemake ended before the stage trained"
        assert time.monotonic() < deadline, "the stage never started training"
        time.sleep(0.2)


def test_snakemake_killed_leaves_no_stage_process_and_nothing_published(tmp_path):
    data = write_demo_dataset(tmp_path / "data", DemoSpec(TARGET_CLASSES, 16, 8))
    assert Path(data) == tmp_path / "data" / "data.yaml"
    (tmp_path / "cache.json").write_text(json.dumps({"mode": "none"}))
    (tmp_path / "dataset_report.json").write_text(json.dumps({"splits": {}}))  # no box figure: the stage's img
    config = {
        "stage_defaults": SPEC,
        "stages": {"s": {}},
        "device": "cpu",
        "model": {"cfg": "yolov5n.yaml"},
        "telemetry": {"interval_s": 1.0},
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    (tmp_path / "Snakefile").write_text(SNAKEFILE)
    argv = [
        SNAKEMAKE,
        "-s",
        str(tmp_path / "Snakefile"),
        "-d",
        str(tmp_path),
        "--configfile",
        str(tmp_path / "config.yaml"),
        "--cores",
        "1",
        "results/r/stages/s/timing.json",
    ]
    env = {**os.environ, FaultInjection.ENV: "sleep@0.5"}  # every batch sleeps: the stage is mid-epoch when killed
    snakemake = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    left: list[psutil.Process] = []
    try:
        wait_for_the_worker(snakemake, tmp_path / "results" / "r" / "logs" / "s.log")
        left = psutil.Process(snakemake.pid).children(recursive=True)
        assert any("stagedyolo.engine.worker" in " ".join(p.cmdline()) for p in left)
        snakemake.kill()
        snakemake.wait()
        gone, alive = psutil.wait_procs(left, timeout=10)  # the supervisor's watch polls each second, grace 5 s
        assert alive == [], f"still running: {[p.pid for p in alive]}"
        assert not (tmp_path / "results" / "r" / "stages" / "s" / "timing.json").exists()
    finally:
        snakemake.kill()
        for process in left:
            try:
                process.kill()
            except psutil.NoSuchProcess:
                pass
