"""The stage supervisor's work folder: resume only an interrupted run of the same plan, wipe anything stale,
and halve the batch once per out-of-memory failure."""

import json
import os
import signal
import time

import pytest
import torch
import yaml
from stage_specs import small_stage_spec

from stagedyolo import stage_plan as plan_module
from stagedyolo.engine import checkpoint
from stagedyolo.stage import StageFailed, _finished_outcome, _prepare_work_dir
from stagedyolo.stage_plan import build_plan, retry_batch

PLAN = {"stage": "finetune", "epochs": 6, "batch": 16, "hyp": {"lr0": 0.0005}, "attempt": 1, "torch_threads": 1}
SPEC = small_stage_spec(epochs=6, optimizer="SGD")
PLAN_SETTINGS = dict(stage="finetune", data="data.yaml", weights=None, cfg="yolov5n.yaml")


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
    from stagedyolo.stage_plan import plan_digest

    work = tmp_path / "work"
    leave_interrupted_run(work, PLAN)
    history = {"digest": plan_digest(PLAN), "attempts": [{"attempt": 1, "batch": 16, "status": "oom"}]}
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


# ----------------------------------------------------------------------- checkpoint readers, runtime keys, wipes


class UnpicklesBy:
    """Unpickles by calling `function(*args)`: a checkpoint whose reading process dies, hangs or runs out of memory
    the way a real one can, while the file itself is fine."""

    def __init__(self, function, *args):
        self.function, self.args = function, args

    def __reduce__(self):
        return self.function, self.args


@pytest.mark.parametrize(
    ("fault", "said"),
    [
        (UnpicklesBy(signal.raise_signal, signal.SIGKILL), "killed by signal 9"),  # as the kernel's OOM killer does
        (UnpicklesBy(bytearray, 1 << 62), "exited 1"),  # MemoryError: the machine's, not the file's
        (UnpicklesBy(time.sleep, 600), "ran past 8 s"),
    ],
)
def test_a_checkpoint_reader_without_an_answer_fails_the_job_and_keeps_the_folder(tmp_path, monkeypatch, fault, said):
    monkeypatch.setattr(checkpoint, "READ_TIMEOUT_S", 8)
    work = tmp_path / "work"
    leave_interrupted_run(work, PLAN)
    torch.save({"epoch": 2, "reader_fault": fault}, work / "weights" / "last.pt")
    before = snapshot(work)
    with pytest.raises(StageFailed, match=f"gave no answer.*{said}.*is kept"):
        prepare(work, PLAN)
    assert snapshot(work) == before


def snapshot(folder):
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


def test_a_restart_with_other_cores_resumes_with_this_machines_workers(tmp_path, monkeypatch):
    """workers: auto and torch threads follow the job's cores (--cores, the node): they are not the plan's identity,
    and the resumed run loads with this machine's workers (yolov5 reloads them from opt.yaml)."""
    monkeypatch.setattr(plan_module, "available_cores", lambda: 16)
    work = tmp_path / "work"
    spec = {**SPEC, "workers": "auto", "cache": "auto"}
    killed = build_plan(spec, threads=16, cache_mode="ram", image_store="/copy/store", **PLAN_SETTINGS, work_dir=work)
    leave_interrupted_run(work, killed)
    (work / "opt.yaml").write_text(yaml.safe_dump({"epochs": 6, "workers": killed["workers"], "cache": "ram"}))
    again = build_plan(spec, threads=3, cache_mode="disk", **PLAN_SETTINGS, work_dir=work)
    assert (again["workers"], again["torch_threads"]) != (killed["workers"], killed["torch_threads"])
    assert prepare(work, again) == (str(work / "weights" / "last.pt"), False)
    assert yaml.safe_load((work / "opt.yaml").read_text()) == {
        "epochs": 6,
        "workers": again["workers"],
        "cache": "disk",
    }


