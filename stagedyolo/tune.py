"""tune: verify the diagnosis's top advice on the real stage settings before the stage trains.

``stages.<stage>.tune: true`` runs, before the stage, one to three short trials, each a separate worker process
(yolov5 keeps global state) with the stage's own plan (data, weights, image size, freeze, batch, workers, cache, amp):

1. baseline: the stage as configured. Its timing is diagnosed; the top finding a short window can measure (a change
   of workers, batch, cache or amp; not validation or checkpoints) is the candidate.
2. advice: the stage with that change.
3. advice2, only when the advice was not kept: the alternative its finding lists (at most ``MAX_ADVICE_TRIALS``
   advice trials). Only the baseline runs when no finding can be measured or the change leaves the plan as it is.

Each trial skips its warm-up batches (at least the loader's prefetched ones) and times the next ``measure_batches``
batches: the steady images/s. The change is kept only when it measured at least ``min_measured_gain`` (5 %) faster;
the stage then trains with it. The record (every trial, before and after, and the seconds tune cost) goes into
stage.json, timing.json (``tune``) and the diagnosis. Without tune, advice is labelled unverified.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path

from stagedyolo.diagnosis import T, candidate_of, diagnose, verdict_line
from stagedyolo.engine.offline import engine_environment
from stagedyolo.engine.worker import EXIT_OOM
from stagedyolo.jsonio import read_json, write_json
from stagedyolo.stage_plan import StagePlan, digest_of
from stagedyolo.telemetry import build_timing
from stagedyolo.worker_launch import launch_worker, timing_meta

# Trials stop after their window; so many epochs keep yolov5 from reaching its final validation and save first.
TRIAL_EPOCHS = 10_000
# torch's DataLoader prefetches this many batches per worker: they are ready before timing starts, so the warm-up
# must be at least that long or a slow loader would look fast.
PREFETCH_FACTOR = 2
# The top advice, then its finding's alternative if the first measured no faster: each costs one short trial.
MAX_ADVICE_TRIALS = 2
SETTINGS = ("workers", "torch_threads", "batch", "cache", "amp", "img", "freeze")


def tune_stage(
    make_plan: Callable[[dict], StagePlan],
    *,
    tune_dir: Path,
    log_path,
    engine_home,
    window: dict,
    telemetry_interval: float = 1.0,
    candidate: dict | None = None,
) -> tuple[dict, dict]:
    """Return (the plan to train with, the tune record). ``make_plan(changes)`` is the stage's plan with some
    settings changed. ``candidate``: the change to try; None tries the diagnosis's top measurable advice.
    A finished tune of the same plan (a retry after out-of-memory) is reused, not measured again."""
    tune_dir = Path(tune_dir)
    baseline_plan = make_plan({})
    digest = digest_of({"plan": _identity(baseline_plan), "window": window, "candidate": candidate})
    done = read_json(tune_dir / "tune.json")
    if done and done.get("digest") == digest:
        return make_plan(done["record"]["kept"]), done["record"]

    started = time.monotonic()
    shutil.rmtree(tune_dir, ignore_errors=True)
    base = run_trial(
        baseline_plan, tune_dir / "baseline", "baseline", log_path, engine_home, window, telemetry_interval
    )
    advice, candidates = None, [candidate] if candidate else []
    if candidate is None and base["timing"] is not None:
        candidate, advice = top_candidate(base["timing"], baseline_plan["stage"], baseline_plan)
        # The finding's alternative (e.g. the RAM cache beside "more workers") is tried only if the first is not kept.
        candidates = [c for c in [candidate, *(advice or {}).get("alternatives", [])] if c][:MAX_ADVICE_TRIALS]
    trials, kept = [base], {}
    for tried in candidates:
        candidate_plan = make_plan(tried)
        if _settings(candidate_plan) == _settings(baseline_plan):
            continue
        candidate = tried
        name = "advice" if len(trials) == 1 else f"advice{len(trials)}"
        trial = run_trial(candidate_plan, tune_dir / name, name, log_path, engine_home, window, telemetry_interval)
        trial["kept"] = faster(trial, base)
        trials.append(trial)
        if trial["kept"]:
            kept = dict(tried)
            break
    record = _record(trials, candidate, advice, kept, window, time.monotonic() - started)
    with open(log_path, "a") as log:
        log.write(f"stagedyolo tune: {record['summary']}\n")
    write_json(tune_dir / "tune.json", {"digest": digest, "record": record})
    return make_plan(kept), record


def faster(trial: dict, base: dict) -> bool:
    """Kept only when both measured and the trial's steady images/s beat the baseline's by min_measured_gain."""
    a, b = trial.get("images_per_s"), base.get("images_per_s")
    return bool(a and b and a >= b * (1 + T("min_measured_gain")))


def top_candidate(timing: dict, stage: str, plan: StagePlan | None = None) -> tuple[dict | None, dict | None]:
    """The first finding whose change a short window can measure: (its settings, the finding in brief, with the
    measurable changes it lists as alternatives). ``plan``: the stage's, whose defining settings are never tried."""
    findings = diagnose(timing, stage, plan=plan)
    verdict = verdict_line(stage, findings)
    for f in findings:
        if f.get("candidate"):
            alternatives = [c for c in map(candidate_of, f.get("also", [])) if c]
            brief = {"code": f["code"], "change": f["change"], "alternatives": alternatives, "verdict": verdict}
            return dict(f["candidate"]), brief
    return None, {"code": findings[0]["code"], "change": findings[0]["change"], "verdict": verdict}


