"""Stage specs for the tests, resolved as the pipeline resolves them (stagedyolo.recipe.stage_spec) rather than
written out key by key: a test names only what it changes from a small CPU stage."""

from __future__ import annotations

from stagedyolo.recipe import stage_spec
from stagedyolo.stage_plan import StagePlan, build_plan

# One epoch at 64 px on the CPU, no loader workers, no cache, yolov5's hyp and step constants (no stage_defaults).
SMALL_CPU_STAGE = {
    "epochs": 1,
    "img": 64,
    "batch": 8,
    "workers": 0,
    "freeze": 0,
    "lr0": 0.002,
    "optimizer": "AdamW",
    "hyp": {},
    "cache": "none",
    "amp": "auto",
    "device": "cpu",
    "val_period": 1,
    "gpus": 1,
    "sync_bn": False,
    "plots": False,
    "nosave": False,
    "lr_scaling": "none",
}


def small_stage_spec(**changes) -> dict:
    """SMALL_CPU_STAGE with ``changes``, as recipe.stage_spec resolves a one-stage config."""
    config = {"stages": {"stage": {**SMALL_CPU_STAGE, **changes}}, "stage_defaults": {}, "device": "cpu"}
    return stage_spec(config, "stage")


def small_stage_plan(spec: dict, tmp_path, **settings) -> StagePlan:
    """build_plan for a test stage "s" from a model yaml, no cache, one thread, its folders under ``tmp_path``;
    ``settings`` replace any of those."""
    defaults = dict(
        stage="s",
        data=tmp_path / "d.yaml",
        weights=None,
        cfg="yolov5n.yaml",
        cache_mode="none",
        threads=1,
        work_dir=tmp_path / "w",
    )
    return build_plan(spec, **{**defaults, **settings})