def test_a_resumed_run_names_no_gpu_ids_to_yolov5(tmp_path):
    """yolov5's select_device would write the stage's device "1" into CUDA_VISIBLE_DEVICES: a
    run resumed from an opt.yaml that names GPU ids (an older run's) gets '' too, as a new run does."""
    work = tmp_path / "work"
    plan = {**PLAN, "device": "1", "workers": 2, "cache": None}
    leave_interrupted_run(work, plan)
    (work / "opt.yaml").write_text(yaml.safe_dump({"device": "1", "workers": 2, "cache": None}))
    assert prepare(work, plan) == (str(work / "weights" / "last.pt"), False)
    assert yaml.safe_load((work / "opt.yaml").read_text())["device"] == ""


def nan_network():
    network = torch.nn.Linear(2, 2)
    with torch.no_grad():
        network.weight.fill_(float("nan"))
    return network


def torn(work):
    last = work / "weights" / "last.pt"
    last.write_bytes(last.read_bytes()[:20])


def no_plan(work):
    (work / "plan.json").unlink()


def nan_weights(work):
    torch.save({"epoch": 2, "model": nan_network()}, work / "weights" / "last.pt")


def finished_by_a_nan_loss(work):
    """yolov5 strips last.pt after its last epoch; the guard reported a non-finite loss of that epoch."""
    torch.save({"epoch": -1}, work / "weights" / "last.pt")
    (work / "outcome.json").write_text(json.dumps({"status": "nonfinite", "message": "became nan"}))


@pytest.mark.parametrize(
    ("change", "plan", "reason"),
    [
        (None, {**PLAN, "epochs": 3}, "another plan (changed: epochs)"),
        (None, {**PLAN, "batch": 8}, "batch 16, this try has batch 8"),
        (no_plan, PLAN, "no plan.json"),
        (lambda work: (work / "weights" / "last.pt").unlink(), PLAN, "no weights/last.pt"),
        (torn, PLAN, "does not load"),
        (nan_weights, PLAN, "non-finite weights (model.weight"),
        (finished_by_a_nan_loss, PLAN, "stopped on a non-finite loss (became nan)"),
    ],
)
def test_every_wipe_is_logged_with_its_reason(tmp_path, change, plan, reason):
    work = tmp_path / "work"
    leave_interrupted_run(work, PLAN)
    if change:
        change(work)
    assert prepare(work, plan) == (None, False)
    assert not (work / "results.csv").exists()
    assert f"wiping the work folder {work}: " in (tmp_path / "stage.log").read_text()
    assert reason in (tmp_path / "stage.log").read_text()


def test_a_failure_after_the_last_epoch_is_named_when_the_finished_checkpoint_is_published():
    recorded = {"status": "error", "message": "RuntimeError: in val.run", "amp": False, "device": "cpu"}
    outcome = _finished_outcome(recorded)
    assert outcome["status"] == "ok" and outcome["device"] == "cpu"
    assert "failed after its last epoch (error: RuntimeError: in val.run)" in outcome["message"]
    assert "not recorded" in _finished_outcome({})["amp_reason"]


def test_a_retrained_input_checkpoint_changes_the_plans_identity(tmp_path):
    """The previous stage retrained into the same path: an interrupted later stage must not resume on top of it."""
    import os

    from stagedyolo.stage_plan import build_plan, plan_digest

    weights = tmp_path / "continue.pt"
    weights.write_bytes(b"first training")
    spec = small_stage_spec(lr0=0.01, optimizer="SGD")

    def plan():
        return build_plan(
            spec,
            stage="s",
            data=tmp_path / "d.yaml",
            weights=str(weights),
            cfg="yolov5n.yaml",
            cache_mode="none",
            threads=1,
            work_dir=tmp_path / "w",
        )

    before = plan()
    assert plan_digest(plan()) == plan_digest(before)
    weights.write_bytes(b"the retrained one")
    os.utime(weights, ns=(1, 1))
    assert plan_digest(plan()) != plan_digest(before)
