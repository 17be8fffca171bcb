"""Name a stage's bottleneck from its timing.json and say which config change to make.

Six classes plus healthy. Each finding carries its expected gain and whether a measurement verified it (a
``tune`` trial, see stagedyolo/tune.py); advice nobody measured is labelled "unverified". A bigger batch is advised
only when a measurement at that batch showed it faster: on an H200 at data-wait < 1 % the old "GPU idle -> bigger
batch" rule made every stage slower (the step on the host set the pace), which is the ``host_bound_step`` class.
Every threshold is in the THRESHOLDS table below, with its source; docs/timing.md
prints the same table. On CPU-only runs, classes that need GPU numbers are judged on CPU-side evidence only
(data-wait share, phase shares, host RAM) or reported as not evaluated: GPU values are never invented.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from stagedyolo.engine.train_module import YOLOV5_NOMINAL_BATCH
from stagedyolo.telemetry.summary import finite as _num

# name: (value, unit, source). ONE table: diagnose() reads nothing else.
THRESHOLDS: dict[str, tuple[float, str, str]] = {
    "data_wait_share": (
        0.05,
        "fraction of step time",
        "PyTorch profiler rule of thumb: data loading > 5 % of step time = input-bound",
    ),
    "gpu_util_low_pct": (
        50.0,
        "% (NVML p50, training window)",
        "PyTorch profiler rule of thumb: GPU utilisation < 50 % = use a bigger batch (issue 12: only when measured)",
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
        "issue 12: a change is kept (tune) or a bigger batch advised only when measured this much faster",
    ),
    "nominal_batch": (
        YOLOV5_NOMINAL_BATCH,
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


def T(name):
    return THRESHOLDS[name][0]


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


def _int(x):
    v = _num(x)
    return int(v) if v is not None else None


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


def _finding(
    code, evidence, change, why, also=(), addressable_share=None, key_metric=None, gain=None, candidate="from change"
):
    """``candidate``: the change as stage settings ({"workers": 8}) a tune trial can run; None when a short
    training window cannot measure it (validation, checkpoints, memory)."""
    cls, title = CLASSES[code]
    if key_metric is None:  # the first piece of evidence that crossed its threshold
        key_metric = next((k for k, v in evidence.items() if isinstance(v, dict) and v.get("op") in ("<", ">")), None)
    return {
        "code": code,
        "class": cls,
        "title": title,
        "key_metric": key_metric,
        "evidence": evidence,
        "change": change,
        "trade_off": trade_off_of(change),
        "also": [_with_trade_off(a) for a in also],
        "why": why,
        "addressable_share": None if addressable_share is None else round(max(addressable_share, 0.0), 4),
        "expected_gain": gain or _gain(basis="no speed estimate"),
        "candidate": candidate_of(change) if candidate == "from change" else candidate,
        "verified": bool(gain and gain.get("measured_by")),
    }


def _amp_on(amp) -> bool | None:
    if isinstance(amp, bool):
        return amp
    if isinstance(amp, str) and amp.lower() in ("true", "false"):
        return amp.lower() == "true"
    return None


def _round32(x) -> int:
    return max(32, int(x) // 32 * 32)


def _cache_estimate_mb(t) -> float | None:
    """Decoded-image RAM for --cache ram: images * img^2 * 3 bytes (yolov5 caches images resized to img)."""
    img = _num(t["config"].get("img"))
    ims = [e["images"] for e in t["epochs"] if e.get("images")]
    if not img or not ims:
        return None
    return max(ims) * img * img * 3 / 2**20


def _cache_change(stage, t) -> tuple[str | None, dict]:
    """ram when the estimate fits in the available RAM (minus the margin), else disk; None when already cached."""
    cache = (t["config"].get("cache") or "").lower()
    est = _cache_estimate_mb(t)
    avail = _num(t["cpu"].get("ram_available_min_mb"))
    ev = {
        "cache_estimate_mb": _ev(est, None, "info"),
        "ram_available_min_mb": _ev(avail, None, "info"),
        "cache": cache or None,
    }
    fits = est is not None and avail is not None and est < (1 - T("ram_cache_margin")) * avail
    if cache == "ram":
        return None, ev
    if fits:
        return f"stages.{stage}.cache: ram", ev
    if cache == "disk":
        return None, ev
    return f"stages.{stage}.cache: disk", ev


def _bigger_batch(batch, mem_share, nominal, gpus, cap_at_nominal) -> int:
    """The batch a trial would try: x2, or up to x4 while the peak stays <= memory_target_share."""
    factor = 2
    if mem_share:
        factor = min(2 ** int(math.floor(math.log2(max(T("memory_target_share") / mem_share, 1.0)))), 4)
    nb = batch * max(factor, 1)
    if cap_at_nominal:
        nb = min(nb, nominal)
    return nb // gpus * gpus


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


def _batch_support(rates, batch) -> tuple[int, float, str] | None:
    """(bigger batch, speedup, source) when a bigger batch measured >= min_measured_gain faster than ``batch``."""
    if batch not in rates:
        return None
    base = rates[batch][0]
    best = max((b for b in rates if b > batch), key=lambda b: rates[b][0], default=None)
    if best is None or rates[best][0] < base * (1 + T("min_measured_gain")):
        return None
    return best, rates[best][0] / base, rates[best][1]


_NO_OOM_GAIN = {
    "speedup": None,
    "saves_share": None,
    "basis": "avoids running out of memory (and its retries)",
    "measured_by": None,
}
TRIALABLE_KEYS = ("workers", "batch", "cache", "amp")  # what a short training window can measure


# Changes that cost something besides speed: a finding may still advise one (for full memory or a saturated loader
# a smaller image is the lever left; for checkpoint stalls, nosave), but says what it costs, in a few words for the
# verdict line and in full for diagnosis.md and the report. tune tries neither (not trialable).
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


def _setting(change: str) -> tuple[str, str, str]:
    """``stages.S.workers: 8`` -> ("stages.S.workers", "workers", "8")."""
    head, _, value = change.partition(": ")
    return head, head.rsplit(".", 1)[-1], value


def trade_off_of(change: str) -> dict | None:
    """What ``change`` costs besides speed, {"summary", "detail"} (TRADE_OFFS), or None."""
    head, key, _value = _setting(change)
    if not head.startswith("stages.") or key not in TRADE_OFFS:
        return None
    summary, detail = TRADE_OFFS[key]
    return {"summary": summary, "detail": detail}


def _with_trade_off(change: str) -> str:
    """``change``, followed by its trade-off's summary in brackets when it has one."""
    trade_off = trade_off_of(change)
    return f"{change} ({trade_off['summary']})" if trade_off else change


