"""AMP: one policy for the probe's recommendation and the stage's decision. Pure Python, no torch.

`amp` is `auto`, `true`, `false` or `bf16`. On CUDA `auto` means on: mixed precision is yolov5's and the field's
default, and on an H200 the probe's old rule (pick whichever measured faster over 3-6 steps) turned it off on
warm-up noise. It is now switched off only when the probe timed at least AMP_MIN_STEPS steps on each side and AMP
was at least AMP_SLOWER_TO_DISABLE slower at every batch it measured; both figures are recorded either way.
`bf16` autocasts to bfloat16 (no overflow, so no loss scaling is needed; Ampere and newer), fp16 where the GPU lacks
it. On the CPU yolov5's AMP does not apply: every setting runs fp32, and says so.
"""

from __future__ import annotations

AMP_MIN_STEPS = 20
AMP_SLOWER_TO_DISABLE = 0.10
SETTINGS = ("auto", True, False, "bf16")


def amp_verdict(model_runs: list[dict], cuda: bool) -> dict:
    """The probe's AMP recommendation for `amp: auto` from its model runs: {"amp", "reason", "evidence"}."""
    if not cuda:
        return {"amp": False, "reason": "off on CPU (AMP needs CUDA)", "evidence": []}
    evidence = []
    threads = min((r["torch_threads"] for r in model_runs), default=None)  # on CUDA every run has the same count
    for batch in sorted({r["batch"] for r in model_runs}):
        sides = {
            r["amp"]: r
            for r in model_runs
            if r["batch"] == batch and r.get("status", "ok") == "ok" and r["torch_threads"] == threads
        }
        if True in sides and False in sides:
            evidence.append(
                {
                    "batch": batch,
                    "amp_images_per_s": sides[True]["images_per_s"],
                    "fp32_images_per_s": sides[False]["images_per_s"],
                    "amp_steps": sides[True].get("steps"),
                    "fp32_steps": sides[False].get("steps"),
                }
            )
    conclusive = [e for e in evidence if min(e["amp_steps"] or 0, e["fp32_steps"] or 0) >= AMP_MIN_STEPS]
    slower = [e for e in conclusive if e["amp_images_per_s"] <= (1 - AMP_SLOWER_TO_DISABLE) * e["fp32_images_per_s"]]
    if conclusive and len(slower) == len(evidence):
        figures = ", ".join(f"batch {e['batch']}: {e['amp_images_per_s']} vs {e['fp32_images_per_s']}" for e in slower)
        return {
            "amp": False,
            "evidence": evidence,
            "reason": f"off: AMP measured >= {AMP_SLOWER_TO_DISABLE:.0%} slower than fp32 over >= "
            f"{AMP_MIN_STEPS} steps each ({figures} images/s)",
        }
    why = "not measured"
    if evidence:
        why = f"AMP not >= {AMP_SLOWER_TO_DISABLE:.0%} slower at every batch over >= {AMP_MIN_STEPS} steps each"
    return {"amp": True, "reason": f"on with CUDA (the default; {why})", "evidence": evidence}


def decide_amp(setting, cuda: bool, source: str = "config", bf16_supported: bool | None = None) -> dict:
    """What a stage runs: {"amp": bool, "dtype": "float16" | "bfloat16" | None, "reason": str}.
    `source` says who set a true/false: the config, or the probe for `amp: auto`."""
    if not cuda:
        why = "AMP needs CUDA"
        if setting is True or setting == "bf16":
            why = f"amp: {str(setting).lower()} from {source}, but yolov5's AMP does not apply on the CPU"
        return {"amp": False, "dtype": None, "reason": f"off on CPU ({why})"}
    if setting == "bf16":
        if bf16_supported:
            return {"amp": True, "dtype": "bfloat16", "reason": f"bf16 from {source}"}
        return {"amp": True, "dtype": "float16", "reason": f"bf16 from {source}, but this GPU lacks bfloat16: fp16"}
    if setting == "auto":
        return {"amp": True, "dtype": "float16", "reason": "auto: on with CUDA"}
    return {
        "amp": bool(setting),
        "dtype": "float16" if setting else None,
        "reason": f"amp: {str(setting).lower()} from {source}",
    }
