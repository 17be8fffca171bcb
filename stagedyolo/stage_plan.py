"""One stage's plan: its spec (stagedyolo.recipe) resolved once, on this machine, into what one yolov5 run needs.

`build_plan` is the one resolver of a stage's batch, loader workers, torch threads, AMP setting and image size; the
probe predicts a stage's speed with the same `resolve_resources`, so its figures are for the settings the stage
will run. The plan is plain JSON (`StagePlan`): the worker reads it from plan.json, and stage.json records it whole.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, NamedTuple, TypedDict

from stagedyolo.engine.options import engine_spec, stage_hyp, yolov5_options
from stagedyolo.recipe import stage_img
from stagedyolo.yolov5_facts import MIN_WARMUP_ITERS, NOMINAL_BATCH, accumulate

# Smallest batch the out-of-memory retry halves down to.
MIN_RETRY_BATCH = 2

# Plan keys that may differ between a killed run and its resumption without changing what is trained: the try, and
# what the machine decides (loader workers and torch threads follow the job's cores, the cache mode its memory).
RUNTIME_KEYS = ("attempt", "resume_from", "torch_threads", "workers", "cache", "image_store", "run_stages")


class StagePlan(TypedDict, total=False):
    """plan.json: everything the worker needs. Paths are absolute (yolov5 sends a relative weights path with at most
    one slash to the Hugging Face hub, even when the file exists)."""

    stage: str
    data: str
    weights: str  # "" trains from model.cfg
    weights_stamp: str | None  # size:mtime of the weights file: a retrained input is another plan
    cfg: str
    epochs: int
    epochs_decision: dict | None  # how the recipe's time budget sized epochs (recipe_budget); None without one
    img: int
    img_decision: dict | None  # how the data's box sizes set img (recipe.stage_img); None where they did not
    val_img: int  # the size its validation loader loads at (recipe.target_img unless the stage names one)
    batch: int  # total over the stage's GPUs
    workers: int  # per rank
    torch_threads: int  # per rank
    freeze: int
    optimizer: str
    hyp: dict  # yolov5's complete hyp, lr0 scaled and warmup settled
    nominal_batch: int
    min_warmup_iters: int
    continues: bool  # takes up the previous stage's training (stagedyolo.engine.continuation)
    lr_from_previous: bool
    cache: str | None  # yolov5's --cache: "ram", "disk" or None
    image_store: str | None  # the working copy whose prebuilt store serves a ram cache
    amp: bool | str
    amp_source: str
    device: str
    val_period: int
    gpus: int  # per node
    nodes: int
    sync_bn: bool
    plots: bool
    nosave: bool
    engine: dict
    options: dict  # yolov5 options under their own names
    time_budget_s: float | None
    handover_on_stall: float | None
    work_dir: str
    run_stages: list[dict]  # every stage of the run ({stage, epochs, img}): the progress line's run ETA
    # Set per try by the stage, per trial by tune:
    attempt: int
    resume_from: str | None
    trial: dict
    # Set by the worker of a stage that continues the previous one, from its handover (engine.worker.take_up_plan):
    recipe_epochs_before: int
    fitness_before: float


# The keys build_plan leaves to the stage's run (its try), tune (a trial) and the worker (the handover).
PLAN_KEYS_SET_LATER = ("attempt", "resume_from", "trial", "recipe_epochs_before", "fitness_before")


class Resources(NamedTuple):
    """What a stage runs with on this machine (its total batch; each rank's loader workers and torch threads; AMP):
    the probe predicts with these, the stage trains with them."""

    batch: int  # total over every rank (nodes x gpus)
    workers: int
    torch_threads: int
    amp: Any  # True, False or "auto" (the worker decides auto from the device)
    amp_source: str


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


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


def resolve_resources(spec: dict, threads: int, probe_choice: dict | None = None) -> Resources:
    """A stage's batch, CPU split and AMP setting: its own, or for `auto` the probe's choice (the probe measures one
    GPU's batch; a stage's batch is the total over its GPUs; without a probe choice, 16 per GPU)."""
    choice = probe_choice or {}
    gpus = int(spec["gpus"])
    ranks = gpus * int(spec.get("nodes") or 1)
    workers, torch_threads = cpu_budget(threads, spec["workers"], choice, gpus=gpus)  # a node's share per rank
    batch = int(choice.get("batch", 16) * ranks) if spec["batch"] == "auto" else int(spec["batch"])
    if spec["amp"] == "auto" and "amp" in choice:
        reason = choice.get("amp_reason")
        return Resources(batch, workers, torch_threads, choice["amp"], f"probe ({reason})" if reason else "probe")
    return Resources(batch, workers, torch_threads, spec["amp"], "config")


def build_plan(
    spec: dict,
    *,
    stage: str,
    data: str,
    weights: str | None,
    cfg: str,
    cache_mode: str,
    threads: int,
    work_dir: Path,
    probe_choice: dict | None = None,
    image_store: str | None = None,
    run_stages: list[dict] | None = None,
    boxes_need: int | None = None,
) -> StagePlan:
    """The stage's plan from its spec (recipe.stage_spec) and what this run decided: the cache mode (cache_dataset),
    the probe's choice, the job's threads. ``image_store``: the working copy whose prebuilt image store serves a ram
    cache, None to let yolov5 decode. ``boxes_need``: the size the data's boxes need (recipe.boxes_need_img)."""
    resources = resolve_resources(spec, threads, probe_choice)
    img, img_decision = stage_img(spec, boxes_need)
    cache = cache_mode if spec["cache"] == "auto" else spec["cache"]
    # A spec that leaves them out (a hand-built spec) trains exactly as yolov5 does.
    nominal_batch = _unless_none(spec.get("nominal_batch"), NOMINAL_BATCH)
    continues = bool(spec.get("continues"))
    lr0 = scaled_lr0(spec["lr0"], resources.batch, spec["lr_scaling"], nominal_batch)
    return StagePlan(
        stage=stage,
        data=str(Path(data).resolve()),
        weights=str(Path(weights).resolve()) if weights else "",
        weights_stamp=_file_stamp(weights),
        cfg=cfg,
        epochs=spec["epochs"],
        epochs_decision=spec.get("epochs_decision"),
        img=img,
        img_decision=img_decision,
        val_img=spec.get("val_img") or img,  # a hand-built spec without it validates as yolov5 does
        batch=resources.batch,
        workers=resources.workers,
        torch_threads=resources.torch_threads,
        freeze=spec["freeze"],
        optimizer=spec["optimizer"],
        hyp=_continued_hyp(stage_hyp(lr0, spec["hyp"]), continues),
        nominal_batch=nominal_batch,
        min_warmup_iters=0 if continues else _unless_none(spec.get("min_warmup_iters"), MIN_WARMUP_ITERS),
        continues=continues,
        lr_from_previous=bool(spec.get("lr_from_previous")),
        cache=None if cache == "none" else cache,
        image_store=image_store if cache == "ram" else None,
        amp=resources.amp,
        amp_source=resources.amp_source,
        device=str(spec["device"]),
        val_period=spec["val_period"],
        gpus=spec["gpus"],
        nodes=int(spec.get("nodes") or 1),
        sync_bn=spec["sync_bn"],
        plots=spec["plots"],
        nosave=spec["nosave"],
        engine=spec.get("engine") or engine_spec({}, spec.get("engine_mode")),
        options={**yolov5_options(spec), **({"noautoanchor": True} if continues else {})},
        time_budget_s=spec["time_budget_min"] * 60 if spec.get("time_budget_min") else None,
        handover_on_stall=spec.get("handover_on_stall"),
        work_dir=str(Path(work_dir).resolve()),
        run_stages=run_stages or [{"stage": stage, "epochs": spec["epochs"], "img": img}],
    )


# lr_scaling: how a stage's lr0 follows its total batch (docs/ddp.md says why it is not scaled by default).
LR_SCALING_MODES = ("none", "linear")


def scaled_lr0(lr0: float, batch: int, mode: str = "none", nominal_batch: int = NOMINAL_BATCH) -> float:
    """The ``lr0`` to write into the stage's hyp file for a total ``batch`` under ``lr_scaling: mode``.

    - ``none`` (default): ``lr0`` unchanged. YOLOv5 already normalises to ``nominal_batch`` by accumulating
      gradients and scaling weight decay, and under DDP it multiplies the loss by WORLD_SIZE, so a stage with a
      total batch B on N GPUs takes the same optimizer steps as one GPU with batch B.
    - ``linear``: ``lr0 * effective_batch / nominal_batch`` with ``effective_batch = batch * accumulate``, the
      batch one optimizer step actually sees. That is the factor YOLOv5 applies to weight decay, so LR and weight
      decay move together. Up to 64 accumulation makes the factor about 1 (only the rounding of ``accumulate`` is
      left: 48 -> 0.75, 40 -> 1.25); above 64 it is ``batch / 64``.
    """
    if mode not in LR_SCALING_MODES:
        raise ValueError(f"lr_scaling must be one of {', '.join(LR_SCALING_MODES)}, not {mode!r}")
    if batch <= 0:
        raise ValueError(f"batch must be a positive total batch size, not {batch}")
    if mode == "none":
        return lr0
    effective_batch = batch * accumulate(batch, nominal_batch)
    return lr0 * effective_batch / nominal_batch


def retry_batch(batch: int, attempts: list[dict]) -> int:
    """Half the batch for every out-of-memory failure so far, never below MIN_RETRY_BATCH."""
    ooms = sum(1 for a in attempts if a["status"] == "oom")
    return max(MIN_RETRY_BATCH, batch // 2**ooms) if ooms else batch


def plan_digest(plan: StagePlan) -> str:
    """What decides a stage's result: a checkpoint is resumed, a publish taken up, only under the same digest. The
    batch is left out too: an out-of-memory retry halves it and keeps its attempt history."""
    return digest_of({k: v for k, v in plan.items() if k not in RUNTIME_KEYS and k != "batch"})


def digest_of(value) -> str:
    """A short, stable hash of JSON-like data."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _continued_hyp(hyp: dict, continues: bool) -> dict:
    """A continuing stage does not warm up again: the training's one warmup ran in its first stage. (With
    warmup_epochs and min_warmup_iters 0, train.py's warmup interpolation sets the stage's own LR and momentum at its
    first step.) Its lr0 is the handover's unless the stage named one: the worker fills it in."""
    return {**hyp, "warmup_epochs": 0.0} if continues else hyp


def _file_stamp(path: str | None) -> str | None:
    try:
        stat = Path(path).stat() if path else None
    except OSError:  # not there yet (a plan made ahead of its input): nothing to tell apart
        return None
    return f"{stat.st_size}:{stat.st_mtime_ns}" if stat else None


def _unless_none(value, default):
    return default if value is None else value