def candidate_of(change: str) -> dict | None:
    """``stages.S.workers: 8`` -> {"workers": 8} when a tune trial can measure it, else None."""
    head, key, value = _setting(change)
    if not head.startswith("stages.") or key not in TRIALABLE_KEYS or not value:
        return None
    value = value.split()[0]
    if value.isdigit():
        return {key: int(value)}
    return {key: {"true": True, "false": False}.get(value, value)}


def validations(period: int, epochs: int) -> int:
    """In-loop validations of an ``epochs``-epoch stage at ``val_period`` (engine.hooks.ValidationSchedule)."""
    return sum(1 for e in range(1, epochs + 1) if e % max(period, 1) == 0 or e == epochs)


def _better_val_period(val_s, rest_s, epochs, now) -> int | None:
    """The smallest period > now that brings validation near val_target_share of the loop; None if none helps."""
    if rest_s <= 0 or epochs < 2:
        return None
    tgt = T("val_target_share")
    n = min(max(now + 1, math.ceil(val_s * (1 - tgt) / (tgt * rest_s))), epochs)
    return n if validations(n, epochs) < validations(now, epochs) else None


def _loop(t):
    eps = t["epochs"]
    tot = {k: sum(e[k] for e in eps) for k in ("train_s", "val_s", "checkpoint_s", "logging_s")}
    return tot, sum(tot.values())


