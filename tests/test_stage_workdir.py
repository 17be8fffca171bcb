"""The stage supervisor's work folder: resume only an interrupted run of the same plan, wipe anything stale,
and halve the batch once per out-of-memory failure."""

import json
import os

import torch

from stagedyolo.stage import _prepare_work_dir, retry_batch

PLAN = {"stage": "finetune", "epochs": 6, "batch": 16, "hyp": {"lr0": 0.0005}, "attempt": 1, "torch_threads": 1}


def leave_interrupted_run(work, plan):
    (work / "weights").mkdir(parents=True)
    torch.save({"epoch": 2}, work / "weights" / "last.pt")  # a mid-run checkpoint (the engine's: test_faults.py)
    (work / "plan.json").write_text(json.dumps(plan))
    (work / "results.csv").write_text("epoch\n0\n")


def prepare(work, plan):
    with open(work.parent / "stage.log", "a") as log:
        return _prepare_work_dir(work, plan, dict(os.environ), log)


def test_an_interrupted_run_of_the_same_plan_is_resumed(tmp_path):
    work = tmp_path / "work"
    leave_interrupted_run(work, PLAN)
    # A new try may differ in what does not change the training (attempt number, thread count).
    assert prepare(work, {**PLAN, "attempt": 2, "torch_threads": 2}) == (str(work / "weights" / "last.pt"), False)
    assert (work / "results.csv").exists()


def test_a_stale_run_folder_from_another_plan_is_wiped(tmp_path):
    work = tmp_path / "work"
    leave_interrupted_run(work, {**PLAN, "epochs": 3})
    (work / "events.out.tfevents.1").write_text("old")
    assert prepare(work, PLAN) == (None, False)
    assert work.is_dir() and not any(work.iterdir())  # no old results.csv for yolov5 to append to


def test_a_changed_batch_starts_over_but_keeps_the_attempt_history(tmp_path):
    from stagedyolo.stage import _digest

    work = tmp_path / "work"
    leave_interrupted_run(work, PLAN)
    history = {"digest": _digest(PLAN), "attempts": [{"attempt": 1, "batch": 16, "status": "oom"}]}
    (work / "attempts.json").write_text(json.dumps(history))
    assert prepare(work, {**PLAN, "batch": 8}) == (None, False)
    assert json.loads((work / "attempts.json").read_text()) == history


def test_each_out_of_memory_failure_halves_the_batch_down_to_a_floor():
    oom, error = {"status": "oom"}, {"status": "error"}
    assert retry_batch(16, []) == 16
    assert retry_batch(16, [oom]) == 8
    assert retry_batch(16, [oom, oom]) == 4
    assert retry_batch(16, [error]) == 16
    assert retry_batch(3, [oom, oom, oom]) == 2
