"""build_timing: turn the worker's raw timer record + the supervisor's telemetry.csv into timing.json / timing.md.

The schema is ``timing.schema.json`` next to this module (JSON Schema draft 2020-12) and is documented in
docs/timing.md. Torch-free and pandas-free (it runs in the supervisor).
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

from stagedyolo.jsonio import write_json
from stagedyolo.yolov5_facts import NOMINAL_BATCH, accumulate

# throughput.basis when the stage has steady epochs: the first epoch includes warm-up (loader start, caching).
STEADY_BASIS = "epochs after the first"

SCHEMA_VERSION = 1
SCHEMA_PATH = Path(__file__).with_name("timing.schema.json")
PHASES = ("setup", "train", "val", "checkpoint", "logging", "other")
MB = 1024 * 1024


def finite(x) -> float | None:
    """x as a float, or None when it is missing, not a number, NaN or infinite (never a made-up 0)."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def quantile(sorted_vals: list[float], q: float) -> float | None:
    """The q-quantile of already sorted values, interpolated linearly between neighbours; None when empty."""
    if not sorted_vals:
        return None
    k = (len(sorted_vals) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(sorted_vals) - 1)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (k - lo)


def _stats(vals) -> dict | None:
    vals = sorted(v for v in vals if v is not None)
    if not vals:
        return None
    return {
        "mean": round(sum(vals) / len(vals), 3),
        "p10": round(quantile(vals, 0.1), 3),
        "p50": round(quantile(vals, 0.5), 3),
        "p90": round(quantile(vals, 0.9), 3),
        "max": round(vals[-1], 3),
        "n": len(vals),
    }


def _readings(rows, column) -> list[float]:
    """The column's readings over rows; blank or non-finite cells are no reading, never a zero."""
    return [v for r in rows if (v := finite(r.get(column))) is not None]


def read_telemetry(path) -> tuple[list[str], list[dict]]:
    """Read telemetry.csv into (columns, rows as dicts of strings). Missing file -> ([], [])."""
    if path is None or not Path(path).exists():
        return [], []
    with open(path, newline="") as fh:
        r = csv.DictReader(fh)
        rows = list(r)
        return list(r.fieldnames or []), rows


def gpu_ids(columns) -> list[int]:
    return sorted({int(c[3:].split("_", 1)[0]) for c in columns if c.startswith("gpu") and c[3:4].isdigit()})


def cpu_ids(columns) -> list[int]:
    return sorted(int(c[3:-4]) for c in columns if c.startswith("cpu") and c.endswith("_pct") and c[3:-4].isdigit())


def _window(rows, start, end):
    """Samples inside the training window; all samples when the window is unknown or holds none."""
    if start is None:
        return rows, "all"
    end = end if end is not None else float("inf")
    w = [r for r in rows if (ts := finite(r.get("timestamp"))) is not None and start <= ts <= end]
    return (w, "train") if w else (rows, "all")


def _gpu_section(cols, rows, win_rows, window, memory: dict, meta: dict) -> dict:
    """Utilisation over the window, NVML memory peaks over every sample. Without utilisation readings ``reason`` says
    why (the sampler's last gpu_status) and every NVML figure is null, the memory share included; torch's own
    peaks (CUDA only) are measured by torch and stay."""
    per_gpu, pooled, nvml_shares = [], [], []
    for k in gpu_ids(cols):
        util = _readings(win_rows, f"gpu{k}_util_pct")
        peak = max(_readings(rows, f"gpu{k}_mem_used_mb"), default=None)
        total = max(_readings(rows, f"gpu{k}_mem_total_mb"), default=None)
        pooled += util
        if peak is not None and total:
            nvml_shares.append(peak / total)
        per_gpu.append(
            {
                "index": k,
                "util_pct": _stats(util),
                "nvml_peak_used_mb": peak,
                "nvml_total_mb": total,
                "power_w_mean": (_stats(_readings(win_rows, f"gpu{k}_power_w")) or {}).get("mean"),
            }
        )
    torch_total = memory.get("total_bytes")
    torch_alloc = memory.get("torch_max_allocated_bytes")
    torch_res = memory.get("torch_max_reserved_bytes")
    shares = nvml_shares if pooled else []
    if torch_res is not None and torch_total:
        shares.append(torch_res / torch_total)
    status = next((r["gpu_status"] for r in reversed(rows) if r.get("gpu_status")), None)
    status = status or ("no telemetry" if not rows else "no gpu_status column")

    def nvml_max(key):
        return max((g[key] for g in per_gpu if g[key] is not None), default=None) if pooled else None

    return {
        "available": bool(pooled),
        "reason": None if pooled else (status if status != "ok" else "GPU columns hold no readings"),
        "count": len(per_gpu),
        "names": list(meta.get("gpu_names") or []),
        "window": window,
        "util_pct": _stats(pooled),
        "per_gpu": per_gpu,
        "torch_peak_allocated_mb": round(torch_alloc / MB, 1) if torch_alloc is not None else None,
        "torch_peak_reserved_mb": round(torch_res / MB, 1) if torch_res is not None else None,
        "torch_total_mb": round(torch_total / MB, 1) if torch_total else None,
        "torch_memory_reason": memory.get("reason"),
        "nvml_peak_used_mb": nvml_max("nvml_peak_used_mb"),
        "nvml_total_mb": nvml_max("nvml_total_mb"),
        "peak_memory_share": round(max(shares), 4) if shares else None,
    }