def _batch_or_host(found, skipped, stage, *, rates, util_p50, mem_share, batch, nominal, gpus, dws, train_frac):
    """GPU idle while the loader keeps up: a bigger batch when a measurement showed it faster (batch_too_small),
    else the host-bound class, whose tune candidate is that bigger batch."""
    low_util = util_p50 < T("gpu_util_low_pct")
    headroom = (
        mem_share is not None
        and mem_share < T("memory_headroom_share")
        and util_p50 < T("gpu_util_busy_pct")
        and batch < nominal
    )
    nb = _bigger_batch(batch, mem_share, nominal, gpus, cap_at_nominal=headroom and not low_util)
    idle_share = (1 - util_p50 / 100) * train_frac
    support = _batch_support(rates, batch)
    if support:
        nb, speedup, source = support
        found.append(
            _finding(
                "batch_too_small",
                {
                    "gpu_util_p50_pct": _ev(util_p50, T("gpu_util_low_pct"), "<" if low_util else "info"),
                    "measured_speedup": _ev(speedup, 1 + T("min_measured_gain"), ">="),
                    "data_wait_share": _ev(dws, T("data_wait_share"), "<="),
                    "batch": _ev(batch, nominal, "info"),
                },
                f"stages.{stage}.batch: {nb}",
                f"batch {nb} measured {speedup:.2f}x the images/s of batch {batch} ({source})",
                addressable_share=idle_share,
                key_metric="measured_speedup",
                gain=_gain(speedup, basis=f"measured: batch {nb} vs {batch}", measured_by=source),
            )
        )
        return
    if (low_util or headroom) and nb > batch:
        skipped.append(
            {
                "code": "batch_too_small",
                "reason": (
                    f"GPU util p50 {util_p50:.0f} %, but no measurement shows a bigger batch faster; "
                    f"stages.{stage}.tune: true measures batch {nb} before advising it"
                ),
            }
        )
    if not low_util or dws is None:
        return
    step_share = 1 - dws  # the main process is inside its own step the rest of the time
    found.append(
        _finding(
            "host_bound_step",
            {
                "gpu_util_p50_pct": _ev(util_p50, T("gpu_util_low_pct"), "<"),
                "main_process_step_share": _ev(step_share, round(1 - T("data_wait_share"), 4), ">="),
                "data_wait_share": _ev(dws, T("data_wait_share"), "<="),
                "batch": _ev(batch, nominal, "info"),
            },
            f"stages.{stage}.tune: true",
            f"the GPU idles {100 - util_p50:.0f} % of the time while the main process spends "
            f"{100 * step_share:.0f} % of it inside its own step: the host side of the step (Python, kernel "
            "launches, syncs; yolov5's deterministic mode, EMA update) sets the pace. More workers do not help, "
            "and a bigger batch only if a measurement says so" + (f": tune measures batch {nb}" if nb > batch else ""),
            also=[f"measure stages.{stage}.batch: {nb} (tune) before using it"] if nb > batch else [],
            addressable_share=idle_share,
            gain=_gain(
                None,
                idle_share,
                "upper bound: the GPU's idle share of training; no config change is known to recover it",
            ),
            candidate={"batch": nb} if nb > batch else None,
        )
    )


