"""yolov5's hyperparameters and train.py options as a stage sets them, and the engine settings of a stage."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import yaml

from stagedyolo.engine.patches import DEFAULT_MODE

# yolov5 train.py options a stage may set under yolov5's own names; they reach its `opt` unchanged. The options
# left out, and why, are listed in the schema's stage description and docs/options.md.
YOLOV5_OPTIONS = (
    "cos_lr",
    "rect",
    "multi_scale",
    "label_smoothing",
    "image_weights",
    "single_cls",
    "noautoanchor",
    "quad",
    "save_period",
    "seed",
    "patience",
)


def yolov5_dir() -> Path:
    """The installed yolov5 package folder, found without importing it (importing costs ~10 s)."""
    spec = importlib.util.find_spec("yolov5")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the yolov5 package is not installed: pip install 'yolov5==7.0.14'")
    return Path(next(iter(spec.submodule_search_locations)))


# The hyp keys that change what the loader does per image (yolov5's augmentations); the others (LR, loss gains,
# warmup) do not change a step's cost.
AUGMENTATION_KEYS = (
    "hsv_h",
    "hsv_s",
    "hsv_v",
    "degrees",
    "translate",
    "scale",
    "shear",
    "perspective",
    "flipud",
    "fliplr",
    "mosaic",
    "mixup",
    "copy_paste",
)


def base_hyp() -> dict:
    with open(yolov5_dir() / "data" / "hyps" / "hyp.scratch-low.yaml") as handle:
        return yaml.safe_load(handle)


def stage_hyp(lr0: float, overrides: dict) -> dict:
    """A complete hyp dict (yolov5 raises KeyError on a partial one) for a stage's LR and overrides.

    yolov5 starts the bias LR of every run at warmup_bias_lr (0.1) and lets it fall to lr0 over the warmup.
    A low-LR stage would then train its biases at up to 0.1: the "low LR" would be a lie. So the warmup bias
    LR never exceeds the stage's lr0, unless the stage sets warmup_bias_lr itself.
    """
    hyp = base_hyp()
    unknown = sorted(set(overrides) - set(hyp))
    if unknown:
        raise ValueError(f"unknown hyp key(s) {unknown}: allowed are the keys of yolov5's hyp.scratch-low.yaml")
    hyp["lr0"] = float(lr0)
    hyp["warmup_bias_lr"] = min(float(hyp["warmup_bias_lr"]), float(lr0))
    hyp.update(overrides)
    return hyp


def yolov5_options(spec: dict) -> dict:
    """The stage's yolov5 options that it (or stage_defaults) sets; the rest keep yolov5's parse_opt defaults."""
    options = {key: spec[key] for key in YOLOV5_OPTIONS if spec.get(key) is not None}
    if options.get("save_period") == 0:
        options["save_period"] = -1  # "off" as yolov5 spells it: its loggers compute epoch % save_period
    return options


def engine_spec(engine: dict, stage_mode: str | None) -> dict:
    """The stage's engine settings: its engine_mode, else the run's engine.mode; compile and skipped patches."""
    return {
        "mode": stage_mode or engine.get("mode", DEFAULT_MODE),
        "compile": bool(engine.get("compile", False)),
        "skip_patches": sorted(engine.get("skip_patches") or []),
    }
