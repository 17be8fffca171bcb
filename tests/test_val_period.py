"""val_period with the real engine: validation exactly on epochs N, 2N, ... and the final one; best.pt only
from those."""

import json

import pandas as pd
import pytest
from stage_specs import small_stage_plan, small_stage_spec

from stagedyolo.demo import TARGET_CLASSES, DemoSpec, write_demo_dataset
from stagedyolo.stage import run_stage

SPEC = small_stage_spec(epochs=7, val_period=3)


def test_val_period_validates_every_n_epochs_and_the_final_one(tmp_path):
    data = write_demo_dataset(tmp_path / "data", DemoSpec(TARGET_CLASSES, 16, 8))
    plan = small_stage_plan(SPEC, tmp_path, data=data, work_dir=tmp_path / "work" / "s")
    run_stage(plan, stage_dir=tmp_path / "s", attempt=1, log_path=tmp_path / "s.log", engine_home=tmp_path / "e")

    results = pd.read_csv(tmp_path / "s" / "results.csv", skipinitialspace=True)
    results.columns = [c.strip() for c in results.columns]
    validated = [int(e) + 1 for e, m in zip(results["epoch"], results["metrics/mAP_0.5"]) if pd.notna(m)]
    assert validated == [3, 6, 7]  # 1-based: every 3rd epoch, and the final one
    assert results["train/box_loss"].notna().all()  # every epoch trained

    record = json.loads((tmp_path / "s" / "stage.json").read_text())
    assert [e + 1 for e in record["validated_epochs"]] == [3, 6, 7]
    assert record["best_saved_epochs"] and set(record["best_saved_epochs"]) <= set(record["validated_epochs"])
    timing = json.loads((tmp_path / "s" / "timing.json").read_text())
    assert [e["epoch"] + 1 for e in timing["epochs"] if e["validated"]] == [3, 6, 7]


@pytest.mark.parametrize(("workers", "expected"), [(3, 3), ("auto", 0)])
def test_explicit_workers_override_the_probe(tmp_path, workers, expected):
    plan = small_stage_plan(
        {**SPEC, "workers": workers, "batch": "auto"}, tmp_path, threads=2, probe_choice={"workers": 0, "batch": 32}
    )
    assert plan["workers"] == expected
    assert plan["batch"] == 32  # batch: auto takes the probe's


@pytest.mark.parametrize(
    ("scaling", "batch", "lr0"), [("none", 128, 0.002), ("linear", 128, 0.004), ("linear", 16, 0.002)]
)
def test_lr_scaling_linear_reaches_the_hyp_file_and_none_leaves_lr0_alone(tmp_path, scaling, batch, lr0):
    plan = small_stage_plan({**SPEC, "lr_scaling": scaling, "batch": batch}, tmp_path)
    assert plan["hyp"]["lr0"] == pytest.approx(lr0)  # linear: 128 / 64 = 2x; at 16 accumulation already equalises
    assert plan["hyp"]["warmup_bias_lr"] <= plan["hyp"]["lr0"]
