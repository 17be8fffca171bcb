"""The real engine on tiny data: yolov5 options reach opt.yaml, patience ignores skipped validations, a time budget
ends a stage at an epoch boundary and the next stage starts from it, and progress reaches the console and `status`."""

import json
import threading
import time

import pandas as pd
import torch
import yaml
from stage_specs import small_stage_spec

from stagedyolo.demo import TARGET_CLASSES, DemoSpec, write_demo_dataset
from stagedyolo.engine.hooks import FaultInjection
from stagedyolo.stage import run_stage
from stagedyolo.stage_plan import build_plan
from stagedyolo.status import run_status

SPEC = small_stage_spec(epochs=3)


def run(tmp_path, spec, stage, run_stages, weights=None):
    """One stage in the run folder layout (R/work, R/stages, R/logs) that `stagedyolo status` reads."""
    data = tmp_path / "data" / "data.yaml"
    if not data.exists():
        write_demo_dataset(tmp_path / "data", DemoSpec(TARGET_CLASSES, 16, 8))
    runs = tmp_path / "R"
    (runs / "logs").mkdir(parents=True, exist_ok=True)
    plan = build_plan(
        {**SPEC, **spec},
        stage=stage,
        data=data,
        weights=weights,
        cfg="yolov5n.yaml",
        cache_mode="none",
        threads=1,
        work_dir=runs / "work" / stage,
        run_stages=run_stages,
    )
    run_stage(
        plan,
        stage_dir=runs / "stages" / stage,
        attempt=1,
        log_path=runs / "logs" / f"{stage}.log",
        engine_home=tmp_path / "engine",
    )
    return runs / "stages" / stage


def read_results(stage_dir):
    frame = pd.read_csv(stage_dir / "results.csv", skipinitialspace=True)
    frame.columns = [c.strip() for c in frame.columns]
    return frame


def test_options_reach_opt_yaml_patience_skips_unvalidated_epochs_and_status_shows_the_running_stage(
    tmp_path, monkeypatch
):
    # yolov5's own EarlyStopping with patience 1 would stop after epoch 1, which val_period 3 skips.
    spec = {"val_period": 3, "patience": 1, "cos_lr": True, "label_smoothing": 0.1, "save_period": 2, "seed": 3}
    monkeypatch.setenv(FaultInjection.ENV, "sleep@0.5")  # two batches an epoch: >= 1 s per epoch to look at
    stages = [{"stage": "s", "epochs": 3, "img": 64}]
    worker = threading.Thread(target=run, args=(tmp_path, spec, "s", stages))
    worker.start()
    seen, deadline = [], time.time() + 300
    while worker.is_alive() and time.time() < deadline:
        if (tmp_path / "R").is_dir():
            seen.append(run_status(tmp_path / "R"))
        time.sleep(0.2)
    worker.join()

    running = [text for text in seen if "running   [s] epoch" in text]
    assert running, seen[-3:]
    assert "img/s" in running[0] and "stage ETA" in running[0] and "run ETA" in running[0]
    stage_dir = tmp_path / "R" / "stages" / "s"
    assert len(read_results(stage_dir)) == 3  # not stopped on the skipped epochs 0 and 1
    opt = yaml.safe_load((stage_dir / "opt.yaml").read_text())
    assert {k: opt[k] for k in spec if k != "val_period"} == {k: v for k, v in spec.items() if k != "val_period"}
    assert sorted(p.name for p in (stage_dir / "weights").glob("epoch*.pt")) == ["epoch0.pt", "epoch2.pt"]
    assert json.loads((stage_dir / "stage.json").read_text())["stopped_by"] is None
    assert "done      3/3 epochs" in run_status(tmp_path / "R")


def test_a_time_budget_ends_the_stage_at_an_epoch_boundary_and_the_next_stage_starts_from_it(tmp_path, capsys):
    stages = [{"stage": "a", "epochs": 4, "img": 64}, {"stage": "b", "epochs": 1, "img": 64}]
    # 0.06 s: spent before the first epoch ends, so epoch 0 is the last. nosave and val_period 2 would otherwise
    # leave epoch 0 unsaved and unvalidated; an epoch the budget ends is both.
    first = run(tmp_path, {"epochs": 4, "time_budget_min": 0.001, "nosave": True, "val_period": 2}, "a", stages)
    results = read_results(first)
    assert list(results["epoch"]) == [0] and results["metrics/mAP_0.5"].notna().all()
    record = json.loads((first / "stage.json").read_text())
    assert record["stopped_by"] == "time_budget" and record["validated_epochs"] == [0]
    timing = json.loads((first / "timing.json").read_text())
    assert timing["stopped_by"] == "time_budget" and timing["finished"] and timing["epochs_completed"] == 1
    assert "ended early: its time budget" in (first / "timing.md").read_text()
    checkpoint = torch.load(first / "weights" / "last.pt", map_location="cpu", weights_only=False)
    assert checkpoint["model"] is not None and checkpoint["optimizer"] is None  # stripped: a normal ending

    second = run(tmp_path, {"epochs": 1}, "b", stages, weights=first / "weights" / "last.pt")
    assert "Transferred" in (tmp_path / "R" / "logs" / "b.log").read_text()  # started from a's weights
    assert len(read_results(second)) == 1

    console = capsys.readouterr().err
    assert "[a] epoch 1/4" in console and "(ending: time_budget)" in console and "[b] epoch 1/1" in console
    status = run_status(tmp_path / "R")
    assert "a  done      1/4 epochs" in status and "ended by time_budget" in status
    assert "b  done      1/1 epochs" in status