def _cpu_section(cols, rows, win_rows) -> dict:
    cores = cpu_ids(cols)
    busy = []
    for r in win_rows:
        vals = [v for j in cores if (v := finite(r.get(f"cpu{j}_pct"))) is not None]
        if vals:
            busy.append(sum(vals) / 100.0)
    disk = _readings(win_rows, "disk_read_bytes")
    ms = _stats(_readings(win_rows, "cpu_mean_pct"))
    return {
        "cores": len(cores) or None,
        "util_mean_pct": ms["mean"] if ms else None,
        "util_p90_pct": ms["p90"] if ms else None,
        "busy_cores_mean": round(sum(busy) / len(busy), 3) if busy else None,
        "peak_rss_mb": max(_readings(rows, "rss_tree_mb"), default=None),
        "ram_total_mb": max(_readings(rows, "ram_total_mb"), default=None),
        "ram_available_min_mb": min(_readings(rows, "ram_available_mb"), default=None),
        "disk_read_mb": round((max(disk) - min(disk)) / MB, 3) if len(disk) > 1 else None,
    }


def effective_batch(batch, nominal_batch=None) -> int | None:
    """yolov5 accumulates gradients to the nominal batch (64 unless the stage sets nominal_batch): optimizer steps
    see batch * max(round(nominal/batch), 1)."""
    b = finite(batch)
    if not b or b <= 0:
        return None
    return int(b * accumulate(b, finite(nominal_batch) or NOMINAL_BATCH))


_SAMPLER_KEYS = ("gpu_status", "gpu_names", "nvml_indices", "interval_s", "samples", "sample_cpu_s", "errors")


def _sampler_info(meta: dict) -> dict | None:
    """Sampler.info() passed as meta["sampler"], or spread into meta (``**sampler.info()``)."""
    if isinstance(meta.get("sampler"), dict):
        return meta["sampler"]
    info = {k: meta[k] for k in _SAMPLER_KEYS if k in meta}
    return info or None


def _engine_section(meta: dict) -> dict | None:
    """The engine mode and the patch-table rows of the stage (stagedyolo.engine.patches), from the worker's outcome."""
    patches = meta.get("patches")
    if patches is None:
        return None
    return {
        "mode": meta.get("engine_mode"),
        "patches_applied": [p["name"] for p in patches if p["applied"]],
        "patches_not_applied": {p["name"]: p["reason"] for p in patches if not p["applied"]},
        "sync_every_batches": meta.get("sync_every_batches"),
        "compile": meta.get("compile"),
    }


def _sync_note(note: str | None, every) -> str | None:
    if note and every and int(every) > 1:
        return (
            f"{note}; but fast mode formats the loss only every {every} batches (sync_every_batches): batch "
            "compute between those is host enqueue time, and the wait for the GPU lands on the next synced batch"
        )
    return note


def image_cache_detail(loaders: list[dict] | None) -> dict:
    """setup_detail's image-cache fields from the worker's per-loader records (dataset.image_store)."""
    if not loaders:
        return {"cache_source": None, "cache_s": None, "cache_images_decoded": None, "cache_loaders": None}
    sources = {r.get("source") for r in loaders}
    return {
        "cache_source": sources.pop() if len(sources) == 1 else "mixed",
        "cache_s": round(sum(finite(r.get("seconds")) or 0.0 for r in loaders), 4),
        "cache_images_decoded": sum(int(r.get("decoded") or 0) for r in loaders),
        "cache_loaders": list(loaders),
    }


