"""The recipe's view of the config: the stages in their order and each stage's settings (its spec), before any
machine or run has resolved them (stagedyolo.stage_plan does that). The Snakefile reads the stage order and what the
rules depend on from here."""

from __future__ import annotations

from pathlib import Path

from stagedyolo.engine.options import AUGMENTATION_KEYS, YOLOV5_OPTIONS, engine_spec
from stagedyolo.jsonio import read_json

# Keys a stage may set. The schema (workflow/schemas/config.schema.yaml) documents and bounds each one.
STAGE_KEYS = (
    "epochs",
    "img",
    "img_from_boxes",
    "val_img",
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
    "nodes",
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
) + YOLOV5_OPTIONS


def stage_names(config: dict) -> list[str]:
    """The recipe's stages in order: `stage_order`, else the order `stages` is written in. The shipped config sets
    `stage_order` because Snakemake merges an override (`--config 'stages={finetune: {epochs: 9}}'`, or a
    `--configfile` naming some stages) into the default mapping with the override's keys first: read from the
    mapping, that order would make `finetune` the first stage, trained from the pretrained weights."""
    return list(config.get("stage_order") or config["stages"])


def unlisted_stages(config: dict) -> list[str]:
    """Stages the config defines that `stage_order` leaves out: they do not run."""
    return [stage for stage in config["stages"] if stage not in stage_names(config)]


def run_outline(config: dict, boxes_need: int | None = None) -> list[dict]:
    """Every stage in order with its epochs and the image size it trains at (stage_img): what a run's ETA is
    estimated from."""
    specs = {name: stage_spec(config, name) for name in stage_names(config)}
    return [
        {"stage": name, "epochs": spec["epochs"], "img": stage_img(spec, boxes_need)[0]} for name, spec in specs.items()
    ]


def previous_stage(config: dict, stage: str) -> str | None:
    names = stage_names(config)
    index = names.index(stage)
    return names[index - 1] if index else None


def stage_spec(config: dict, stage: str) -> dict:
    """The stage's settings: stage_defaults, overridden by what the stage names."""
    if stage not in config["stages"]:
        raise KeyError(f"unknown stage {stage!r}: config 'stages' has {stage_names(config)}")
    defaults, own = config["stage_defaults"], config["stages"][stage] or {}
    spec = {key: defaults.get(key) for key in STAGE_KEYS}
    spec.update(own)
    spec["hyp"] = {**(defaults.get("hyp") or {}), **(own.get("hyp") or {})}
    if spec["device"] is None:
        spec["device"] = config["device"]
    spec["target_img"] = target_img(config)
    if spec["val_img"] is None:
        spec["val_img"] = spec["target_img"]
    spec["engine"] = engine_spec(config.get("engine") or {}, spec["engine_mode"])
    # start_from: previous continues the previous stage's training (stagedyolo.engine.continuation), at the LR it
    # handed over unless the stage names its own lr0 (a jump it asks for; stage_defaults' lr0 is the first stage's).
    spec["continues"] = spec["start_from"] == "previous" and previous_stage(config, stage) is not None
    spec["lr_from_previous"] = spec["continues"] and "lr0" not in own
    return spec


def target_img(config: dict) -> int | None:
    """The recipe's target size: the image size its last stage trains at. Every stage validates at it unless it names
    its own val_img, so each phase's mAP is the one the finished model will be used at (a phase at a smaller size is
    judged at the target too), and the stages' fitness figures compare across the chain."""
    last = config["stages"][stage_names(config)[-1]] or {}
    img = last.get("img") or config["stage_defaults"].get("img")
    return int(img) if img else None  # a partial config (tests, a check of one key) may name no size


def stage_img(spec: dict, boxes_need: int | None) -> tuple[int, dict | None]:
    """The size a stage trains at, and what decided it. With ``img_from_boxes``, a phase below the recipe's target
    trains at no less than ``boxes_need`` (the dataset report's training boxes: min_img_for_95pct_at_stride, from
    boxes_need_img), and never above the target: a cheaper size must not shrink the data's small objects under one
    cell of yolov5's finest grid. (On det, whose boxes need 224 px at a 160-px target, early phases at 128 ended at
    mAP50 0.231 and at 160 at 0.262, seeds 0-2: benchmarks/results/recipe_ablation_det_seeds.) The decision is
    None where the rule does not apply: switched off, a stage at the target, or no box figure."""
    img, target = int(spec["img"]), spec.get("target_img")
    if not spec.get("img_from_boxes") or target is None or img >= int(target) or boxes_need is None:
        return img, None
    trained = min(int(target), max(img, int(boxes_need)))
    return trained, {"configured": img, "boxes_need": int(boxes_need), "target": int(target), "trained": trained}


