"""Each training stage's settings as the probe predicts them: the stage spec resolved with the probe's choice,
exactly as the stage will resolve it (stage_plan.resolve_resources), grouped so that stages that train alike are
measured once."""

from __future__ import annotations

import json

from stagedyolo.engine.amp import decide_amp
from stagedyolo.engine.options import AUGMENTATION_KEYS
from stagedyolo.recipe import speed_spec
from stagedyolo.stage_plan import resolve_resources
from stagedyolo.telemetry.summary import STEADY_BASIS


def stage_settings(spec: dict, choice: dict, *, threads: int, cuda: bool, bf16_supported: bool | None) -> dict:
    """What one stage will run with: per-GPU batch, workers and torch threads, AMP and its dtype."""
    resources = resolve_resources(spec, threads, choice)
    amp = decide_amp(resources.amp, cuda, bf16_supported=bf16_supported)
    return {
        "img": int(spec["img"]),
        "freeze": int(spec.get("freeze") or 0),
        "batch": max(1, resources.batch // int(spec["gpus"])),
        "gpus": int(spec["gpus"]),
        "workers": resources.workers,
        "torch_threads": resources.torch_threads,
        "amp": amp["amp"],
        "amp_dtype": amp["dtype"],
        "nominal_batch": int(spec["nominal_batch"]),
        "hyp": spec["hyp"],
        "engine": spec.get("engine") or {},
    }


def stage_groups(request: dict, choice: dict, cuda: bool, bf16_supported: bool | None = None) -> list[dict]:
    """One group per distinct set of speed-relevant settings, each naming its stages, in stage order."""
    groups: dict[str, dict] = {}
    for name, spec in request["stages"].items():
        settings = stage_settings(spec, choice, threads=request["threads"], cuda=cuda, bf16_supported=bf16_supported)
        key = repr({**settings, "hyp": [settings["hyp"].get(k) for k in AUGMENTATION_KEYS]})
        groups.setdefault(key, {**settings, "stages": []})["stages"].append(name)
    return list(groups.values())


PREDICTED_SETTINGS = ("img", "freeze", "batch", "gpus", "workers", "torch_threads", "amp", "amp_dtype", "nominal_batch")


def predictions(stage_runs: list[dict]) -> dict:
    """tuning.json's `stages`: each stage's predicted steady images/s (the whole stage: per GPU x GPUs) and the
    settings it was measured at."""
    out = {}
    for run in stage_runs:
        rate = run.get("images_per_s")
        for name in run["stages"]:
            out[name] = {
                "predicted_images_per_s": round(rate * run["gpus"], 3) if rate else None,
                "basis": "one GPU x gpus (DDP scaling not measured)" if run["gpus"] > 1 else "measured end to end",
                "settings": {k: run[k] for k in PREDICTED_SETTINGS},
                "steps": run.get("steps"),
                "stable": run.get("stable"),
                "seconds": run.get("seconds"),
            }
    return out


def prediction_for(tuning: dict, stage: str, spec: dict) -> dict | None:
    """tuning.json's prediction for ``stage`` if the probe measured it at the speed settings ``spec`` (the stage's
    resolved spec) has now. Without a time budget a change to one stage's speed settings reruns that stage and not
    the probe (recipe.probe_rerun_stages), so its prediction may be of other settings: it is dropped, with why."""
    entry = (tuning.get("stages") or {}).get(stage)
    measured_for = (entry or {}).get("measured_for")
    if measured_for is None:
        return entry
    now, then = _flat(json.loads(json.dumps(speed_spec(spec)))), _flat(measured_for)  # json: as tuning.json holds it
    changed = sorted(key for key in {*now, *then} if now.get(key) != then.get(key))
    if not changed:
        return entry
    return {
        "predicted_images_per_s": None,
        "reason": f"the probe measured this stage before its {', '.join(changed)} changed; "
        "`snakemake --forcerun probe` measures it again (and reruns every stage)",
    }


def _flat(spec: dict) -> dict:
    """A speed spec with its hyp keys as hyp.<key>, to name what changed."""
    return {**{k: v for k, v in spec.items() if k != "hyp"}, **{f"hyp.{k}": v for k, v in spec.get("hyp", {}).items()}}


# The acceptance band for a prediction: the stage's measured steady images/s within +-25 % of it.
PREDICTION_TOLERANCE = 0.25
COMPARED_SETTINGS = ("img", "freeze", "batch", "workers", "torch_threads", "amp")


def compare_prediction(prediction: dict | None, ran: dict, throughput: dict) -> dict:
    """timing.json's `prediction`: the probe's figure for this stage beside what the stage measured.
    ``ran``: the settings the stage ran with (per-GPU batch); a tuned stage may differ from what was predicted.
    ``throughput``: timing.json's; only epochs after the first are steady (the first one includes warm-up)."""
    steady = throughput["basis"] == STEADY_BASIS
    measured_images_per_s = throughput["steady_images_per_s"] if steady else None
    if not prediction or prediction.get("predicted_images_per_s") is None:
        why = (
            "no probe ran for this stage"
            if not prediction
            else prediction.get("reason") or "the probe measured nothing for this stage"
        )
        return {
            "predicted_images_per_s": None,
            "measured_steady_images_per_s": measured_images_per_s,
            "ratio": None,
            "within_tolerance": None,
            "reason": why,
        }
    predicted = prediction["predicted_images_per_s"]
    differs = {
        k: {"predicted_at": prediction["settings"].get(k), "ran": ran.get(k)}
        for k in COMPARED_SETTINGS
        if prediction["settings"].get(k) != ran.get(k)
    }
    ratio = round(measured_images_per_s / predicted, 3) if measured_images_per_s and predicted else None
    return {
        "predicted_images_per_s": predicted,
        "measured_steady_images_per_s": measured_images_per_s,
        "ratio": ratio,  # measured / predicted
        "within_tolerance": None if ratio is None else abs(ratio - 1) <= PREDICTION_TOLERANCE,
        "tolerance": PREDICTION_TOLERANCE,
        "settings_differ": differs,  # e.g. a tune trial kept another setting; then the ratio compares unlike runs
        "reason": None
        if ratio is not None
        else f"no steady epoch measured ({throughput['basis']}: the first epoch includes warm-up)",
    }