def build_timing(raw: dict | None, telemetry_csv=None, wall_s: float | None = None, meta: dict | None = None) -> dict:
    """Combine the raw timer record, the sampler CSV and the stage meta into the timing dict (see the schema).

    ``raw``: ``StageTimer.raw()`` (None/{} when the worker wrote nothing). ``wall_s``: supervisor wall time of the
    stage (all attempts). ``meta``: worker_launch.timing_meta (stage, batch, workers, amp, img, cache, device,
    epochs, attempts, threads, gpus, sampler info, ...).
    """
    raw, meta = dict(raw or {}), dict(meta or {})
    warnings: list[str] = []
    # DDP: the timer runs on rank 0 and counts its own share of each batch; DistributedSampler splits evenly.
    world = max(int(finite(meta.get("gpus")) or 1), 1)
    epochs = [epoch_row(e, index, world) for index, e in enumerate(raw.get("epochs") or [])]
    wall, phases = phase_shares(raw, epochs, finite(wall_s), warnings)
    complete = [e for e in epochs if e["complete"] and e["train_s"] > 0] or [e for e in epochs if e["train_s"] > 0]
    steady = complete[1:] if len(complete) > 1 else complete
    throughput = steady_throughput(complete, steady, world)
    cols, rows = read_telemetry(telemetry_csv)
    if telemetry_csv is not None and not rows:
        warnings.append("telemetry.csv missing or empty")
    win_rows, window = _window(rows, finite(raw.get("train_start_unix")), finite(raw.get("train_end_unix")))
    gpu = _gpu_section(cols, rows, win_rows, window, raw.get("memory") or {}, meta)
    return {
        "schema_version": SCHEMA_VERSION,
        "stage": meta.get("stage"),
        "finished": bool(raw.get("finished", False)),
        "stopped_by": meta.get("stopped_by"),
        "epochs_completed": sum(1 for e in epochs if e["complete"]),
        "wall_s": round(wall, 4),
        "clock": {
            k: finite(raw.get(f"{k}_unix")) for k in ("process_start", "train_start", "train_end", "snakemake_call")
        },
        "phases": phases,
        "setup_detail": {
            "imports_s": finite(raw.get("setup_imports_s")),
            "build_s": finite(raw.get("setup_build_s")),
            **image_cache_detail(meta.get("image_cache")),
        },
        "epochs": epochs,
        "throughput": throughput,
        "data_wait": {
            "share": _data_wait_share(epochs),
            "steady_share": _data_wait_share(steady),
            "data_wait_s": round(sum(e["data_wait_s"] for e in epochs), 4),
            "compute_s": round(sum(e["compute_s"] for e in epochs), 4),
        },
        **first_epoch_overhead(complete, throughput["steady_epoch_train_s"]),
        "gpu": gpu,
        "cpu": _cpu_section(cols, rows, win_rows),
        "config": {
            **{k: meta.get(k) for k in CONFIG_KEYS},
            "effective_batch": effective_batch(meta.get("batch"), meta.get("nominal_batch")),
        },
        "attempts": list(meta.get("attempts") or []),
        "telemetry": {
            "samples": len(rows),
            "window_samples": len(win_rows),
            "gpu_status": gpu["reason"] or "ok",
            "sampler": _sampler_info(meta),
        },
        "engine": _engine_section(meta),
        "sync": _sync_note(raw.get("sync"), meta.get("sync_every_batches")),
        "tune": meta.get("tune"),
        "warnings": warnings + [f"timer: {x}" for x in raw.get("errors") or []],
    }


# The stage settings timing.json's `config` records (docs/timing.md), from timing_meta.
CONFIG_KEYS = (
    "batch",
    "workers",
    "amp",
    "amp_dtype",
    "amp_reason",
    "img",
    "img_decision",
    "val_img",
    "cache",
    "device",
    "epochs",
    "epochs_decision",
    "freeze",
    "threads",
    "gpus",
    "val_period",
    "plots",
    "nosave",
    "nominal_batch",
    "patience",
    "time_budget_s",
    "handover_on_stall",
)


