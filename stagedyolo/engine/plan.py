"""A stage spec (config data) resolved into a plan: everything one yolov5 run needs, as plain JSON.

The plan is decided here, once, and written next to the stage's outputs (`stage.json`), so what ran is
on record and Snakemake's params see exactly what changed between runs.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from pathlib import Path

import yaml

from stagedyolo.engine.patches import DEFAULT_MODE

# Keys a stage may set. The schema (workflow/schemas/config.schema.yaml) documents and bounds each one.
STAGE_KEYS = (
    "epochs",
    "img",
    "batch",
    "workers",
    "freeze",
    "lr0",
    "hyp",
    "cache",
    "amp",
    "device",
    "val_period",
    "gpus",
    "sync_bn",
    "lr_scaling",
    "start_from",
    "plots",
    "optimizer",
    "nosave",
    "nominal_batch",
    "min_warmup_iters",
    "engine_mode",
    "tune",
    "time_budget_min",
    "handover_on_stall",
)

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
STAGE_KEYS += YOLOV5_OPTIONS

# Smallest batch the out-of-memory retry halves down to.
MIN_RETRY_BATCH = 2


def yolov5_dir() -> Path:
    """The installed yolov5 package folder, found without importing it (importing costs ~10 s)."""
    spec = importlib.util.find_spec("yolov5")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the yolov5 package is not installed: pip install 'yolov5==7.0.14'")
    return Path(next(iter(spec.submodule_search_locations)))


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


def stage_names(config: dict) -> list[str]:
    return list(config["stages"])


def run_outline(config: dict) -> list[dict]:
    """Every stage in order with its epochs and image size: what a run's ETA is estimated from."""
    return [
        {"stage": name, **{key: stage_spec(config, name)[key] for key in ("epochs", "img")}}
        for name in stage_names(config)
    ]


def previous_stage(config: dict, stage: str) -> str | None:
    names = stage_names(config)
    index = names.index(stage)
    return names[index - 1] if index else None


def stage_spec(config: dict, stage: str) -> dict:
    """The stage's settings: stage_defaults, overridden by what the stage names."""
    if stage not in config["stages"]:
        raise KeyError(f"unknown stage {stage!r}: config 'stages' has {stage_names(config)}")
    spec = {key: config["stage_defaults"].get(key) for key in STAGE_KEYS}
    spec.update(config["stages"][stage] or {})
    spec["hyp"] = {**(config["stage_defaults"].get("hyp") or {}), **((config["stages"][stage] or {}).get("hyp") or {})}
    if spec["device"] is None:
        spec["device"] = config["device"]
    spec["engine"] = engine_spec(config.get("engine") or {}, spec["engine_mode"])
    # start_from: previous continues the previous stage's training (stagedyolo.engine.continuation), at the LR it
    # handed over unless the stage names its own lr0 (a jump it asks for; stage_defaults' lr0 is the first stage's).
    spec["continues"] = spec["start_from"] == "previous" and previous_stage(config, stage) is not None
    spec["lr_from_previous"] = spec["continues"] and "lr0" not in (config["stages"][stage] or {})
    return spec


def engine_spec(engine: dict, stage_mode: str | None) -> dict:
    """The stage's engine settings: its engine_mode, else the run's engine.mode; compile and skipped patches."""
    return {
        "mode": stage_mode or engine.get("mode", DEFAULT_MODE),
        "compile": bool(engine.get("compile", False)),
        "skip_patches": sorted(engine.get("skip_patches") or []),
    }


def image_store_sizes(config: dict) -> list[int]:
    """Image sizes of the stages whose cache may be ram (auto or ram); [] when cache.prebuild_ram is off."""
    if not config["cache"].get("prebuild_ram", True):
        return []
    specs = [stage_spec(config, stage) for stage in stage_names(config)]
    return sorted({spec["img"] for spec in specs if spec["cache"] in ("auto", "ram")})


# The stage keys the probe decides when a stage leaves them at `auto`.
PROBED_KEYS = ("workers", "batch", "amp")


def probe_needed(config: dict) -> bool:
    """Whether the probe rule runs: it is enabled, and some stage leaves workers, batch or amp at `auto`
    (a config that pins all three in every stage would pay the probe's half minute for nothing)."""
    if not config["probe"]["enabled"]:
        return False
    return any(stage_spec(config, stage)[key] == "auto" for stage in config["stages"] for key in PROBED_KEYS)


