"""Crash-safety of one stage, with the real engine on a tiny dataset: NaN stop, OOM retry, no blind retries,
and atomic checkpoints."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import psutil
import pytest
import torch
from stage_specs import small_stage_spec

from stagedyolo.demo import TARGET_CLASSES, DemoSpec, write_demo_dataset
from stagedyolo.engine.hooks import FaultInjection, NonFiniteLoss, NonFiniteLossGuard
from stagedyolo.stage import StageFailed, run_stage
from stagedyolo.stage_plan import build_plan

SPEC = small_stage_spec(epochs=2)


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
    return write_demo_dataset(tmp_path_factory.mktemp("data"), DemoSpec(TARGET_CLASSES, 16, 8))


def run(tmp_path, data, attempt, **spec):
    plan = build_plan(
        {**SPEC, **spec},
        stage="s",
        data=data,
        weights=None,
        cfg="yolov5n.yaml",
        cache_mode="none",
        threads=1,
        work_dir=tmp_path / "work" / "s",
    )
    return run_stage(
        plan,
        stage_dir=tmp_path / "stages" / "s",
        attempt=attempt,
        log_path=tmp_path / "s.log",
        engine_home=tmp_path / "engine",
    )


def test_a_nan_loss_stops_the_stage_within_a_few_iterations(tmp_path, tiny_data, monkeypatch):
    monkeypatch.setenv(FaultInjection.ENV, "nan@2")
    with pytest.raises(StageFailed, match="nonfinite") as failure:
        run(tmp_path, tiny_data, attempt=1, epochs=5)
    log = (tmp_path / "s.log").read_text()
    assert "became nan at iteration 3" in log  # poisoned after iteration 2: the very next loss is NaN
    assert "stages.s.lr0: 0.0002" in str(failure.value) + log and "stages.s.amp: false" in log
    assert not (tmp_path / "stages" / "s" / "timing.json").exists()


def test_an_out_of_memory_failure_is_retried_at_half_the_batch(tmp_path, tiny_data, monkeypatch):
    monkeypatch.setenv(FaultInjection.ENV, "oom@attempt1")
    with pytest.raises(StageFailed, match="out of memory"):
        run(tmp_path, tiny_data, attempt=1)
    run(tmp_path, tiny_data, attempt=2)  # what Snakemake's retry does
    timing = json.loads((tmp_path / "stages" / "s" / "timing.json").read_text())
    assert [(a["attempt"], a["batch"], a["status"]) for a in timing["attempts"]] == [(1, 8, "oom"), (2, 4, "ok")]
    assert timing["config"]["batch"] == 4
    findings = json.loads((tmp_path / "stages" / "s" / "diagnosis.json").read_text())["findings"]
    assert findings[0]["code"] == "batch_reduced_after_oom" and findings[0]["change"] == "stages.s.batch: 4"


def test_a_nan_in_the_last_batches_of_an_epoch_is_caught_at_its_end_when_the_guard_checks_every_tenth():
    """Fast mode on CUDA checks batches 0, 10, 20...: a NaN in the final epoch's last 9 batches has no next epoch
    to show up in, so the epoch's last batch is checked too, before yolov5 validates and saves the epoch."""
    callbacks = type("Callbacks", (), {"stop_training": False})()
    guard = NonFiniteLossGuard("finetune", lr0=0.002, every=10)
    guard.callbacks = callbacks
    for ni in range(15):  # the running mean loss turns NaN at batch 12 and stays NaN
        guard.on_train_batch_end(None, ni, None, None, None, [torch.tensor(float("nan") if ni >= 12 else 0.1)] * 3)
    assert not callbacks.stop_training and guard.message is None  # batches 0 and 10 were finite
    with pytest.raises(NonFiniteLoss, match="became nan at iteration 14 \\(epoch 0\\)"):
        guard.on_train_epoch_end(epoch=0)
    assert "stages.finetune.lr0: 0.0002" in guard.message


def test_a_last_pt_with_non_finite_weights_is_never_published(tmp_path, tiny_data, monkeypatch):
    monkeypatch.setenv(FaultInjection.ENV, "nan_weights@final")  # the loss stays finite: only the weights say it
    with pytest.raises(StageFailed, match="nonfinite.*last.pt holds non-finite weights"):
        run(tmp_path, tiny_data, attempt=1, epochs=1)
    assert not (tmp_path / "stages" / "s" / "timing.json").exists()
    assert not (tmp_path / "stages" / "s" / "weights" / "last.pt").exists()