def epoch_row(e: dict, index: int, world: int) -> dict:
    """One epoch of the timer's record as timing.json lists it (images counted over all ``world`` ranks)."""

    def seconds(*keys):
        return round(sum(finite(e.get(k)) or 0.0 for k in keys), 4)

    train_s = finite(e.get("train_s")) or 0.0
    images = int(e.get("images") or 0) * world
    batches = int(e.get("batches") or 0)
    return {
        "epoch": int(e.get("epoch", index)),
        "complete": bool(e.get("complete", False)),
        "train_s": round(train_s, 4),
        "data_wait_s": seconds("data_wait_s"),
        "compute_s": seconds("compute_s"),
        "val_s": seconds("val_s"),
        "checkpoint_s": seconds("checkpoint_s"),
        "logging_s": seconds("logging_s", "batch_logging_s"),
        "other_s": seconds("tail_s", "gap_before_s"),
        "batches": batches,
        "images": images,
        "images_per_s": round(images / train_s, 3) if train_s > 0 else None,
        "it_per_s": round(batches / train_s, 4) if train_s > 0 else None,
        "compute_p50_s": finite(e.get("compute_p50_s")),
        "data_wait_p90_s": finite(e.get("data_wait_p90_s")),
        "validated": bool(e.get("validated", False)),
        "saved": bool(e.get("saved", False)),
    }


def phase_shares(raw: dict, epochs: list[dict], wall: float | None, warnings: list[str]) -> tuple[float, dict]:
    """The stage's wall clock and each phase's seconds and share of it; ``other`` is what no phase measured. A wall
    below the measured phases (or none) is raised to their sum, with a warning."""
    final = raw.get("final") or {}
    seconds = {"setup": finite(raw.get("setup_s")) or 0.0, "train": sum(e["train_s"] for e in epochs)}
    for phase in ("val", "checkpoint", "logging"):  # the epochs' share plus the post-training one
        seconds[phase] = sum(e[f"{phase}_s"] for e in epochs) + (finite(final.get(f"{phase}_s")) or 0.0)
    if raw.get("setup_s") is None:
        warnings.append("setup time unknown (no process start or on_train_start)")
    measured = sum(seconds.values())
    if wall is None:
        wall = measured
        warnings.append("wall_s not given: using the sum of measured phases")
    if measured > wall + 1e-6:
        warnings.append(f"measured phases ({measured:.3f} s) exceed wall_s ({wall:.3f} s): wall_s raised to match")
        wall = measured
    seconds["other"] = max(wall - measured, 0.0)
    return wall, {
        k: {"s": round(seconds[k], 4), "share": round(seconds[k] / wall, 5) if wall > 0 else 0.0} for k in PHASES
    }


def steady_throughput(complete: list[dict], steady: list[dict], world: int) -> dict:
    """Images and iterations per second over the steady epochs (after the first, which includes warm-up)."""
    basis = STEADY_BASIS if len(complete) > 1 else ("the only epoch" if complete else "no epochs")
    train_s = sum(e["train_s"] for e in steady)
    return {
        "steady_images_per_s": round(sum(e["images"] for e in steady) / train_s, 3) if train_s > 0 else None,
        "steady_it_per_s": round(sum(e["batches"] for e in steady) / train_s, 4) if train_s > 0 else None,
        "steady_epoch_train_s": round(train_s / len(steady), 4) if steady else None,
        "basis": basis,
        "steady_epochs": [e["epoch"] for e in steady],
        "rank0_images_scale": world,
    }


def _data_wait_share(epochs: list[dict]) -> float | None:
    """Data wait's share of data wait plus compute over ``epochs``."""
    wait, compute = sum(e["data_wait_s"] for e in epochs), sum(e["compute_s"] for e in epochs)
    return round(wait / (wait + compute), 5) if wait + compute > 0 else None


def first_epoch_overhead(complete: list[dict], steady_epoch_s: float | None) -> dict:
    """The first complete epoch's train time over a steady epoch's (caching, loader start, warm-up)."""
    if len(complete) > 1 and steady_epoch_s:
        return {
            "first_epoch_overhead": round(complete[0]["train_s"] / steady_epoch_s, 4),
            "first_epoch_overhead_reason": None,
        }
    return {"first_epoch_overhead": None, "first_epoch_overhead_reason": "needs at least 2 complete epochs"}


def load_schema() -> dict:
    return json.loads(SCHEMA_PATH.read_text())