def _periodic_stalls(found, skipped, stage, t, tot, loop):
    """Validation, checkpoint or logging over their share of the epoch loop; advice only where it saves time."""
    cfg = t["config"]
    shares = {k: tot[f"{k}_s"] / loop for k in ("val", "checkpoint", "logging")}
    over = [k for k in ("val", "checkpoint", "logging") if shares[k] > T(f"{k}_share")]
    if not over:
        return
    changes, saves = {}, dict(shares)
    eps = t["epochs"]
    validated = [e for e in eps if e.get("validated")] or eps
    v = sum(e["val_s"] for e in validated) / len(validated)
    rest = sum(e["train_s"] + e["checkpoint_s"] + e["logging_s"] for e in eps) / len(eps)
    epochs = _int(cfg.get("epochs")) or len(eps)
    if "val" in over:
        now = _int(cfg.get("val_period")) or 1
        n = _better_val_period(v, rest, epochs, now)
        # measured: the validations the new period skips, at this stage's mean validation time
        saves["val"] = (validations(now, epochs) - validations(n, epochs)) * v / loop if n else 0.0
        if saves["val"] > 0:
            changes["val"] = f"stages.{stage}.val_period: {n}"
        else:
            over.remove("val")
            skipped.append(
                {
                    "code": "periodic_stalls",
                    "reason": (
                        f"val takes {100 * shares['val']:.0f} % of the epoch loop, but the {epochs}-epoch stage "
                        f"already validates only {validations(now, epochs)} time(s), the last of which always runs"
                    ),
                }
            )
    if "checkpoint" in over and cfg.get("nosave") is True:  # advice it already follows saves nothing
        over.remove("checkpoint")
        skipped.append(
            {
                "code": "periodic_stalls",
                "reason": (
                    f"checkpoints take {100 * shares['checkpoint']:.0f} % of the epoch loop, but nosave is already "
                    "on (the one save at the end remains)"
                ),
            }
        )
    if "checkpoint" in over:
        changes["checkpoint"] = f"stages.{stage}.nosave: true"
    if "logging" in over:
        changes["logging"] = (
            f"stages.{stage}.plots: false"
            if cfg.get("plots") is not False
            else "log to local TensorBoard only: uninstall or disable wandb/clearml/comet_ml (e.g. WANDB_MODE=disabled)"
        )
    if not over:
        return
    worst = max(over, key=lambda k: shares[k])
    ev = {
        f"{k}_share": _ev(shares[k], T(f"{k}_share"), ">" if k in over else "<=")
        for k in ("val", "checkpoint", "logging")
    }
    found.append(
        _finding(
            "periodic_stalls",
            ev,
            changes[worst],
            f"{worst} takes {100 * shares[worst]:.0f} % of the epoch loop",
            also=[changes[k] for k in over if k != worst],
            addressable_share=sum(shares[k] for k in over),
            key_metric=f"{worst}_share",
            gain=_gain(
                None,
                saves[worst],
                f"measured {worst} share of the epoch loop, times the share of it the change removes",
            ),
        )
    )