def trial_plan(plan: StagePlan, trial_dir: Path, window: dict) -> StagePlan:
    """The stage's plan, stopped after its measuring window: no validation, no checkpoint, no resume."""
    warmup = max(int(window["warmup_batches"]), PREFETCH_FACTOR * int(plan["workers"]))
    return {
        **plan,
        "epochs": TRIAL_EPOCHS,
        "val_period": TRIAL_EPOCHS,
        "nosave": True,
        "plots": False,
        "resume_from": None,
        "attempt": 1,
        "work_dir": str(Path(trial_dir).resolve()),
        "trial": {"warmup_batches": warmup, "measure_batches": int(window["measure_batches"])},
    }


def run_trial(
    plan: dict, trial_dir: Path, name: str, log_path, engine_home, window: dict, telemetry_interval: float
) -> dict:
    """Run one trial in its own worker process; returns its settings, steady images/s, status and timing."""
    trial_dir = Path(trial_dir)
    trial_dir.mkdir(parents=True, exist_ok=True)
    tp = trial_plan(plan, trial_dir, window)
    env = engine_environment(engine_home)
    env["OMP_NUM_THREADS"] = str(tp["torch_threads"])
    started = time.time()
    with open(log_path, "a") as log:
        log.write(f"stagedyolo tune: trial {name} {_settings(plan)}\n")
        log.flush()
        returncode, sampler = launch_worker(tp, env, log, trial_dir, telemetry_interval)
    wall = time.time() - started
    outcome = read_json(trial_dir / "outcome.json") or {}
    window_result = outcome.get("trial") or {}
    status = (
        "oom"
        if returncode == EXIT_OOM
        else ("ok" if returncode == 0 and window_result.get("images_per_s") else "failed")
    )
    timing = None
    raw = read_json(trial_dir / "timing_raw.json")
    if raw:
        timing = build_timing(
            raw,
            telemetry_csv=trial_dir / "telemetry.csv",
            wall_s=wall,
            meta=timing_meta(tp, {**outcome, "sampler": sampler}, []),
        )
    return {
        "name": name,
        "settings": _settings(plan),
        "status": status,
        "images_per_s": window_result.get("images_per_s") if status == "ok" else None,
        "batches": window_result.get("batches"),
        "warmup_batches": tp["trial"]["warmup_batches"],
        "window_s": window_result.get("seconds"),
        "seconds": round(wall, 3),
        "data_wait_share": (timing or {}).get("data_wait", {}).get("share"),
        "timing": timing,
    }


def _record(trials, candidate, advice, kept, window, seconds) -> dict:
    base = trials[0]
    summary = f"baseline {_ips(base)} images/s"
    if len(trials) > 1:
        t = trials[-1]
        ratio = (
            f" (x{t['images_per_s'] / base['images_per_s']:.2f})" if t["images_per_s"] and base["images_per_s"] else ""
        )
        summary = f"tried {_change_text(candidate)}: {_ips(base)} -> {_ips(t)} images/s{ratio}: " + (
            "kept" if t["kept"] else f"not kept (needs >= {100 * T('min_measured_gain'):.0f} % faster)"
        )
    elif candidate:
        summary += f"; {_change_text(candidate)} is what the stage already runs: nothing to try"
    elif advice and advice.get("change") not in (None, "none"):
        summary += f"; the top advice ({advice['change']}) is not one a short training window can measure"
    else:
        summary += "; no advice to try"
    for t in trials:
        t.pop("timing", None)  # the record stays small; the trial's figures are in the entry
    return {
        "window": dict(window),
        "candidate": candidate,
        "advice": advice,
        "trials": trials,
        "kept": kept,
        "baseline_images_per_s": base["images_per_s"],
        "tuned_images_per_s": trials[-1]["images_per_s"] if kept else base["images_per_s"],
        "min_gain": T("min_measured_gain"),
        "seconds": round(seconds, 3),
        "summary": summary,
    }


def _settings(plan: dict) -> dict:
    return {k: plan.get(k) for k in SETTINGS}


def _identity(plan: dict) -> dict:
    """What decides a trial's result (work folders and retry counters left out)."""
    return {k: v for k, v in plan.items() if k not in ("work_dir", "attempt", "resume_from")}


def _ips(trial: dict) -> str:
    return "n/a" if trial.get("images_per_s") is None else f"{trial['images_per_s']:.1f}"


def _change_text(candidate: dict) -> str:
    return ", ".join(f"{k}: {v}" for k, v in candidate.items())