def probe_batches(config: dict) -> list[int]:
    """The batch sizes (per GPU) the probe times the model at: its candidates when some stage leaves batch at
    `auto`; otherwise only the batches of the stages that take its workers or amp, since no other batch can be
    chosen (on the demo that is one model batch instead of three: seconds saved, nothing a choice depends on lost).
    """
    specs = [stage_spec(config, stage) for stage in config["stages"]]
    if any(spec["batch"] == "auto" for spec in specs):
        return list(config["probe"]["batch"])
    fixed = {
        max(1, int(spec["batch"]) // int(spec["gpus"]))
        for spec in specs
        if spec["workers"] == "auto" or spec["amp"] == "auto"
    }
    return sorted(fixed) or list(config["probe"]["batch"])


# The stage keys a stage's speed depends on: what the probe predicts each stage's images/s from.
SPEED_KEYS = ("img", "freeze", "batch", "workers", "amp", "gpus", "nominal_batch", "lr0", "hyp", "engine")


def probe_stage_specs(config: dict) -> dict:
    """Each stage's speed-relevant settings, for the probe's per-stage predictions (epochs and the like left out,
    so changing them does not rerun the probe)."""
    return {stage: {key: stage_spec(config, stage)[key] for key in SPEED_KEYS} for stage in stage_names(config)}


def planned_epochs(config: dict) -> int:
    """All stages' epochs together: with the training image count, the probe's estimate of the planned training,
    whose share may lengthen its budget. Read by the probe's script from the config, not passed as a rule param, so
    that changing epochs does not rerun the probe (and with it every stage)."""
    return sum(int(stage_spec(config, stage)["epochs"]) for stage in stage_names(config))


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


# probe.workers: auto spreads the loader candidates over the cores a job may use, beside 0 (the main process loads):
# 0, 1, 2 on the 2-core demo machine and 0, 4, 8, 12 on the 16-core H200 box. A fixed [0, 1, 2] there held a 640-px
# mosaic load to 4 workers at most, and the frozen stage waited on them 45 % of its time.
WORKER_CANDIDATE_SHARES = (0.25, 0.5, 0.75)


def worker_candidates(setting: list[int] | str, cores: int) -> list[int]:
    """probe.workers as the loader candidates to measure: the listed counts, or for `auto` 0 and a quarter, half
    and three quarters of ``cores`` (rounded half up, at least 1)."""
    if setting != "auto":
        return sorted({int(workers) for workers in setting})
    return sorted({0} | {max(1, int(cores * share + 0.5)) for share in WORKER_CANDIDATE_SHARES})


def cpu_budget(threads: int, workers: int | str, probe_choice: dict | None = None, gpus: int = 1) -> tuple[int, int]:
    """(dataloader workers, torch threads) for each of a job's ``gpus`` ranks, granted `threads` cores in all, never
    more than the machine has.

    Workers and torch's intra-op threads share the cores: oversubscribing them ran 5-7x slower on 2 cores. Under DDP
    every rank has its own workers and threads, so each rank's share is threads // gpus cores. `auto` workers take
    the probe's measured choice (it measured one rank; at most the rank's cores, as yolov5 caps them per device),
    else leave one core to compute. An explicit count is the user's, kept as given.
    """
    threads = max(1, min(int(threads), available_cores()) // max(int(gpus), 1))
    if workers == "auto":
        chosen = (probe_choice or {}).get("workers")
        workers = min(2, threads - 1) if chosen is None else min(int(chosen), threads)
    workers = max(0, int(workers))
    return workers, max(1, threads - workers)


def resolve_batch(batch, gpus: int, probe_choice: dict | None = None) -> int:
    """A stage's total batch: its own, or for `auto` the probe's per-GPU choice (else 16) times its GPUs."""
    if batch == "auto":
        return int((probe_choice or {}).get("batch", 16) * int(gpus))
    return int(batch)


def spec_digest(plan: dict) -> str:
    """A short hash of what decides a stage's result, used to know whether a checkpoint can be resumed."""
    return hashlib.sha256(json.dumps(plan, sort_keys=True, default=str).encode()).hexdigest()[:16]
