"""nominal_batch and min_warmup_iters: the two train.py constants the adapter makes settable reach the real engine."""

import json

import pandas as pd
import pytest
from stage_specs import small_stage_spec

from stagedyolo.demo import TARGET_CLASSES, DemoSpec, write_demo_dataset
from stagedyolo.engine.patches import NOMINAL_BATCH_EDIT, WARMUP_FLOOR_EDIT, EngineContext
from stagedyolo.engine.train_module import patched_source
from stagedyolo.stage import run_stage
from stagedyolo.stage_plan import build_plan

SPEC = small_stage_spec(epochs=2, batch=4, hyp={"warmup_epochs": 0.5}, val_period=2, nosave=True)


def test_a_train_py_without_the_expected_lines_fails_loudly():
    ctx = EngineContext({"nominal_batch": 64, "min_warmup_iters": 100}, "cpu", False, None)
    WARMUP_FLOOR_EDIT(ctx)
    NOMINAL_BATCH_EDIT(ctx)
    with pytest.raises(RuntimeError, match=r"nbs = 64.*yolov5==7\.0\.14"):
        patched_source("def train():\n    nw = max(round(hyp['warmup_epochs'] * nb), 100)\n", ctx.source_edits)


@pytest.mark.parametrize(
    ("nominal_batch", "min_warmup_iters", "decay", "weights_lr"),
    [
        # nominal 6 at batch 4: accumulate round(6/4) = 2, weight decay 0.0005 * 4 * 2 / 6. Warmup is 0.5 epoch x 4
        # iterations = 2, so by iteration 7 (epoch 1's last) the weights run at the schedule's LR. yolov5's own
        # constants: decay stays 0.0005, and the warmup floor of 100 iterations still ramps the LR towards
        # lr0 * lf(epoch 1) = 0.002 * 0.505, and is 7/100 of the way there.
        (6, 0, "0.000666", 0.002),
        (64, 100, "0.0005)", 0.002 * 0.505 * 7 / 100),
    ],
)
def test_nominal_batch_and_warmup_floor_reach_yolov5(tmp_path, nominal_batch, min_warmup_iters, decay, weights_lr):
    data = write_demo_dataset(tmp_path / "data", DemoSpec(TARGET_CLASSES, 16, 8))  # 16 images / batch 4 = 4 its
    spec = {**SPEC, "nominal_batch": nominal_batch, "min_warmup_iters": min_warmup_iters}
    plan = build_plan(
        spec,
        stage="s",
        data=data,
        weights=None,
        cfg="yolov5n.yaml",
        cache_mode="none",
        threads=1,
        work_dir=tmp_path / "work" / "s",
    )
    run_stage(plan, stage_dir=tmp_path / "s", attempt=1, log_path=tmp_path / "s.log", engine_home=tmp_path / "e")

    assert f"weight(decay={decay}" in (tmp_path / "s.log").read_text()
    results = pd.read_csv(tmp_path / "s" / "results.csv", skipinitialspace=True)
    results.columns = [c.strip() for c in results.columns]
    # yolov5 logs the LR its epoch ran at; epoch 1 runs at lr0 * lf(0) = lr0 once warmup is over (x/lr0, the bias
    # group, warms up from warmup_bias_lr, capped at lr0, so it is lr0 either way).
    last = results.iloc[-1]
    assert last["x/lr1"] == pytest.approx(weights_lr, rel=1e-3)
    assert last["x/lr2"] == pytest.approx(weights_lr, rel=1e-3)

    # A spec without an engine section trains in the default mode, and both records say which rows applied.
    engine = json.loads((tmp_path / "s" / "timing.json").read_text())["engine"]
    assert engine["mode"] == "fast" and {"nominal_batch", "warmup_floor", "foreach_ema", "complete_nms"} <= set(
        engine["patches_applied"]
    )
    assert engine["patches_not_applied"]["channels_last"] == "CUDA only: the stage runs on the CPU"
    record = json.loads((tmp_path / "s" / "stage.json").read_text())
    assert record["engine_mode"] == "fast" and len(record["patches"]) == len(engine["patches_applied"]) + len(
        engine["patches_not_applied"]
    )