def diagnose(timing: dict, stage: str | None = None, measured: dict | None = None) -> Findings:
    """Classify a timing dict (timing.json). Returns Findings, most important first; [healthy] when none fire.

    ``measured``: throughput measured at other settings of this stage (see measured_batch_rates); a bigger batch is
    advised only with such a measurement (or a tune trial recorded in timing["tune"])."""
    t = timing
    stage = stage or t.get("stage") or "<stage>"
    cfg, gpu, cpu, dw = t["config"], t["gpu"], t["cpu"], t["data_wait"]
    has_gpu = bool(gpu.get("available"))
    batch = _int(cfg.get("batch"))
    nominal = _int(cfg.get("nominal_batch")) or int(T("nominal_batch"))  # the stage's, else yolov5's 64
    workers = _int(cfg.get("workers"))
    gpus = max(_int(cfg.get("gpus")) or 1, 1)
    img = _int(cfg.get("img"))
    cores = _int(cpu.get("cores"))
    threads = _int(cfg.get("threads"))
    cpu_util = _num(cpu.get("util_mean_pct"))
    util_p50 = _num((gpu.get("util_pct") or {}).get("p50")) if has_gpu else None
    mem_share = _num(gpu.get("peak_memory_share")) if has_gpu else None
    if mem_share is None and _num(gpu.get("torch_peak_reserved_mb")) and _num(gpu.get("torch_total_mb")):
        mem_share = gpu["torch_peak_reserved_mb"] / gpu["torch_total_mb"]  # CUDA without NVML: torch's own figure
    tot, loop = _loop(t)
    train_frac = tot["train_s"] / loop if loop > 0 else None
    dws = _num(dw.get("steady_share"))
    if dws is None:
        dws = _num(dw.get("share"))
    found, skipped = [], []
    context = {"gpu": has_gpu, "gpu_reason": gpu.get("reason"), "loop_s": round(loop, 4), "tune": t.get("tune")}

    # 3 memory-bound ---------------------------------------------------------------------------------------
    if has_gpu or mem_share is not None:
        if mem_share is None:
            skipped.append({"code": "memory_bound", "reason": "no GPU memory reading (neither NVML nor torch)"})
        elif mem_share > T("memory_high_share"):
            amp = _amp_on(cfg.get("amp"))
            if amp is not True:
                change, why = f"stages.{stage}.amp: true", "fp16 activations roughly halve activation memory"
            elif batch is not None and batch > T("small_batch"):
                nb = max(gpus, batch // 2 // gpus * gpus)
                change, why = f"stages.{stage}.batch: {nb}", "AMP is already on and the batch is large: halve it"
            elif img is not None and img > 64:
                change = f"stages.{stage}.img: {_round32(img * 0.75)}"
                why = "AMP is on and the batch is already small: the image (or the model) is too big for this GPU"
            else:
                change, why = f"stages.{stage}.batch: {max(gpus, (batch or 2) // 2)}", "memory is full"
            found.append(
                _finding(
                    "memory_bound",
                    {
                        "peak_memory_share": _ev(mem_share, T("memory_high_share"), ">"),
                        "batch": _ev(batch, T("small_batch"), "info"),
                        "amp": cfg.get("amp"),
                    },
                    change,
                    why,
                    also=["a smaller model (model.cfg), e.g. yolov5n.yaml"] if amp else [],
                    gain=_NO_OOM_GAIN,
                    candidate=None,
                )
            )
    else:
        avail, total = _num(cpu.get("ram_available_min_mb")), _num(cpu.get("ram_total_mb"))
        if avail is None or not total:
            skipped.append({"code": "memory_bound", "reason": "no GPU and no host RAM readings"})
        elif avail / total < T("ram_low_share"):
            cache = (cfg.get("cache") or "").lower()
            if cache == "ram":
                change, why = f"stages.{stage}.cache: disk", "the RAM image cache is what fills host memory"
            elif workers:
                change, why = f"stages.{stage}.workers: {workers // 2}", "each loader worker holds its own batches"
            else:
                change, why = f"stages.{stage}.batch: {max(1, (batch or 2) // 2)}", "host memory is full (CPU run)"
            found.append(
                _finding(
                    "memory_bound",
                    {
                        "ram_available_min_share": _ev(avail / total, T("ram_low_share"), "<"),
                        "peak_rss_mb": _ev(_num(cpu.get("peak_rss_mb")), None, "info"),
                    },
                    change,
                    why + "; judged on host RAM: no GPU in this run",
                    gain=_NO_OOM_GAIN,
                    candidate=None,
                )
            )

    # 1 data-loading bound ---------------------------------------------------------------------------------
    data_bound = dws is not None and dws > T("data_wait_share")
    if dws is None:
        skipped.append({"code": "data_loading_bound", "reason": "no batch timings"})
    elif data_bound:
        max_workers = (cores // gpus) if cores else None  # yolov5 caps workers at cpu_count // n_gpu
        spare = None
        if cores is not None and cpu_util is not None:
            spare = cores * (1 - cpu_util / 100.0)
        busy = cpu_util is not None and cpu_util > T("cpu_busy_pct")
        ev = {
            "data_wait_share": _ev(dws, T("data_wait_share"), ">"),
            "cpu_util_mean_pct": _ev(cpu_util, T("cpu_busy_pct"), "info"),
            "workers": _ev(workers, max_workers, "info"),
        }
        if has_gpu:
            ev["gpu_util_p50_pct"] = _ev(util_p50, T("gpu_util_low_pct"), "info")
        cache_change, cev = _cache_change(stage, t)
        nw = None
        if workers is not None and max_workers is not None and workers < max_workers and not busy:
            nw = min(max_workers, max(workers * 2, workers + 1))
            change = f"stages.{stage}.workers: {nw}"
            why = (
                f"the loader starves the step and the CPUs have ~{spare:.1f} idle core(s)"
                if spare is not None
                else "the loader starves the step"
            )
            also = [cache_change] if cache_change else []
        elif cache_change:
            change, why = (
                cache_change,
                ("the CPUs are busy (or workers are at the cap): skip JPEG decoding by caching decoded images"),
            )
            also = []
            ev.update(cev)
        else:
            change = (
                f"stages.{stage}.img: {_round32((img or 640) * 0.75)}" if img else f"stages.{stage}.workers: {workers}"
            )
            why = "CPUs are saturated and images are already cached: less augmentation/resize work per image"
            also = []
        if not has_gpu:
            why += "; judged on CPU-side evidence only (no GPU in this run)"
            if nw is not None and threads and cores and threads + nw > cores:
                why += f" (note: {threads} torch thread(s) + {nw} workers exceed the {cores} cores)"
        found.append(
            _finding(
                "data_loading_bound",
                ev,
                change,
                why,
                also,
                addressable_share=dws * (train_frac or 1.0),
                gain=_gain(
                    1 / (1 - dws) if dws < 1 else None,
                    dws * (train_frac or 1.0),
                    "upper bound: the step stops waiting for data",
                ),
            )
        )

    # 2 batch too small / host-bound step -------------------------------------------------------------------
    if not has_gpu:
        skipped.append({"code": "batch_too_small", "reason": f"needs GPU utilisation; no GPU ({gpu.get('reason')})"})
    elif util_p50 is None:
        skipped.append({"code": "batch_too_small", "reason": "no GPU utilisation samples"})
    elif not data_bound and batch:
        _batch_or_host(
            found,
            skipped,
            stage,
            rates=measured_batch_rates(t, measured),
            util_p50=util_p50,
            mem_share=mem_share,
            batch=batch,
            nominal=nominal,
            gpus=gpus,
            dws=dws,
            train_frac=train_frac or 1.0,
        )

    # 4 periodic stalls ------------------------------------------------------------------------------------
    if loop <= 0:
        skipped.append({"code": "periodic_stalls", "reason": "no epoch timings"})
    else:
        _periodic_stalls(found, skipped, stage, t, tot, loop)

    # 5 slow first epoch -----------------------------------------------------------------------------------
    feo = _num(t.get("first_epoch_overhead"))
    if feo is None:
        skipped.append({"code": "slow_first_epoch", "reason": t.get("first_epoch_overhead_reason") or "unknown"})
    elif feo > T("first_epoch_overhead"):
        change, cev = _cache_change(stage, t)
        steady = _num(t["throughput"].get("steady_epoch_train_s")) or 0.0
        if change:
            found.append(
                _finding(
                    "slow_first_epoch",
                    {"first_epoch_overhead": _ev(feo, T("first_epoch_overhead"), ">"), **cev},
                    change,
                    "the first pass decodes every image from disk; a cache pays that once, in setup",
                    addressable_share=((feo - 1) * steady / loop) if loop else None,
                    gain=_gain(
                        None,
                        ((feo - 1) * steady / loop) if loop else None,
                        "the first epoch's extra time over a steady epoch",
                    ),
                )
            )
        else:
            skipped.append(
                {
                    "code": "slow_first_epoch",
                    "reason": f"first epoch {feo:.2f}x steady, but images are "
                    f"already cached ({cfg.get('cache')}): engine warm-up, no config change",
                }
            )

    ooms = [a for a in t.get("attempts") or [] if a.get("status") == "oom"]
    if ooms:
        # The stage finished only after out-of-memory retries: say so, and make the working batch the config's,
        # so the next run does not pay for the failed attempts again.
        found.append(
            _finding(
                "batch_reduced_after_oom",
                {"oom_attempts": len(ooms), "batch_that_failed": ooms[0].get("batch"), "batch_used": batch},
                f"stages.{stage}.batch: {batch}",
                "CUDA ran out of memory at the configured batch; each retry halved it",
                also=[f"stages.{stage}.amp: true", f"stages.{stage}.img: {_round32((img or 64) * 0.75)}"],
                key_metric="oom_attempts",
                gain=_NO_OOM_GAIN,
                candidate=None,
            )
        )

    order = {"batch_reduced_after_oom": 0, "memory_bound": 0}
    found.sort(key=lambda f: (order.get(f["code"], 1), -(f["addressable_share"] or 0.0)))
    if not found:
        ev = {"data_wait_share": _ev(dws, T("data_wait_share"), "<=")}
        if has_gpu:
            ev["gpu_util_p50_pct"] = _ev(util_p50, T("gpu_util_low_pct"), ">=")
            ev["peak_memory_share"] = _ev(mem_share, T("memory_high_share"), "<=")
        ev["first_epoch_overhead"] = _ev(feo, T("first_epoch_overhead"), "<=")
        found.append(_finding("healthy", ev, "none", "no class crossed its threshold", gain=_gain(basis="none")))
    return Findings(found, stage=stage, not_evaluated=skipped, context=context)


def verdict_line(stage, findings) -> str:
    """One line for the log: the bottleneck (first finding), its evidence and the change."""
    findings = list(findings)
    stage = stage or "<stage>"
    if not findings or findings[0]["code"] == "healthy":
        return f"[{stage}] healthy: no bottleneck above thresholds"
    f = findings[0]
    key = f.get("key_metric")
    ev = f["evidence"].get(key) if key else None
    evs = ""
    if isinstance(ev, dict) and ev.get("value") is not None and ev.get("threshold") is not None:
        evs = f" ({key} {ev['value']:.3g} {ev['op']} {ev['threshold']:g})"
    more = f"; +{len(findings) - 1} more" if len(findings) > 1 else ""
    cost = f"; {f['trade_off']['summary']}" if f.get("trade_off") else ""
    return f"[{stage}] bottleneck: {f['title']}{evs} -> {f['change']} ({_verification(f)}{cost}){more}"


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


def diagnosis_markdown(findings) -> str:
    d = findings.to_dict() if isinstance(findings, Findings) else Findings(findings).to_dict()
    lines = [f"# Diagnosis: {d['stage']}", "", d["verdict"], ""]
    for i, f in enumerate(d["findings"], 1):
        lines += (
            [f"## {i}. {f['title']} (`{f['code']}`)", "", f"**Change:** `{f['change']}` ({_verification(f)})", ""]
            + ([f"Trade-off: {f['trade_off']['detail']}", ""] if f.get("trade_off") else [])
            + [f"Expected gain: {gain_text(f)}", ""]
        )
        for a in f["also"]:
            lines.append(f"- also: `{a}`")
        if f["also"]:
            lines.append("")
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


def write_diagnosis(stage_dir, findings) -> dict:
    """Write diagnosis.json (findings, not evaluated, thresholds with sources) and diagnosis.md."""
    if not isinstance(findings, Findings):
        findings = Findings(findings)
    d = Path(stage_dir)
    d.mkdir(parents=True, exist_ok=True)
    out = {"json": d / "diagnosis.json", "md": d / "diagnosis.md"}
    out["json"].write_text(json.dumps(findings.to_dict(), indent=2))
    out["md"].write_text(diagnosis_markdown(findings))
    return out


def thresholds_markdown() -> str:
    rows = ["| threshold | value | unit | source |", "|---|---:|---|---|"]
    rows += [f"| `{k}` | {v[0]:g} | {v[1]} | {v[2]} |" for k, v in THRESHOLDS.items()]
    return "\n".join(rows) + "\n"
