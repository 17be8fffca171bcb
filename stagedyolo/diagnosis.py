"""Name a stage's bottleneck from its timing.json and say which config change to make.

A rule table: ``read_facts`` turns the timing into one ``Facts`` object, once; each class is one short function of
those facts (RULES); ``diagnose`` runs the table. Every threshold is in THRESHOLDS, with its source (docs/timing.md
prints the same table).

What the advice never does:
- guess a bigger batch: it is advised only when a measurement at that batch showed it faster (a ``tune`` trial, see
  stagedyolo/tune.py). On an H200 at data-wait < 1 % "GPU idle -> bigger batch" made every stage slower: the step on
  the host set the pace, which is the ``host_bound_step`` class. Advice nobody measured is labelled "unverified".
- change a setting that defines the stage (``defining_settings``): the target image size, a frozen backbone.
- trade resume away (``nosave``) or change what is trained (``img``) without saying so in the verdict line.
- call a stage data-loading bound on anything but its data wait, or blame the loader on a CPU-only run whose cores
  the training itself keeps busy.
- invent GPU values: on CPU-only runs the classes that need them are judged on CPU-side evidence or not evaluated.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from stagedyolo.telemetry.summary import finite as _num
from stagedyolo.yolov5_facts import NOMINAL_BATCH

# name: (value, unit, source). ONE table: the rules read nothing else.
THRESHOLDS: dict[str, tuple[float, str, str]] = {
    "data_wait_share": (
        0.05,
        "fraction of step time",
        "PyTorch profiler rule of thumb: data loading > 5 % of step time = input-bound",
    ),
    "gpu_util_low_pct": (
        50.0,
        "% (NVML p50, training window)",
        "PyTorch profiler rule of thumb: GPU utilisation < 50 % = use a bigger batch (here: only when measured)",
    ),
    "gpu_util_busy_pct": (
        85.0,
        "% (NVML p50)",
        "project: below this a GPU with spare memory gains from a bigger batch",
    ),
    "memory_headroom_share": (
        0.25,
        "fraction of GPU memory",
        "project: peak < 25 % leaves room to double the batch at least twice",
    ),
    "memory_high_share": (
        0.90,
        "fraction of GPU memory (peak)",
        "PyTorch profiler rule of thumb: peak memory > 90 % = AMP, smaller batch or image",
    ),
    "memory_target_share": (
        0.80,
        "fraction of GPU memory",
        "project: a batch recommendation aims at most at this peak",
    ),
    "small_batch": (
        16,
        "images per batch",
        "article: near-full memory at a small batch means the image/model is too big, not the batch",
    ),
    "ram_low_share": (
        0.10,
        "fraction of host RAM available (min)",
        "project: host memory nearly exhausted (CPU training, RAM cache)",
    ),
    "cpu_busy_pct": (
        85.0,
        "% mean over cores",
        "project: above this the host has no spare core for another loader worker",
    ),
    "val_share": (
        0.10,
        "fraction of the epoch loop",
        "article: validate less often when validation costs > 10 % of training (yolov5 validates every epoch)",
    ),
    "val_target_share": (0.05, "fraction of the epoch loop", "project: val_period is chosen to bring val near this"),
    "checkpoint_share": (
        0.05,
        "fraction of the epoch loop",
        "article: per-epoch checkpoints of quick runs are waste (nosave)",
    ),
    "logging_share": (
        0.05,
        "fraction of the epoch loop",
        "article: keep logging local (TensorBoard only); yolov5 plots cost seconds on CPU",
    ),
    "first_epoch_overhead": (
        1.5,
        "first epoch / steady epoch train time",
        "article: a slow first epoch is image decoding; cache the decoded images",
    ),
    "ram_cache_margin": (
        0.30,
        "fraction of available RAM kept free",
        "config cache.ram_safety_margin default; yolov5 itself keeps only 10 %",
    ),
    "min_measured_gain": (
        0.05,
        "fraction faster (steady images/s)",
        "project (H200 replay): a change is kept (tune) or a bigger batch advised only when measured this much faster",
    ),
    "nominal_batch": (
        NOMINAL_BATCH,
        "images",
        "yolov5 nbs: gradients are accumulated to 64, so batch <= 64 keeps the optimisation",
    ),
}

CLASSES = {
    "memory_bound": (3, "Memory-bound"),
    "batch_reduced_after_oom": (3, "Ran out of memory; retried at a smaller batch"),
    "data_loading_bound": (1, "Data-loading bound"),
    "batch_too_small": (2, "Batch too small"),
    "host_bound_step": (2, "Host-bound step (the main process sets the pace, not the loader or the batch)"),
    "periodic_stalls": (4, "Periodic stalls (validation / checkpoint / logging)"),
    "slow_first_epoch": (5, "Slow first epoch"),
    "healthy": (0, "Healthy"),
}
FIRST = ("memory_bound", "batch_reduced_after_oom")  # out-of-memory risk comes before any speed finding
TRIALABLE_KEYS = ("workers", "batch", "cache", "amp")  # what a short training window can measure

# Changes that cost something besides speed: advised only with their cost beside them, in a few words in the verdict
# line (whichever finding advises them) and in full in diagnosis.md and the report. tune tries neither.
TRADE_OFFS = {
    "img": (
        "changes what is trained",
        "trains and detects at a lower resolution (small objects suffer): compare mAP before keeping it",
    ),
    "nosave": (
        "no resume mid-stage",
        "keeps only last.pt, written at the end: a stage killed mid-way restarts instead of resuming",
    ),
}
_SMALLER_MODEL = "a smaller model (model.cfg), e.g. yolov5n.yaml"


def T(name):
    return THRESHOLDS[name][0]


class NotEvaluated(NamedTuple):
    """A class the rules could not judge, or judged and chose not to advise on, with the reason."""

    code: str
    reason: str


class Findings(list):
    """A list of finding dicts (most important first) plus ``stage``, ``not_evaluated`` and ``to_dict()``."""

    def __init__(self, items=(), stage=None, not_evaluated=None, context=None):
        super().__init__(items)
        self.stage = stage
        self.not_evaluated = list(not_evaluated or [])
        self.context = dict(context or {})

    @property
    def codes(self) -> list[str]:
        return [f["code"] for f in self]

    def to_dict(self) -> dict:
        return {
            "stage": self.stage,
            "verdict": verdict_line(self.stage, self),
            "findings": list(self),
            "not_evaluated": self.not_evaluated,
            "context": self.context,
            "thresholds": {k: {"value": v[0], "unit": v[1], "source": v[2]} for k, v in THRESHOLDS.items()},
        }


# ---- the facts ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Facts:
    """What the rules read, computed once from a timing.json (and the stage's plan, when given)."""

    stage: str
    gpu: bool  # GPU readings present; False on CPU-only runs
    gpu_reason: str | None
    gpu_util: float | None  # NVML p50 over the training window, %
    memory_share: float | None  # GPU peak memory / total
    cpu_util: float | None  # host mean over cores, training window, %
    cores: int | None
    threads: int | None  # torch threads per rank
    ram_available_mb: float | None
    ram_total_mb: float | None
    peak_rss_mb: float | None
    batch: int | None
    nominal_batch: int
    gpus: int
    workers: int | None
    img: int | None
    amp: bool | None
    amp_setting: object  # as the timing records it, for the evidence
    cache: str  # "ram", "disk" or "" (none)
    nosave: bool
    plots: object
    epochs: int
    val_period: int
    data_wait_share: float | None  # steady epochs: what a loader fix could recover
    data_wait_share_all: float | None  # all epochs: the figure the report's table prints
    epoch_rows: tuple  # timing["epochs"]
    loop: dict  # seconds of the epoch loop by phase: train, val, checkpoint, logging
    loop_s: float
    train_share: float  # train / epoch loop (1.0 when unknown)
    first_epoch_overhead: float | None
    first_epoch_reason: str | None
    steady_epoch_s: float
    cache_estimate_mb: float | None
    oom_attempts: tuple
    batch_rates: dict  # batch -> (steady images/s, what measured it)
    defining: dict  # setting -> why it defines the stage: advice never changes it

    @property
    def cpu_only(self) -> bool:
        return not self.gpu

    @property
    def cpu_busy(self) -> bool:
        return self.cpu_util is not None and self.cpu_util > T("cpu_busy_pct")

    @property
    def waits_on_data(self) -> bool:
        """Over the threshold both over the steady epochs and over all of them: the class never contradicts the
        data-wait figure the report prints beside it."""
        shares = [s for s in (self.data_wait_share, self.data_wait_share_all) if s is not None]
        return bool(shares) and min(shares) > T("data_wait_share")

    @property
    def gpu_low_util(self) -> bool:
        return self.gpu_util is not None and self.gpu_util < T("gpu_util_low_pct")


def _int(x):
    v = _num(x)
    return int(v) if v is not None else None


def _amp_on(amp) -> bool | None:
    if isinstance(amp, str):
        amp = {"true": True, "false": False}.get(amp.lower())
    return amp if isinstance(amp, bool) else None


def _memory_share(gpu: dict) -> float | None:
    share = _num(gpu.get("peak_memory_share")) if gpu.get("available") else None
    if share is None and _num(gpu.get("torch_peak_reserved_mb")) and _num(gpu.get("torch_total_mb")):
        share = gpu["torch_peak_reserved_mb"] / gpu["torch_total_mb"]  # CUDA without NVML: torch's own figure
    return share


def _cache_mode(value) -> str:
    mode = (value or "").lower()
    return "" if mode == "none" else mode  # "ram", "disk" or ""


def _cache_estimate_mb(timing) -> float | None:
    """Decoded-image RAM for --cache ram: images * img^2 * 3 bytes (yolov5 caches images resized to img)."""
    img = _num(timing["config"].get("img"))
    images = [e["images"] for e in timing["epochs"] if e.get("images")]
    return max(images) * img * img * 3 / 2**20 if img and images else None


def defining_settings(plan: dict | None) -> dict[str, str]:
    """The settings that define a stage (setting -> why), which no advice may change. From the stage's plan
    (stage.json): its own ``defining_settings`` when it names them; else ``img`` when the stage trains at the run's
    target size (the last stage, or the largest img of ``run_stages``) and ``freeze`` when it freezes layers. Without
    a plan the timing cannot tell a cheap early phase from the target size: both are kept."""
    if plan is None:
        return {
            "img": "its image size (no stage plan given: it may be the run's target size)",
            "freeze": "its frozen layers (no stage plan given)",
        }
    if plan.get("defining_settings") is not None:
        return {key: "named by the stage's plan" for key in plan["defining_settings"]}
    out = {}
    if (_int(plan.get("freeze")) or 0) > 0:
        out["freeze"] = f"freeze: {plan['freeze']}, the stage trains on a frozen backbone"
    outline = plan.get("run_stages") or []
    sizes = [_int(s.get("img")) for s in outline if _int(s.get("img"))]
    last = not outline or outline[-1].get("stage") == plan.get("stage")
    img = _int(plan.get("img"))
    if last or (img and sizes and img >= max(sizes)):
        out["img"] = f"img: {img}, the run's target size"
    return out


def judged_on_validations(config: dict) -> dict[str, str]:
    """val_period defines a stage whose own stopping reads its validations (patience, handover_on_stall)."""
    if config.get("handover_on_stall") or (_int(config.get("patience")) or 0) > 0:
        return {"val_period": "its validations, by which patience or handover_on_stall judge the stage"}
    return {}


def read_facts(timing: dict, stage: str | None = None, measured: dict | None = None, plan: dict | None = None):
    cfg, gpu, cpu, dw, eps = timing["config"], timing["gpu"], timing["cpu"], timing["data_wait"], timing["epochs"]
    has_gpu = bool(gpu.get("available"))
    loop = {k: sum(e[f"{k}_s"] for e in eps) for k in ("train", "val", "checkpoint", "logging")}
    loop_s = sum(loop.values())
    steady = _num(dw.get("steady_share"))
    return Facts(
        stage=stage or timing.get("stage") or "<stage>",
        gpu=has_gpu,
        gpu_reason=gpu.get("reason"),
        gpu_util=_num((gpu.get("util_pct") or {}).get("p50")) if has_gpu else None,
        memory_share=_memory_share(gpu),
        cpu_util=_num(cpu.get("util_mean_pct")),
        cores=_int(cpu.get("cores")),
        threads=_int(cfg.get("threads")),
        ram_available_mb=_num(cpu.get("ram_available_min_mb")),
        ram_total_mb=_num(cpu.get("ram_total_mb")),
        peak_rss_mb=_num(cpu.get("peak_rss_mb")),
        batch=_int(cfg.get("batch")),
        nominal_batch=_int(cfg.get("nominal_batch")) or int(T("nominal_batch")),  # the stage's, else yolov5's 64
        gpus=max(_int(cfg.get("gpus")) or 1, 1),
        workers=_int(cfg.get("workers")),
        img=_int(cfg.get("img")),
        amp=_amp_on(cfg.get("amp")),
        amp_setting=cfg.get("amp"),
        cache=_cache_mode(cfg.get("cache")),
        nosave=cfg.get("nosave") is True,
        plots=cfg.get("plots"),
        epochs=_int(cfg.get("epochs")) or len(eps),
        val_period=_int(cfg.get("val_period")) or 1,
        data_wait_share=steady if steady is not None else _num(dw.get("share")),
        data_wait_share_all=_num(dw.get("share")),
        epoch_rows=tuple(eps),
        loop=loop,
        loop_s=loop_s,
        train_share=loop["train"] / loop_s if loop_s > 0 else 1.0,
        first_epoch_overhead=_num(timing.get("first_epoch_overhead")),
        first_epoch_reason=timing.get("first_epoch_overhead_reason"),
        steady_epoch_s=_num(timing["throughput"].get("steady_epoch_train_s")) or 0.0,
        cache_estimate_mb=_cache_estimate_mb(timing),
        oom_attempts=tuple(a for a in timing.get("attempts") or [] if a.get("status") == "oom"),
        batch_rates=measured_batch_rates(timing, measured),
        defining={**defining_settings(plan), **judged_on_validations(cfg)},
    )


def measured_batch_rates(timing: dict, measured: dict | None = None) -> dict[int, tuple[float, str]]:
    """batch -> (steady images/s, what measured it): from the stage's tune trials (timing["tune"]) and from
    ``measured`` ({"batch_images_per_s": {batch: images/s}, "source": "..."}), e.g. the probe's figures at the
    stage's settings. Tune trials win: they ran the real stage."""
    rates: dict[int, tuple[float, str]] = {}
    m = measured or {}
    for b, ips in (m.get("batch_images_per_s") or {}).items():
        if _num(ips):
            rates[int(b)] = (float(ips), m.get("source") or "measurement")
    tune = timing.get("tune") or {}
    for trial in tune.get("trials") or []:
        b, ips = _int((trial.get("settings") or {}).get("batch")), _num(trial.get("images_per_s"))
        if b and ips:
            rates[b] = (ips, "tune trial")
    return rates


# ---- building a finding --------------------------------------------------------------------------------------------


def _ev(value, threshold, op):
    return {"value": None if value is None else round(value, 4), "threshold": threshold, "op": op}


def _gain(speedup=None, saves_share=None, basis="", measured_by=None) -> dict:
    """A finding's expected gain: ``speedup`` of steady training images/s (x1.25 = 25 % faster) and/or the share of
    the epoch loop it saves; ``measured_by`` names the measurement behind it, None when it is an estimate."""
    return {
        "speedup": None if speedup is None else round(speedup, 3),
        "saves_share": None if saves_share is None else round(max(saves_share, 0.0), 4),
        "basis": basis,
        "measured_by": measured_by,
    }


_NO_OOM_GAIN = _gain(basis="avoids running out of memory (and its retries)")


def _setting(change: str) -> tuple[str, str | None, str]:
    """``stages.S.workers: 8`` -> ("stages.S.workers", "workers", "8"); the key is None when the change is not a
    stage setting (e.g. the smaller model)."""
    head, _, value = change.partition(": ")
    return head, head.rsplit(".", 1)[-1] if head.startswith("stages.") else None, value


def trade_off_of(change: str) -> dict | None:
    """What ``change`` costs besides speed, {"summary", "detail"} (TRADE_OFFS), or None."""
    _head, key, _value = _setting(change)
    if key not in TRADE_OFFS:
        return None
    summary, detail = TRADE_OFFS[key]
    return {"summary": summary, "detail": detail}


def _with_trade_off(change: str) -> str:
    """``change``, followed by its trade-off's summary in brackets when it has one."""
    trade_off = trade_off_of(change)
    return f"{change} ({trade_off['summary']})" if trade_off else change


def candidate_of(change: str) -> dict | None:
    """``stages.S.workers: 8`` -> {"workers": 8} when a tune trial can measure it, else None."""
    _head, key, value = _setting(change)
    if key not in TRIALABLE_KEYS or not value:
        return None
    value = value.split()[0]
    if value.isdigit():
        return {key: int(value)}
    return {key: {"true": True, "false": False}.get(value, value)}


def finding(f: Facts, code, evidence, levers, why, *, share=None, key=None, gain=None, **kw):
    """A finding from its ``levers`` (the changes that would help, best first): the first is the change, the rest
    ``also``. ``share``: the share of the epoch loop it addresses; ``key``: its key metric. A lever that would change
    a setting defining the stage is dropped; when none is left the class is reported as not evaluated, with why.
    ``candidate`` (keyword): the tune trial's settings, by default the change's; None when a short training window
    cannot measure it (validation, checkpoints, memory)."""
    kept = [c for c in levers if _setting(c)[1] not in f.defining]
    if not kept:
        key = _setting(levers[0])[1]
        return NotEvaluated(code, f"{why}, but the change that would help ({levers[0]}) alters {f.defining[key]}")
    if key is None:  # the first piece of evidence that crossed its threshold
        key = next((k for k, v in evidence.items() if isinstance(v, dict) and v.get("op") in ("<", ">")), None)
    cls, title = CLASSES[code]
    return {
        "code": code,
        "class": cls,
        "title": title,
        "key_metric": key,
        "evidence": evidence,
        "change": kept[0],
        "trade_off": trade_off_of(kept[0]),
        "also": [_with_trade_off(a) for a in kept[1:]],
        "why": why,
        "addressable_share": None if share is None else round(max(share, 0.0), 4),
        "expected_gain": gain or _gain(basis="no speed estimate"),
        "candidate": kw["candidate"] if "candidate" in kw else candidate_of(kept[0]),
        "verified": bool(gain and gain.get("measured_by")),
    }


# ---- levers shared by several classes ------------------------------------------------------------------------------


def smaller_img(f: Facts) -> str:
    """Three quarters of the stage's image size (of 64 when unknown), down to a multiple of 32, at least 32."""
    return f"stages.{f.stage}.img: {max(32, int((f.img or 64) * 0.75) // 32 * 32)}"


def cache_change(f: Facts) -> str | None:
    """ram when the decoded images fit in the available RAM (minus the margin), else disk; None when cached."""
    fits = (
        f.cache_estimate_mb is not None
        and f.ram_available_mb is not None
        and f.cache_estimate_mb < (1 - T("ram_cache_margin")) * f.ram_available_mb
    )
    if f.cache == "ram" or (f.cache == "disk" and not fits):
        return None
    return f"stages.{f.stage}.cache: {'ram' if fits else 'disk'}"


def cache_evidence(f: Facts) -> dict:
    return {
        "cache_estimate_mb": _ev(f.cache_estimate_mb, None, "info"),
        "ram_available_min_mb": _ev(f.ram_available_mb, None, "info"),
        "cache": f.cache or None,
    }


def more_workers(f: Facts) -> int | None:
    """Twice the loader workers (at least one more) when a core is free for them: the CPU is not busy, yolov5's cap
    (cores // gpus) is not reached and, on a CPU-only run, the torch threads (the training) keep their cores."""
    cap = f.cores // f.gpus if f.cores else None
    if f.workers is None or cap is None or f.workers >= cap or f.cpu_busy:
        return None
    n = min(cap, max(f.workers * 2, f.workers + 1))
    if f.cpu_only and f.threads and f.threads + n > f.cores:
        return None
    return n


def bigger_batch(f: Facts) -> int:
    """The batch a trial would try: x2, or up to x4 while the peak stays <= memory_target_share; capped at the
    nominal batch when only memory headroom (not low utilisation) suggests it."""
    factor = 2
    if f.memory_share:
        factor = min(2 ** int(math.log2(max(T("memory_target_share") / f.memory_share, 1.0))), 4)
    batch = f.batch * factor
    if _memory_headroom(f) and not f.gpu_low_util:
        batch = min(batch, f.nominal_batch)
    return batch // f.gpus * f.gpus


def _memory_headroom(f: Facts) -> bool:
    return (
        f.memory_share is not None
        and f.memory_share < T("memory_headroom_share")
        and f.gpu_util < T("gpu_util_busy_pct")
        and f.batch < f.nominal_batch
    )


def _batch_support(f: Facts) -> tuple[int, float, str] | None:
    """(bigger batch, speedup, source) when a bigger batch measured >= min_measured_gain faster than the stage's."""
    rates = f.batch_rates
    if f.batch not in rates:
        return None
    base = rates[f.batch][0]
    best = max((b for b in rates if b > f.batch), key=lambda b: rates[b][0], default=None)
    if best is None or rates[best][0] < base * (1 + T("min_measured_gain")):
        return None
    return best, rates[best][0] / base, rates[best][1]


def validations(period: int, epochs: int) -> int:
    """In-loop validations of an ``epochs``-epoch stage at ``val_period`` (engine.hooks.ValidationSchedule)."""
    return sum(1 for e in range(1, epochs + 1) if e % max(period, 1) == 0 or e == epochs)


# ---- the rules: one per class ----------------------------------------------------------------------------------


def memory_bound_gpu(f: Facts) -> list:
    if not f.gpu and f.memory_share is None:
        return []
    if f.memory_share is None:
        return [NotEvaluated("memory_bound", "no GPU memory reading (neither NVML nor torch)")]
    if f.memory_share <= T("memory_high_share"):
        return []
    halve = f"stages.{f.stage}.batch: {max(f.gpus, (f.batch or 2) // 2 // f.gpus * f.gpus)}"
    if f.amp is not True:
        levers, why = [f"stages.{f.stage}.amp: true"], "fp16 activations roughly halve activation memory"
    elif f.batch is not None and f.batch > T("small_batch"):
        levers, why = [halve, _SMALLER_MODEL], "AMP is already on and the batch is large: halve it"
    elif f.img is not None and f.img > 64:
        levers = [smaller_img(f), _SMALLER_MODEL]
        why = "AMP is on and the batch is already small: the image (or the model) is too big for this GPU"
    else:
        levers, why = [halve, _SMALLER_MODEL], "memory is full"
    evidence = {
        "peak_memory_share": _ev(f.memory_share, T("memory_high_share"), ">"),
        "batch": _ev(f.batch, T("small_batch"), "info"),
        "amp": f.amp_setting,
    }
    return [finding(f, "memory_bound", evidence, levers, why, gain=_NO_OOM_GAIN, candidate=None)]


def memory_bound_host(f: Facts) -> list:
    """CPU-only runs: host RAM instead of GPU memory."""
    if f.gpu or f.memory_share is not None:
        return []
    if f.ram_available_mb is None or not f.ram_total_mb:
        return [NotEvaluated("memory_bound", "no GPU and no host RAM readings")]
    if f.ram_available_mb / f.ram_total_mb >= T("ram_low_share"):
        return []
    if f.cache == "ram":
        change, why = f"stages.{f.stage}.cache: disk", "the RAM image cache is what fills host memory"
    elif f.workers:
        change, why = f"stages.{f.stage}.workers: {f.workers // 2}", "each loader worker holds its own batches"
    else:
        change, why = f"stages.{f.stage}.batch: {max(1, (f.batch or 2) // 2)}", "host memory is full (CPU run)"
    evidence = {
        "ram_available_min_share": _ev(f.ram_available_mb / f.ram_total_mb, T("ram_low_share"), "<"),
        "peak_rss_mb": _ev(f.peak_rss_mb, None, "info"),
    }
    why += "; judged on host RAM: no GPU in this run"
    return [finding(f, "memory_bound", evidence, [change], why, gain=_NO_OOM_GAIN, candidate=None)]


def data_loading_bound(f: Facts) -> list:
    """Decided by the data wait alone; the change: more workers on a free core, else a cache, else (GPU runs) a
    smaller image. On a CPU-only run the loader shares the cores with the training: when the training keeps them
    busy and the images are cached, no loader setting frees time, and a smaller image shrinks the training too."""
    if f.data_wait_share is None:
        return [NotEvaluated("data_loading_bound", "no batch timings")]
    if not f.waits_on_data:
        return []
    workers, cache = more_workers(f), cache_change(f)
    if workers is not None:
        levers = [f"stages.{f.stage}.workers: {workers}", *([cache] if cache else [])]
        why = "the loader starves the step and a core is free"
    elif cache:
        levers, why = [cache], "the CPUs are busy (or workers are at the cap): skip JPEG decoding by caching"
    elif f.gpu and f.img:
        levers = [smaller_img(f)]
        why = "the CPUs are saturated and the images are already cached: less augmentation/resize work per image"
    else:
        reason = (
            f"data wait {100 * f.data_wait_share:.1f} % of the step, but on this CPU-only run the loading shares the "
            f"{f.cores} core(s) with the training ({f.threads} torch thread(s), {f.workers} loader worker(s), CPU "
            f"{f.cpu_util if f.cpu_util is None else round(f.cpu_util)} %) and the images are already cached: no core "
            "is free for a loader worker and no decoding is left to skip, so no loader setting frees time"
        )
        return [NotEvaluated("data_loading_bound", reason)]
    evidence = {
        "data_wait_share": _ev(f.data_wait_share, T("data_wait_share"), ">"),
        "data_wait_share_all_epochs": _ev(f.data_wait_share_all, T("data_wait_share"), ">"),
        "cpu_util_mean_pct": _ev(f.cpu_util, T("cpu_busy_pct"), "info"),
        "workers": _ev(f.workers, f.cores // f.gpus if f.cores else None, "info"),
        **({"gpu_util_p50_pct": _ev(f.gpu_util, T("gpu_util_low_pct"), "info")} if f.gpu else {}),
        **(cache_evidence(f) if levers[0] == cache else {}),
    }
    why += "" if f.gpu else "; judged on CPU-side evidence only (no GPU in this run)"
    share = f.data_wait_share * f.train_share
    gain = _gain(1 / (1 - f.data_wait_share), share, "upper bound: the step stops waiting for data")
    return [finding(f, "data_loading_bound", evidence, levers, why, share=share, gain=gain)]


def batch_too_small(f: Facts) -> list:
    """A bigger batch, only when a measurement at it was faster (low utilisation alone is the host-bound class)."""
    if f.cpu_only:
        return [NotEvaluated("batch_too_small", f"needs GPU utilisation; no GPU ({f.gpu_reason})")]
    if f.gpu_util is None:
        return [NotEvaluated("batch_too_small", "no GPU utilisation samples")]
    if f.waits_on_data or not f.batch:  # low utilisation explained by the loader
        return []
    support = _batch_support(f)
    if support is None:
        batch = bigger_batch(f)
        if (f.gpu_low_util or _memory_headroom(f)) and batch > f.batch:
            reason = (
                f"GPU util p50 {f.gpu_util:.0f} %, but no measurement shows a bigger batch faster; "
                f"stages.{f.stage}.tune: true measures batch {batch} before advising it"
            )
            return [NotEvaluated("batch_too_small", reason)]
        return []
    batch, speedup, source = support
    evidence = {
        "gpu_util_p50_pct": _ev(f.gpu_util, T("gpu_util_low_pct"), "<" if f.gpu_low_util else "info"),
        "measured_speedup": _ev(speedup, 1 + T("min_measured_gain"), ">="),
        "data_wait_share": _ev(f.data_wait_share, T("data_wait_share"), "<="),
        "batch": _ev(f.batch, f.nominal_batch, "info"),
    }
    why = f"batch {batch} measured {speedup:.2f}x the images/s of batch {f.batch} ({source})"
    gain = _gain(speedup, basis=f"measured: batch {batch} vs {f.batch}", measured_by=source)
    idle = (1 - f.gpu_util / 100) * f.train_share
    change = [f"stages.{f.stage}.batch: {batch}"]
    return [finding(f, "batch_too_small", evidence, change, why, share=idle, key="measured_speedup", gain=gain)]


def host_bound_step(f: Facts) -> list:
    """GPU idle while the loader keeps up and no measurement supports a bigger batch: the host side of the step sets
    the pace. The change is a measurement (tune), whose candidate is the bigger batch."""
    if f.cpu_only or not f.gpu_low_util or not f.batch or f.data_wait_share is None:
        return []
    if f.data_wait_share > T("data_wait_share") or _batch_support(f):
        return []
    batch = bigger_batch(f)
    bigger = batch > f.batch
    step_share = 1 - f.data_wait_share  # the main process is inside its own step the rest of the time
    idle = (1 - f.gpu_util / 100) * f.train_share
    evidence = {
        "gpu_util_p50_pct": _ev(f.gpu_util, T("gpu_util_low_pct"), "<"),
        "main_process_step_share": _ev(step_share, round(1 - T("data_wait_share"), 4), ">="),
        "data_wait_share": _ev(f.data_wait_share, T("data_wait_share"), "<="),
        "batch": _ev(f.batch, f.nominal_batch, "info"),
    }
    why = (
        f"the GPU idles {100 - f.gpu_util:.0f} % of the time while the main process spends {100 * step_share:.0f} % "
        "of it inside its own step: the host side of the step (Python, kernel launches, syncs; yolov5's "
        "deterministic mode, EMA update) sets the pace. More workers do not help, and a bigger batch only if a "
        "measurement says so" + (f": tune measures batch {batch}" if bigger else "")
    )
    levers = [f"stages.{f.stage}.tune: true"]
    if bigger:
        levers.append(f"measure stages.{f.stage}.batch: {batch} (tune) before using it")
    gain = _gain(None, idle, "upper bound: the GPU's idle share of training; no config change is known to recover it")
    candidate = {"batch": batch} if bigger else None
    return [finding(f, "host_bound_step", evidence, levers, why, share=idle, gain=gain, candidate=candidate)]


def _val_stall(f: Facts, share: float):
    """(the val_period change, the share of the loop it saves), or why none saves anything."""
    if "val_period" in f.defining:
        return NotEvaluated(
            "periodic_stalls", f"val takes {100 * share:.0f} % of the epoch loop; {f.defining['val_period']}"
        )
    validated = [e for e in f.epoch_rows if e.get("validated")] or f.epoch_rows
    val_s = sum(e["val_s"] for e in validated) / len(validated)
    rest_s = sum(e["train_s"] + e["checkpoint_s"] + e["logging_s"] for e in f.epoch_rows) / len(f.epoch_rows)
    now, epochs, target = f.val_period, f.epochs, T("val_target_share")
    if rest_s > 0 and epochs >= 2:  # the smallest period > now that brings validation near val_target_share
        period = min(max(now + 1, math.ceil(val_s * (1 - target) / (target * rest_s))), epochs)
        skipped = validations(now, epochs) - validations(period, epochs)
        if skipped > 0:  # measured: the validations the new period skips, at this stage's mean validation time
            return f"stages.{f.stage}.val_period: {period}", skipped * val_s / f.loop_s
    return NotEvaluated(
        "periodic_stalls",
        f"val takes {100 * share:.0f} % of the epoch loop, but the {epochs}-epoch stage already validates only "
        f"{validations(now, epochs)} time(s), the last of which always runs",
    )


def _checkpoint_stall(f: Facts, share: float):
    if f.nosave:  # advice it already follows saves nothing
        return NotEvaluated(
            "periodic_stalls",
            f"checkpoints take {100 * share:.0f} % of the epoch loop, but nosave is already on (the one save at the "
            "end remains)",
        )
    return f"stages.{f.stage}.nosave: true", share


def _logging_stall(f: Facts, share: float):
    if f.plots is not False:
        return f"stages.{f.stage}.plots: false", share
    return (
        "log to local TensorBoard only: uninstall or disable wandb/clearml/comet_ml (e.g. WANDB_MODE=disabled)",
        share,
    )


STALLS = {"val": _val_stall, "checkpoint": _checkpoint_stall, "logging": _logging_stall}


def periodic_stalls(f: Facts) -> list:
    """Validation, checkpoint or logging over their share of the epoch loop; advice only where it saves time."""
    if f.loop_s <= 0:
        return [NotEvaluated("periodic_stalls", "no epoch timings")]
    shares = {k: f.loop[k] / f.loop_s for k in STALLS}
    outcomes = {k: STALLS[k](f, shares[k]) for k in STALLS if shares[k] > T(f"{k}_share")}
    skipped = [o for o in outcomes.values() if isinstance(o, NotEvaluated)]
    advice = {k: o for k, o in outcomes.items() if not isinstance(o, NotEvaluated)}
    if not advice:
        return skipped
    worst = max(advice, key=shares.get)
    levers = [advice[worst][0]] + [change for k, (change, _) in advice.items() if k != worst]
    evidence = {
        f"{k}_share": _ev(shares[k], T(f"{k}_share"), ">" if shares[k] > T(f"{k}_share") else "<=") for k in STALLS
    }
    why = f"{worst} takes {100 * shares[worst]:.0f} % of the epoch loop"
    basis = f"measured {worst} share of the epoch loop, times the share of it the change removes"
    gain = _gain(None, advice[worst][1], basis)
    addressable = sum(shares[k] for k in advice)
    return skipped + [
        finding(f, "periodic_stalls", evidence, levers, why, share=addressable, key=f"{worst}_share", gain=gain)
    ]


def slow_first_epoch(f: Facts) -> list:
    overhead = f.first_epoch_overhead
    if overhead is None:
        return [NotEvaluated("slow_first_epoch", f.first_epoch_reason or "unknown")]
    if overhead <= T("first_epoch_overhead"):
        return []
    change = cache_change(f)
    if not change:
        return [
            NotEvaluated(
                "slow_first_epoch",
                f"first epoch {overhead:.2f}x steady, but images are already cached ({f.cache}): engine warm-up, "
                "no config change",
            )
        ]
    saves = (overhead - 1) * f.steady_epoch_s / f.loop_s if f.loop_s else None
    evidence = {"first_epoch_overhead": _ev(overhead, T("first_epoch_overhead"), ">"), **cache_evidence(f)}
    why = "the first pass decodes every image from disk; a cache pays that once, in setup"
    gain = _gain(None, saves, "the first epoch's extra time over a steady epoch")
    return [finding(f, "slow_first_epoch", evidence, [change], why, share=saves, gain=gain)]


def batch_reduced_after_oom(f: Facts) -> list:
    """The stage finished only after out-of-memory retries: say so, and make the working batch the config's, so the
    next run does not pay for the failed attempts again."""
    if not f.oom_attempts:
        return []
    evidence = {
        "oom_attempts": len(f.oom_attempts),
        "batch_that_failed": f.oom_attempts[0].get("batch"),
        "batch_used": f.batch,
    }
    levers = [f"stages.{f.stage}.batch: {f.batch}", f"stages.{f.stage}.amp: true", smaller_img(f)]
    why = "CUDA ran out of memory at the configured batch; each retry halved it"
    return [
        finding(
            f, "batch_reduced_after_oom", evidence, levers, why, key="oom_attempts", gain=_NO_OOM_GAIN, candidate=None
        )
    ]


def healthy(f: Facts) -> dict:
    evidence = {"data_wait_share": _ev(f.data_wait_share, T("data_wait_share"), "<=")}
    if f.gpu:
        evidence["gpu_util_p50_pct"] = _ev(f.gpu_util, T("gpu_util_low_pct"), ">=")
        evidence["peak_memory_share"] = _ev(f.memory_share, T("memory_high_share"), "<=")
    evidence["first_epoch_overhead"] = _ev(f.first_epoch_overhead, T("first_epoch_overhead"), "<=")
    return finding(f, "healthy", evidence, ["none"], "no class crossed its threshold", gain=_gain(basis="none"))


# In this order: a class's not-evaluated reasons are listed in it, and equally important findings keep it.
RULES = (
    memory_bound_gpu,
    memory_bound_host,
    data_loading_bound,
    batch_too_small,
    host_bound_step,
    periodic_stalls,
    slow_first_epoch,
    batch_reduced_after_oom,
)


def diagnose(timing: dict, stage: str | None = None, measured: dict | None = None, plan: dict | None = None):
    """Classify a timing dict (timing.json). Returns Findings, most important first: out-of-memory risks, then by the
    share of the epoch loop the change can address; [healthy] when no class fires.

    ``measured``: throughput at other settings of this stage (see measured_batch_rates); a bigger batch is advised
    only with such a measurement (or a tune trial recorded in timing["tune"]). ``plan``: the stage's plan
    (stage.json), which tells the settings that define the stage (defining_settings); without it, neither the image
    size nor the frozen layers are ever advised."""
    f = read_facts(timing, stage, measured, plan)
    outcomes = [outcome for rule in RULES for outcome in rule(f)]
    found = [o for o in outcomes if not isinstance(o, NotEvaluated)]
    found.sort(key=lambda x: (x["code"] not in FIRST, -(x["addressable_share"] or 0.0)))
    context = {
        "gpu": f.gpu,
        "gpu_reason": f.gpu_reason,
        "loop_s": round(f.loop_s, 4),
        "tune": timing.get("tune"),
        "defining_settings": f.defining,
    }
    skipped = [o._asdict() for o in outcomes if isinstance(o, NotEvaluated)]
    return Findings(found or [healthy(f)], stage=f.stage, not_evaluated=skipped, context=context)


# ---- output ------------------------------------------------------------------------------------------------------


def verdict_line(stage, findings) -> str:
    """One line for the log: the bottleneck (first finding), its evidence and the change; then every other advised
    change that costs more than speed (resume, what is trained), so no such cost hides below the headline."""
    stage = stage or "<stage>"
    if not findings or findings[0]["code"] == "healthy":
        return f"[{stage}] healthy: no bottleneck above thresholds"
    f = findings[0]
    key = f.get("key_metric")
    ev = f["evidence"].get(key)
    evs = ""
    if isinstance(ev, dict) and ev.get("value") is not None and ev.get("threshold") is not None:
        evs = f" ({key} {ev['value']:.3g} {ev['op']} {ev['threshold']:g})"
    cost = f"; {f['trade_off']['summary']}" if f.get("trade_off") else ""
    costly = _costly_advice(findings)
    costs = f"; also advised at a cost: {', '.join(costly)}" if costly else ""
    more = f"; +{len(findings) - 1} more" if len(findings) > 1 else ""
    return f"[{stage}] bottleneck: {f['title']}{evs} -> {f['change']} ({_verification(f)}{cost}){costs}{more}"


def _costly_advice(findings) -> list[str]:
    """Every advised change with a trade-off but the top finding's own change, as ``setting: value (cost)``."""
    changes = list(findings[0]["also"]) + [c for x in findings[1:] for c in (x["change"], *x["also"])]
    # an "also" already carries its cost in brackets: strip it, so each change is named once
    bare = [f"{head}: {value.split(' (')[0]}" for head, _key, value in map(_setting, changes)]
    return list(dict.fromkeys(_with_trade_off(change) for change in bare if trade_off_of(change)))


def _verification(f) -> str:
    if f.get("verified"):
        return f"verified: {f['expected_gain']['measured_by']}"
    return "unverified"


def gain_text(f) -> str:
    """``x1.25 images/s; saves <= 12 % of the epoch loop (basis)``, or the basis alone."""
    g = f.get("expected_gain") or {}
    parts = []
    if g.get("speedup"):
        parts.append(f"x{g['speedup']:.2f} images/s")
    if g.get("saves_share") is not None:
        parts.append(f"saves {'' if g.get('measured_by') else '<= '}{100 * g['saves_share']:.0f} % of the epoch loop")
    return "; ".join(parts + [f"({g.get('basis')})"]) if parts else g.get("basis", "")


def tune_markdown(tune: dict | None) -> list[str]:
    """The tune section: every trial's settings and steady images/s, before and after, and what was kept."""
    if not tune:
        return [
            "## Tune",
            "",
            "Not run: the advice above is unverified (set `stages.<stage>.tune: true` to measure "
            "the top advice on the real stage settings before training).",
            "",
        ]
    lines = [
        "## Tune",
        "",
        f"{tune.get('summary', '')}",
        "",
        "| trial | settings | steady images/s | vs baseline | kept |",
        "|---|---|---:|---:|---|",
    ]
    base = _num(tune.get("baseline_images_per_s"))
    for tr in tune.get("trials") or []:
        ips = _num(tr.get("images_per_s"))
        ratio = f"x{ips / base:.2f}" if ips and base else "n/a"
        settings = ", ".join(f"{k}={v}" for k, v in (tr.get("settings") or {}).items())
        lines.append(f"| {tr.get('name')} | {settings} | {_fmt_num(ips)} | {ratio} | {tr.get('kept', '')} |")
    return lines + ["", f"Tune cost: {_fmt_num(_num(tune.get('seconds')))} s.", ""]


def _fmt_num(x) -> str:
    return "n/a" if x is None else f"{x:.4g}"


def diagnosis_markdown(findings: Findings) -> str:
    """diagnosis.md: the verdict, each finding (change, trade-off, gain, evidence), what was not evaluated, tune."""
    d = findings.to_dict()
    lines = [f"# Diagnosis: {d['stage']}", "", d["verdict"], ""]
    for i, f in enumerate(d["findings"], 1):
        lines += (
            [f"## {i}. {f['title']} (`{f['code']}`)", "", f"**Change:** `{f['change']}` ({_verification(f)})", ""]
            + ([f"Trade-off: {f['trade_off']['detail']}", ""] if f.get("trade_off") else [])
            + [f"Expected gain: {gain_text(f)}", ""]
        )
        lines += [f"- also: `{a}`" for a in f["also"]] + ([""] if f["also"] else [])
        lines += [f"Why: {f['why']}", "", "| evidence | value | threshold |", "|---|---:|---:|"]
        for k, v in f["evidence"].items():
            if isinstance(v, dict):
                thr = "" if v["threshold"] is None else f"{v['op']} {v['threshold']}"
                lines.append(f"| {k} | {v['value']} | {thr} |")
            else:
                lines.append(f"| {k} | {v} | |")
        lines.append("")
    if d["not_evaluated"]:
        lines += ["## Not evaluated", ""] + [f"- `{n['code']}`: {n['reason']}" for n in d["not_evaluated"]] + [""]
    lines += tune_markdown(d["context"].get("tune"))
    return "\n".join(lines)


def write_diagnosis(stage_dir, findings: Findings) -> dict:
    """Write diagnosis.json (findings, not evaluated, thresholds with sources) and diagnosis.md."""
    d = Path(stage_dir)
    d.mkdir(parents=True, exist_ok=True)
    out = {"json": d / "diagnosis.json", "md": d / "diagnosis.md"}
    out["json"].write_text(json.dumps(findings.to_dict(), indent=2))
    out["md"].write_text(diagnosis_markdown(findings))
    return out