def boxes_need_img(dataset_report: str | Path | None) -> int | None:
    """The training size at which 95 % of the training boxes span one cell of yolov5's finest grid, from
    prepare_dataset's dataset_report.json (None without a report or without boxes)."""
    if not dataset_report:
        return None
    return boxes_need_in(read_json(Path(dataset_report)))


def split_images(report: dict) -> tuple[int, int]:
    """(training, validation) images in a dataset report (validate.validate_dataset's)."""
    return tuple(int((report["splits"].get(split) or {}).get("images") or 0) for split in ("train", "val"))


def boxes_need_in(report: dict) -> int | None:
    """boxes_need_img's figure from a dataset report already in memory (validate.validate_dataset's)."""
    train = report["splits"].get("train") or {}
    return (train.get("box_short_side") or {}).get("min_img_for_95pct_at_stride")


def stage_inputs(config: dict, stage: str) -> dict:
    """Everything a stage's job reads from the config: its spec, the model config it builds from, the telemetry
    interval, and the tune window when the stage tunes. The train_stage rule passes exactly this as its params, so a
    change to any of it reruns the stages that read it, and no other."""
    spec = stage_spec(config, stage)
    return {
        "spec": spec,
        "cfg": config["model"]["cfg"],
        "telemetry_interval_s": config["telemetry"]["interval_s"],
        "tune": config["tune"] if spec.get("tune") else None,
        # only with a budget: without one the params stay as they were, and no finished stage reruns for it
        **({"recipe_budget": budget} if (budget := budget_inputs(config, stage)) else {}),
    }


# The stage settings a stage's share of the recipe's time budget depends on (stagedyolo.recipe_budget): its epochs,
# the size it trains at, what it trains and how often it validates and saves.
BUDGET_SHAPE_KEYS = ("epochs", "img", "img_from_boxes", "target_img", "freeze", "val_period", "nosave")


def budget_inputs(config: dict, stage: str) -> dict | None:
    """What a stage's sizing under `recipe_minutes` reads from the config: the budget, and the shape of this stage
    and of the stages after it, which share what is left (so a change to a later stage reruns the earlier ones too,
    under a budget only). None without a budget."""
    minutes = config.get("recipe_minutes")
    if not minutes:
        return None
    names = stage_names(config)
    shapes = [{"stage": name, **stage_spec(config, name)} for name in names[names.index(stage) :]]
    return {
        "budget_s": float(minutes) * 60,
        "stages": [{key: shape[key] for key in ("stage", *BUDGET_SHAPE_KEYS)} for shape in shapes],
    }


# The stage keys that decide the sizes a stage loads its images at (stage_img and val_img).
SIZE_KEYS = ("img", "img_from_boxes", "target_img", "val_img")


def image_store_stages(config: dict) -> list[dict]:
    """The stages whose cache may be ram (auto or ram), by the keys that decide their sizes: what cache_dataset
    builds the image store for, once per distinct set of sizes. It is cache_dataset's param, whose rerun reruns every
    stage, so a stage added or changed at sizes another stage already loads at changes nothing. Empty when
    cache.prebuild_ram is off."""
    if not config["cache"].get("prebuild_ram", True):
        return []
    specs = [stage_spec(config, stage) for stage in stage_names(config)]
    sizes = [{key: spec[key] for key in SIZE_KEYS} for spec in specs if spec["cache"] in ("auto", "ram")]
    return [dict(items) for items in sorted({tuple(entry.items()) for entry in sizes}, key=repr)]


