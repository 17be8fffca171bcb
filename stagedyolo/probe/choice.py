"""From measured loader and model throughputs to one (workers, batch, amp) choice. Pure functions, no torch.

The training loop is a two-stage pipeline: dataloader workers prepare batches while the main process computes.
- W > 0 workers: the stages overlap, so the slower one sets the pace: min(loader, model). On CPU both share the
  same cores, so the sum of their CPU work per image also caps it: cores / (W/loader + T/model), where W/loader
  and T/model are the core-seconds each spends per image. That cap only bites when W + T > cores.
- W = 0: the main process loads, then computes, one after the other: 1 / (1/loader + 1/model).
"""

from __future__ import annotations

from stagedyolo.engine.amp import amp_verdict
from stagedyolo.probe.steady import area_ratio

TIE_TOLERANCE = 0.03  # within 3 % of the best, a smaller batch wins (less memory, closer to the nominal recipe)


def predicted_images_per_s(
    workers: int, loader: float, model: float, *, torch_threads: int, cores: int, shares_cpu: bool
) -> tuple[float, str]:
    """Predicted end-to-end images/s and which limit sets it: "serial", "loader", "compute" or "shared cores"."""
    if loader <= 0 or model <= 0:
        return 0.0, "no throughput measured"
    if workers == 0:
        return 1.0 / (1.0 / loader + 1.0 / model), "serial"
    limits = {"loader": loader, "compute": model}
    if shares_cpu:
        limits["shared cores"] = cores / (workers / loader + torch_threads / model)
    bound = min(limits, key=limits.get)
    return limits[bound], bound


def combine(
    loader_runs: list[dict],
    model_runs: list[dict],
    *,
    cores: int,
    shares_cpu: bool,
    memory_limit_bytes: int | None,
    memory_scale: float = 1.0,
) -> list[dict]:
    """One candidate per (workers, batch, amp), carrying the numbers of the measurements it is predicted from.

    On CPU (`shares_cpu`) each worker count is paired with the model run at the torch threads it would really get;
    on CUDA the GPU computes, so any thread count of that (batch, amp) serves. ``memory_scale``: the largest stage's
    image area over the one the model runs were timed at; a run's peak memory times it is judged against the limit
    (an upper bound: the activations grow with the area, the weights and optimizer state do not).
    """
    candidates = [
        _candidate(loader, model, cores, shares_cpu, memory_limit_bytes, memory_scale)
        for loader in loader_runs
        for model in model_runs
        if not shares_cpu or model["torch_threads"] == loader["torch_threads"]
    ]
    if not shares_cpu:  # one model run per (batch, amp) was measured; keep one candidate per key all the same
        candidates = list({(c["workers"], c["batch"], c["amp"]): c for c in candidates}.values())
    return candidates


def _candidate(
    loader: dict, model: dict, cores: int, shares_cpu: bool, memory_limit_bytes: int | None, memory_scale: float
) -> dict:
    threads = loader["torch_threads"]
    peak = model.get("peak_memory_bytes")
    largest_peak = None if peak is None else int(peak * memory_scale)
    why_not = None
    if "skipped" in (loader.get("status"), model.get("status")):
        why_not = (model if model.get("status") == "skipped" else loader)["message"]
    elif model.get("status", "ok") != "ok":
        why_not = f"model run failed: {model.get('status')} {model.get('message') or ''}".strip()
    elif memory_limit_bytes is not None and peak is None:
        why_not = "peak memory not measured on CUDA"
    elif memory_limit_bytes is not None and largest_peak > memory_limit_bytes:
        at_largest = f", about {largest_peak} B at the largest stage size" if memory_scale > 1 else ""
        why_not = f"peak memory {peak} B{at_largest} > limit {memory_limit_bytes} B"
    prediction, bound = predicted_images_per_s(
        loader["workers"],
        loader.get("images_per_s") or 0.0,
        model.get("images_per_s") or 0.0,
        torch_threads=threads,
        cores=cores,
        shares_cpu=shares_cpu,
    )
    return {
        "workers": loader["workers"],
        "batch": model["batch"],
        "amp": model["amp"],
        "torch_threads": threads,
        "loader_images_per_s": loader.get("images_per_s"),
        "model_images_per_s": model.get("images_per_s"),
        "predicted_images_per_s": round(prediction, 3),
        "bound": bound,
        "peak_memory_bytes": peak,
        "peak_memory_at_largest_img_bytes": largest_peak,
        "peak_memory_reason": model.get("peak_memory_reason"),
        "usable": why_not is None,
        "excluded_because": why_not,
    }


def choose(candidates: list[dict], tie_tolerance: float = TIE_TOLERANCE) -> dict:
    """The usable candidate with the highest predicted images/s; within `tie_tolerance` of it, the smallest batch
    (then the faster one, then fewer workers). Returns {} when nothing is usable, so the stages keep their defaults."""
    usable = [c for c in candidates if c["usable"] and c["predicted_images_per_s"] > 0]
    if not usable:
        return {}
    best = max(c["predicted_images_per_s"] for c in usable)
    near = [c for c in usable if c["predicted_images_per_s"] >= (1 - tie_tolerance) * best]
    pick = min(near, key=lambda c: (c["batch"], -c["predicted_images_per_s"], c["workers"]))
    return {"workers": pick["workers"], "batch": pick["batch"], "amp": pick["amp"]}


def decide(
    request: dict, loader_runs: list[dict], model_runs: list[dict], *, cuda: bool, gpu_total_memory_bytes: int | None
) -> dict:
    """The probe's decision from its runs: candidates, the AMP verdict (stagedyolo.engine.amp: on with CUDA unless
    measured clearly slower) and the choice among the candidates at that AMP setting."""
    fraction = request["max_memory_fraction"]
    limit = int(gpu_total_memory_bytes * fraction) if cuda and gpu_total_memory_bytes else None
    scale = max(1.0, area_ratio(request["largest_img"], request["img"]))  # timed below the largest stage size
    candidates = combine(
        loader_runs,
        model_runs,
        cores=request["cores"],
        shares_cpu=not cuda,
        memory_limit_bytes=limit,
        memory_scale=scale,
    )
    verdict = amp_verdict(model_runs, cuda)
    choice = choose([c for c in candidates if c["amp"] == verdict["amp"]])
    if choice:
        choice["amp"] = verdict["amp"]
        if cuda:  # the stages' amp_reason names the verdict (with its figures when AMP was turned off)
            choice["amp_reason"] = verdict["reason"]
    return {"choice": choice, "candidates": candidates, "amp_verdict": verdict, "memory_limit_bytes": limit}