def validate_timing(timing: dict) -> None:
    """Raise jsonschema.ValidationError when ``timing`` does not match timing.schema.json."""
    import jsonschema

    jsonschema.Draft202012Validator(load_schema()).validate(timing)


def _fmt(v, spec="{:.3g}", none="n/a"):
    return none if v is None else spec.format(v)


def _setup_line(sd: dict) -> str:
    line = f"- Set-up: imports {_fmt(sd.get('imports_s'))} s, dataset + model build {_fmt(sd.get('build_s'))} s"
    if sd.get("cache_source"):
        line += (
            f"; RAM image cache: {sd['cache_source']} ({_fmt(sd.get('cache_s'))} s, "
            f"{sd.get('cache_images_decoded')} image(s) decoded in this stage)"
        )
    return line


# What `stopped_by` means (stagedyolo.engine.stopping), for timing.md.
STOP_REASONS = {
    "patience": "patience, no better fitness on the validated epochs",
    "time_budget": "its time budget",
    "stall": "handover_on_stall, its fitness gain per second stalled",
}


def timing_markdown(t: dict) -> str:
    ph = t["phases"]
    lines = [
        f"# Timing: {t.get('stage') or 'stage'}",
        "",
        f"Wall {t['wall_s']:.1f} s, {t['epochs_completed']} epoch(s) completed"
        + ("" if t["finished"] else " (training did not finish)")
        + (f" (ended early: {STOP_REASONS[t['stopped_by']]})" if t.get("stopped_by") else "")
        + ".",
        "",
        "| phase | seconds | share |",
        "|---|---:|---:|",
    ]
    lines += [f"| {k} | {ph[k]['s']:.2f} | {100 * ph[k]['share']:.1f} % |" for k in PHASES]
    th, g, c = t["throughput"], t["gpu"], t["cpu"]
    lines += [
        "",
        f"- Steady state ({th['basis']}): {_fmt(th['steady_images_per_s'])} images/s, "
        f"{_fmt(th['steady_it_per_s'])} it/s" + _prediction_note(t.get("prediction")),
        f"- Data wait: {_fmt(t['data_wait']['share'] and 100 * t['data_wait']['share'], '{:.1f}')} % of step time",
        _setup_line(t.get("setup_detail") or {}),
        f"- First epoch / steady epoch: {_fmt(t['first_epoch_overhead'], '{:.2f}')}"
        + (f" ({t['first_epoch_overhead_reason']})" if t["first_epoch_overhead_reason"] else ""),
    ]
    if g["available"]:
        u = g["util_pct"]
        lines.append(
            f"- GPU util ({g['window']} window): mean {u['mean']:.0f} %, p10 {u['p10']:.0f} %, "
            f"p50 {u['p50']:.0f} %, p90 {u['p90']:.0f} %; peak memory share "
            f"{_fmt(g['peak_memory_share'] and 100 * g['peak_memory_share'], '{:.0f}')} %"
        )
    else:
        lines.append(f"- GPU: none ({g['reason']})")
    lines.append(
        f"- CPU util mean {_fmt(c['util_mean_pct'], '{:.0f}')} % of {c['cores'] or '?'} cores; "
        f"peak RSS {_fmt(c['peak_rss_mb'], '{:.0f}')} MB"
    )
    cfg = t["config"]
    lines.append("- Config: " + ", ".join(f"{k}={cfg[k]}" for k in cfg if cfg[k] is not None))
    lines += [f"- Warning: {w}" for w in t["warnings"]]
    return "\n".join(lines) + "\n"


def _prediction_note(prediction: dict | None) -> str:
    if not prediction or prediction.get("predicted_images_per_s") is None:
        return ""
    return (
        f"; the probe predicted {_fmt(prediction['predicted_images_per_s'])} (measured/predicted "
        f"{_fmt(prediction['ratio'], '{:.2f}')})"
    )


def write_timing(stage_dir, timing: dict) -> dict:
    """Validate against the schema, then write ``timing.json`` and ``timing.md`` into ``stage_dir``."""
    validate_timing(timing)
    d = Path(stage_dir)
    d.mkdir(parents=True, exist_ok=True)
    out = {"json": d / "timing.json", "md": d / "timing.md"}
    write_json(out["json"], timing)
    out["md"].write_text(timing_markdown(timing))
    return out