@pytest.mark.exclusive  # "at once" is timed
def test_other_failures_are_not_retried(tmp_path, tiny_data):
    missing = tmp_path / "nowhere" / "data.yaml"
    with pytest.raises(StageFailed):
        run(tmp_path, missing, attempt=1)
    started = time.time()
    with pytest.raises(StageFailed, match="not retrying"):
        run(tmp_path, missing, attempt=2)
    assert time.time() - started < 5  # refused at once, no engine start


@pytest.fixture
def killed_after_training(tmp_path, tiny_data, monkeypatch):
    """A real stage SIGKILLed once its training ended, i.e. after yolov5 stripped last.pt (epoch -1)."""
    monkeypatch.setenv(FaultInjection.ENV, "stall@train_end")
    log, failures = tmp_path / "s.log", []
    stage = threading.Thread(target=lambda: failures.append(_raised(run, tmp_path, tiny_data, attempt=1)))
    stage.start()
    deadline = time.time() + 600
    while "stalling after training" not in (log.read_text() if log.exists() else ""):
        assert stage.is_alive() and time.time() < deadline, "the stage never reached the end of its training"
        time.sleep(0.2)
    worker = next(p for p in psutil.Process().children() if "stagedyolo.engine.worker" in " ".join(p.cmdline()))
    os.killpg(worker.pid, signal.SIGKILL)
    stage.join(60)
    assert isinstance(failures[0], StageFailed)
    monkeypatch.delenv(FaultInjection.ENV)
    last = tmp_path / "work" / "s" / "weights" / "last.pt"
    assert torch.load(last, weights_only=False)["epoch"] == -1  # what made every resume fail before
    return tmp_path


def _raised(function, *args, **kwargs):
    try:
        function(*args, **kwargs)
    except BaseException as error:
        return error
    return None


def test_a_stage_killed_after_its_last_epoch_is_published_without_training_again(killed_after_training, tiny_data):
    tmp_path = killed_after_training
    run(tmp_path, tiny_data, attempt=1)  # a rerun after the kill, as `snakemake` would start it
    log = (tmp_path / "s.log").read_text()
    assert "is a finished run" in log and log.count("Starting training") == 1
    published = tmp_path / "stages" / "s"
    assert [line.split(",")[0].strip() for line in (published / "results.csv").read_text().splitlines()[1:]] == [
        "0",
        "1",
    ]
    assert torch.load(published / "weights" / "last.pt", weights_only=False)["epoch"] == -1
    attempts = json.loads((published / "stage.json").read_text())["attempts"]
    assert [a["status"] for a in attempts] == ["error", "ok"] and "finished checkpoint" in attempts[-1]["message"]


def test_a_checkpoint_that_does_not_load_is_wiped_and_the_stage_trains_again(killed_after_training, tiny_data):
    tmp_path = killed_after_training
    last = tmp_path / "work" / "s" / "weights" / "last.pt"
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])  # torn, as a full disk or a bad copy leaves it
    run(tmp_path, tiny_data, attempt=1)
    log = (tmp_path / "s.log").read_text()
    assert "does not load" in log and log.count("Starting training") == 2
    assert (tmp_path / "stages" / "s" / "timing.json").is_file()


def test_a_kill_during_checkpoint_writing_leaves_the_previous_checkpoint(tmp_path):
    target = tmp_path / "last.pt"
    writer = textwrap.dedent(f"""
        import time, torch
        from stagedyolo.engine import compat
        compat.atomic_torch_save()
        torch.save({{"epoch": 1, "w": torch.ones(3)}}, {str(target)!r})
        class SlowToPickle:
            def __reduce__(self):
                print("writing", flush=True)
                time.sleep(60)  # the kill lands while the new checkpoint is half written
                return (dict, ())
        torch.save({{"epoch": 2, "big": torch.zeros(1_000_000), "slow": SlowToPickle()}}, {str(target)!r})
    """)
    proc = subprocess.Popen([sys.executable, "-c", writer], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "writing"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert torch.load(target, weights_only=False)["epoch"] == 1
