"""Crash safety end to end: SIGKILL Snakemake mid-`finetune` (its stage processes end with it), rerun with another
core count, and the stage resumes; a kill after the last epoch still finishes the run."""

import json
import os
import signal
import subprocess
import time

import psutil
import pytest
from snakemake_runner import REPO, SNAKEMAKE, make_workdir, snakemake

pytestmark = pytest.mark.e2e


def kill_tree(pid: int) -> None:
    parent = psutil.Process(pid)
    procs = [parent, *parent.children(recursive=True)]
    for proc in procs:
        try:
            proc.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=30)


def wait_for_checkpoint(work, process, timeout=600) -> None:
    """Until the stage has finished an epoch and saved it (yolov5 writes results.csv before last.pt)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if (work / "weights" / "last.pt").exists():
            return
        assert process.poll() is None, "snakemake ended before finetune saved an epoch"
        time.sleep(0.2)
    raise AssertionError("finetune never saved an epoch")


def test_a_killed_stage_resumes_from_its_last_epoch(tmp_path):
    workdir = make_workdir(tmp_path, REPO / "tests" / "configs" / "tiny.yaml")
    (workdir / "resume.yaml").write_text(
        "stages:\n  finetune:\n    epochs: 4\nprobe:\n  enabled: false\nexport:\n  enabled: false\n"
    )  # the tiny pipeline test checks the export
    configs = [workdir / "tiny.yaml", workdir / "resume.yaml"]
    run = workdir / "results" / "tiny"
    argv = [
        SNAKEMAKE,
        "-s",
        str(REPO / "Snakefile"),
        "-d",
        str(workdir),
        "--cores",
        "2",
        "--configfile",
        *map(str, configs),
    ]
    # Each batch sleeps a little, so an epoch lasts long enough to kill the tree between two epochs.
    env = {**os.environ, "STAGEDYOLO_TEST_FAULT": "sleep@0.3"}
    process = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_checkpoint(run / "work" / "finetune", process)
        stage_processes = psutil.Process(process.pid).children(recursive=True)
        process.send_signal(signal.SIGKILL)  # Snakemake alone: its jobs must not train on without it
        process.wait()
        _, alive = psutil.wait_procs(stage_processes, timeout=15)
        assert not alive, f"still running 15 s after Snakemake was killed: {[p.cmdline() for p in alive]}"
    finally:
        if process.poll() is None:  # the test failed before the kill: leave nothing running
            kill_tree(process.pid)
    finished = {s: (run / "stages" / s / "timing.json").stat().st_mtime_ns for s in ("smoke", "frozen")}

    snakemake(workdir, "--unlock", configfiles=configs)  # a SIGKILLed Snakemake leaves its lock behind
    rerun = snakemake(workdir, "--cores", "1", configfiles=configs)  # another core count: the stage still resumes

    assert "stage=smoke" not in rerun.stdout + rerun.stderr and "stage=frozen" not in rerun.stdout + rerun.stderr
    assert {s: (run / "stages" / s / "timing.json").stat().st_mtime_ns for s in finished} == finished
    log = (run / "logs" / "stages" / "finetune.log").read_text()
    assert "resuming" in log and "Resuming training from" in log
    epochs = [
        int(line.split(",")[0]) for line in (run / "stages" / "finetune" / "results.csv").read_text().splitlines()[1:]
    ]
    assert epochs == [0, 1, 2, 3]  # continued, not restarted (a restart would not say "Resuming")
    # The resumed epochs keep the stage's LR line: epoch e at lr * lf(e), from the LR frozen handed over.
    plan = json.loads((run / "stages" / "finetune" / "stage.json").read_text())
    start, lrf = plan["continuation"]["lr0"], plan["hyp"]["lrf"]
    rows = (run / "stages" / "finetune" / "results.csv").read_text().splitlines()[1:]
    logged = [float(line.split(",")[11]) for line in rows]  # x/lr0
    assert logged == pytest.approx([start * ((1 - e / 4) * (1 - lrf) + lrf) for e in range(4)], rel=1e-4)
    attempts = json.loads((run / "stages" / "finetune" / "stage.json").read_text())["attempts"]
    assert attempts[-1]["resumed_from"] and attempts[-1]["status"] == "ok"
    assert (run / "report" / "summary.md").is_file()


def test_a_kill_after_the_last_epoch_still_finishes_the_run(tmp_path):
    """yolov5 strips last.pt (epoch -1) once training ends: a kill from then on used to make every rerun fail with
    "training ... is finished, nothing to resume"."""
    workdir = make_workdir(tmp_path, REPO / "tests" / "configs" / "tiny.yaml")
    (workdir / "stall.yaml").write_text("probe:\n  enabled: false\n")
    configs = [workdir / "tiny.yaml", workdir / "stall.yaml"]
    run = workdir / "results" / "tiny"
    target = "results/tiny/stages/smoke/timing.json"
    # What smoke needs first, without the fault: demo_pretrain trains through yolov5 too.
    snakemake(workdir, "results/tiny/demo/pretrained.pt", "results/tiny/data/cache.json", configfiles=configs)
    argv = [
        SNAKEMAKE,
        "-s",
        str(REPO / "Snakefile"),
        "-d",
        str(workdir),
        "--cores",
        "2",
        "--configfile",
        *map(str, configs),
        "--",
        target,
    ]
    env = {**os.environ, "STAGEDYOLO_TEST_FAULT": "stall@train_end"}
    process = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    log = run / "logs" / "stages" / "smoke.log"
    try:
        deadline = time.time() + 600
        while "stalling after training" not in (log.read_text() if log.exists() else ""):
            assert process.poll() is None and time.time() < deadline, "smoke never reached the end of its training"
            time.sleep(0.2)
    finally:
        kill_tree(process.pid)

    snakemake(workdir, "--unlock", configfiles=configs)
    snakemake(workdir, target, configfiles=configs)

    text = log.read_text()
    assert "is a finished run" in text and "Resuming training from" not in text
    attempts = json.loads((run / "stages" / "smoke" / "stage.json").read_text())["attempts"]
    assert attempts[-1]["status"] == "ok" and "finished checkpoint" in attempts[-1]["message"]
