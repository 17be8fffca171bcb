"""`stagedyolo status` on a stage nothing runs any more (a killed Snakemake leaves no outcome.json), on one a real
worker process runs, and on runs under a configured results_dir."""

import json
import os
import subprocess
import sys
import time

import pytest

from stagedyolo.cli import main
from stagedyolo.status import HEARTBEAT_S, run_status

PROGRESS = {
    "stage": "s",
    "epoch": 2,
    "epochs": 5,
    "images_per_s": 40.0,
    "map50": 0.5,
    "stage_eta_s": 30,
    "run_eta_s": 60,
}


def started_stage(run, age_s: float):
    """A stage's work folder as a worker leaves it mid-training, last written `age_s` ago."""
    work = run / "work" / "s"
    work.mkdir(parents=True)
    (work / "plan.json").write_text(json.dumps({"run_stages": [{"stage": "s", "epochs": 5, "img": 64}]}))
    (work / "progress.json").write_text(json.dumps({**PROGRESS, "updated": time.time() - age_s}))
    (work / "telemetry.csv").write_text("unix_s\n")
    for path in work.iterdir():
        os.utime(path, (time.time() - age_s, time.time() - age_s))
    return work


def test_a_stage_nothing_runs_any_more_is_stopped_not_running(tmp_path):
    started_stage(tmp_path / "R", age_s=3600)
    status = run_status(tmp_path / "R")
    assert "s  stopped   no process runs it" in status and "running" not in status
    assert "[s] epoch 2/5" in status and "run snakemake again" in status


def test_a_stage_written_to_recently_is_running_even_without_a_local_worker(tmp_path):
    started_stage(tmp_path / "R", age_s=HEARTBEAT_S / 4)  # e.g. on another machine of a shared folder
    assert "s  running   [s] epoch 2/5" in run_status(tmp_path / "R")


def test_a_stage_whose_worker_process_lives_is_running_until_the_process_ends(tmp_path):
    started_stage(tmp_path / "R", age_s=3600)  # a long epoch: nothing written for an hour
    # The worker's argv as the stage launches it, with the plan path relative to the worker's working directory.
    worker = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)", "-m", "stagedyolo.engine.worker", "R/work/s/plan.json"],
        cwd=tmp_path,
    )
    try:
        assert "s  running   [s] epoch 2/5" in run_status(tmp_path / "R")
    finally:
        worker.kill()
        worker.wait()
    assert "s  stopped" in run_status(tmp_path / "R")


@pytest.fixture
def configured_run(tmp_path, monkeypatch):
    """A run under results_dir `out`, named in config/config.yaml, in the working directory."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "config.yaml").write_text("run: demo\nresults_dir: out\n")
    started_stage(tmp_path / "out" / "demo", age_s=3600)
    return tmp_path


@pytest.mark.parametrize(
    "argv", [["status"], ["status", "demo"], ["status", "--config", "config/config.yaml"], ["status", "out/demo"]]
)
def test_status_finds_runs_under_the_configured_results_dir(configured_run, capsys, argv):
    assert main(argv) == 0
    assert capsys.readouterr().out.startswith("run out/demo\n")


def test_status_reads_results_dir_from_the_config_given(configured_run, capsys):
    (configured_run / "other.yaml").write_text("results_dir: elsewhere\n")
    assert main(["status", "--config", "other.yaml"]) == 2
    assert "no run folder at elsewhere/<run>" in capsys.readouterr().err
    (configured_run / "bad.yaml").write_text("- a list\n")
    assert main(["status", "--config", "bad.yaml"]) == 2
    assert "not a YAML mapping" in capsys.readouterr().err