def image_store_sizes(stages: list[dict], boxes_need: int | None = None) -> dict[str, list[int]]:
    """Per split, the image sizes those stages load at: train at each one's stage_img, val at its val_img."""
    if not stages:
        return {}
    return {
        "train": sorted({stage_img(spec, boxes_need)[0] for spec in stages}),
        "val": sorted({spec["val_img"] for spec in stages}),
    }


# The stage keys the probe decides when a stage leaves them at `auto`.
PROBED_KEYS = ("workers", "batch", "amp")


def probe_needed(config: dict) -> bool:
    """Whether the probe rule runs: it is enabled, and some stage leaves workers, batch or amp at `auto`
    (a config that pins all three in every stage would pay the probe's half minute for nothing)."""
    if not config["probe"]["enabled"]:
        return False
    return any(stage_spec(config, stage)[key] == "auto" for stage in stage_names(config) for key in PROBED_KEYS)


def probe_batches(config: dict) -> list[int]:
    """The batch sizes (per GPU) the probe times the model at: its candidates when some stage leaves batch at
    `auto`; otherwise only the batches of the stages that take its workers or amp, since no other batch can be
    chosen (on the demo that is one model batch instead of three: seconds saved, nothing a choice depends on lost).
    """
    specs = [stage_spec(config, stage) for stage in stage_names(config)]
    if any(spec["batch"] == "auto" for spec in specs):
        return list(config["probe"]["batch"])
    fixed = {
        max(1, int(spec["batch"]) // int(spec["gpus"]))
        for spec in specs
        if spec["workers"] == "auto" or spec["amp"] == "auto"
    }
    return sorted(fixed) or list(config["probe"]["batch"])


# The stage keys a stage's speed depends on: what the probe predicts each stage's images/s from.
SPEED_KEYS = (
    "img",
    "img_from_boxes",
    "target_img",
    "freeze",
    "batch",
    "workers",
    "amp",
    "gpus",
    "nominal_batch",
    "engine",
)


def speed_spec(spec: dict) -> dict:
    """The part of a resolved stage spec its step's cost depends on: what the probe predicts the stage's images/s
    from. Epochs, the LR and the hyp keys other than the augmentations are left out: they do not change a step's
    cost."""
    return {
        **{key: spec[key] for key in SPEED_KEYS},
        "hyp": {key: spec["hyp"][key] for key in AUGMENTATION_KEYS if key in spec["hyp"]},
    }


def probe_stage_specs(config: dict) -> dict:
    """Each stage's speed-relevant settings, for the probe's per-stage predictions (read by the probe's script from
    the config; probe_rerun_stages says when they are also a rule param)."""
    return {stage: speed_spec(stage_spec(config, stage)) for stage in stage_names(config)}


def probe_rerun_stages(config: dict) -> dict | None:
    """The stages' speed settings as the probe rule's param, which reruns the probe and with it every stage: only
    under a time budget, where each stage sizes its epochs from the probe's predictions of itself and of the stages
    after it. Without one a prediction is only set beside the rate the stage measured, and a change to one stage's
    speed settings (its mosaic, workers, batch) reruns that stage and the ones after it, through their own params:
    the earlier stages keep their training, and the changed stage reports no prediction, since the probe measured
    it at other settings (probe.stages.prediction_for)."""
    return probe_stage_specs(config) if config.get("recipe_minutes") else None


def probe_engine(config: dict) -> dict:
    """The engine settings of the first stage, whose step the probe's model runs time when it chooses (a rule param:
    the choice depends on it)."""
    return stage_spec(config, stage_names(config)[0])["engine"]


def planned_training_s(config: dict) -> float | None:
    """The recipe's time budget in seconds (recipe_minutes), else None: where set, the planned training lasts that
    long whatever its epochs (stagedyolo.recipe_budget). Read by the probe's script, like planned_epochs."""
    minutes = config.get("recipe_minutes")
    return 60.0 * float(minutes) if minutes else None


def planned_epochs(config: dict) -> dict[str, int]:
    """Each stage's epochs: with the training image count, the probe's estimate of the planned training, whose share
    may lengthen its budget, and of the size most of it trains at, where the candidates are timed. Read by the
    probe's script from the config, not passed as a rule param, so that changing epochs does not rerun the probe (and
    with it every stage)."""
    return {stage: int(stage_spec(config, stage)["epochs"]) for stage in stage_names(config)}
