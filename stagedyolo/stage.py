"""The stage supervisor: plans one training stage, runs the engine's worker process, and publishes the result.

Layout for a stage S of run R:
- `R/work/S/`: yolov5's own run folder. Not a Snakemake output, so Snakemake's clean-up of a failed or killed
  job never deletes the checkpoint a rerun resumes from.
- `R/stages/S/`: the published outputs (weights, results.csv, TensorBoard events, stage.json, timing.json),
  written only when the stage succeeded: built in a hidden sibling (`R/stages/.S.publishing`, then
  `.S.published-<digest>` once complete) that replaces the folder whole (publish).
- `R/work/S/stage.owner`: the supervisor that runs the stage (pid and start time, flock'ed): one at a time.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
import time
from pathlib import Path

from stagedyolo.diagnosis import diagnose, verdict_line, write_diagnosis
from stagedyolo.engine.checkpoint import FINISHED_EPOCH, CheckpointUnanswered, read_checkpoint
from stagedyolo.engine.continuation import handover_path
from stagedyolo.engine.offline import engine_environment
from stagedyolo.engine.worker import EXIT_NONFINITE, EXIT_OOM
from stagedyolo.jsonio import read_json, replaced_atomically, write_json
from stagedyolo.launch import OWNER_FILE, FolderOwned, explicit_gpu_indices, owning
from stagedyolo.probe.stages import compare_prediction, prediction_for
from stagedyolo.recipe_budget import budgeted_settings, size_stage
from stagedyolo.stage_plan import RUNTIME_KEYS, StagePlan, build_plan, plan_digest, retry_batch
from stagedyolo.telemetry import build_timing, write_timing
from stagedyolo.tune import tune_stage
from stagedyolo.worker_launch import launch_worker, timing_meta


class StageFailed(RuntimeError):
    """A stage failed; the message says why and what to change."""


def train_stage(
    inputs: dict,
    stage: str,
    *,
    data: str,
    cache_decision: str,
    weights: list[str],
    probe: list[str],
    timing_path: str,
    threads: int,
    attempt: int,
    log_path: str,
    run_stages: list[dict] | None = None,
    boxes_need: int | None = None,
    previous_timing: list[str] = (),
    images: tuple[int, int] | None = None,
) -> dict:
    """The train_stage rule: plan the stage from its inputs (recipe.stage_inputs: the rule's params), run it, publish
    it into timing_path's folder. ``run_stages``: the run's outline, for the progress line's ETA only.
    ``boxes_need``: the size the data's boxes need (recipe.boxes_need_img), which may raise an early phase's img.
    Under the recipe's time budget the stage sizes its epochs from ``previous_timing`` (the previous stage's
    timing.json, if any) and ``images`` (the training and validation images), see stagedyolo.recipe_budget.

    Folders are derived from the output path (R/stages/S/timing.json), so a Snakemake module's prefix applies.
    """
    stage_dir = Path(timing_path).parent
    run_dir = stage_dir.parent.parent
    decision = read_json(Path(cache_decision))
    tuning = read_json(Path(probe[0])) if probe else {}
    spec, interval = inputs["spec"], inputs["telemetry_interval_s"]
    if inputs.get("recipe_budget"):
        spec = _sized_to_budget(spec, inputs["recipe_budget"], tuning, previous_timing, images, boxes_need)
    settings = dict(
        stage=stage,
        data=data,
        weights=weights[0] if weights else None,
        cfg=inputs["cfg"],
        cache_mode=decision["mode"],
        threads=threads,
        work_dir=run_dir / "work" / stage,
        probe_choice=tuning.get("choice"),
        image_store=(decision.get("store") or {}).get("root"),
        run_stages=run_stages,
        boxes_need=boxes_need,
    )

    def make_plan(changes: dict) -> StagePlan:  # the stage's plan with some settings changed (a tune candidate)
        return build_plan({**spec, **changes}, **settings)

    engine_home, tune_dir = run_dir / "engine", run_dir / "work" / f"{stage}.tune"
    with _owned(settings["work_dir"], stage):  # its tune trials too: one supervisor per stage
        if inputs["tune"]:
            plan, tune = tune_stage(
                make_plan,
                tune_dir=tune_dir,
                log_path=log_path,
                engine_home=engine_home,
                window=inputs["tune"],
                telemetry_interval=interval,
            )
        else:
            plan, tune = make_plan({}), None
        outcome = run_stage(
            plan,
            stage_dir=stage_dir,
            attempt=attempt,
            log_path=log_path,
            engine_home=engine_home,
            telemetry_interval=interval,
            tune=tune,
            prediction=prediction_for(tuning, stage, inputs["spec"]),
        )
        shutil.rmtree(tune_dir, ignore_errors=True)  # kept until the stage is published: a retry reuses its decision
    return outcome


def _sized_to_budget(spec: dict, budget: dict, tuning: dict, previous_timing, images, boxes_need) -> dict:
    """The stage's spec with the epochs (and time cap) the recipe's time budget gives it (stagedyolo.recipe_budget)."""
    decision = size_stage(
        budget,
        previous=read_json(Path(previous_timing[0])) if previous_timing else None,
        predictions={name: row.get("predicted_images_per_s") for name, row in (tuning.get("stages") or {}).items()},
        first_rate=(tuning.get("payoff") or {}).get("at_images_per_s"),
        images=images,
        boxes_need=boxes_need,
    )
    return {**spec, **budgeted_settings(spec, decision)}


def run_stage(
    plan: StagePlan,
    *,
    stage_dir: str | Path,
    attempt: int,
    log_path: str | Path,
    engine_home: str | Path,
    telemetry_interval: float = 1.0,
    tune: dict | None = None,
    prediction: dict | None = None,
) -> dict:
    """Run (or resume) one stage and publish it into `stage_dir`. Returns the outcome; raises StageFailed.
    ``tune``: the record of the tune trials that chose this plan, published with the stage. ``prediction``: the
    probe's predicted steady images/s for this stage (tuning.json `stages`), set beside the measured one.
    The work folder is owned by one supervisor at a time (launch.owning): a second one is refused."""
    work_dir, stage_dir = Path(plan["work_dir"]), Path(stage_dir)
    with _owned(work_dir, plan["stage"]):
        ready = _ready_folder(stage_dir, plan)
        if ready.is_dir():  # published by a run killed while it cleaned up: nothing to train again
            with open(log_path, "a") as log:
                log.write(
                    f"stagedyolo: {ready} is this stage, published by a run stopped while it removed its work "
                    "folder: it becomes the stage's folder without training again\n"
                )
            _swap_in(ready, stage_dir, work_dir)
            return {"status": "ok", "message": f"published from {ready.name}"}
        return _train_and_publish(plan, stage_dir, attempt, log_path, engine_home, telemetry_interval, tune, prediction)


def _train_and_publish(
    plan: StagePlan,
    stage_dir: Path,
    attempt: int,
    log_path,
    engine_home,
    telemetry_interval: float,
    tune: dict | None,
    prediction: dict | None,
) -> dict:
    work_dir = Path(plan["work_dir"])
    attempts = _load_attempts(work_dir, plan)
    plan = {**plan, "attempt": attempt, "batch": retry_batch(plan["batch"], attempts)}
    if attempt > 1 and attempts and attempts[-1]["status"] != "oom":
        raise StageFailed(
            f"stage {plan['stage']}: not retrying, attempt {attempt - 1} failed with "
            f"{attempts[-1]['status']} ({attempts[-1].get('message', '')}); only out-of-memory failures are retried."
        )
    env = engine_environment(engine_home)
    env["OMP_NUM_THREADS"] = str(plan["torch_threads"])
    started = time.time()
    with open(log_path, "a") as log:
        plan["resume_from"], finished = _prepare_work_dir(work_dir, plan, env, log)
        log.write(
            f"stagedyolo: stage {plan['stage']} attempt {attempt}, batch {plan['batch']}"
            f"{', resuming ' + plan['resume_from'] if plan['resume_from'] else ''}\n"
        )
        log.flush()
        if finished:
            returncode, sampler_info = 0, {}
        else:
            returncode, sampler_info = launch_worker(plan, env, log, work_dir, telemetry_interval)
    wall = time.time() - started
    recorded = read_json(work_dir / "outcome.json")
    if finished:
        outcome = _finished_outcome(recorded or {})
    else:
        outcome = recorded or {"status": "error", "message": f"worker exited {returncode}"}
    outcome["sampler"] = sampler_info
    if returncode == EXIT_OOM:
        outcome["status"] = "oom"
    elif returncode == EXIT_NONFINITE:
        outcome["status"] = "nonfinite"
    elif returncode != 0 and outcome.get("status") == "ok":
        outcome = {**outcome, "status": "error", "message": f"worker exited {returncode}"}
    attempts.append(
        {
            "attempt": attempt,
            "batch": plan["batch"],
            "status": outcome["status"],
            "wall_s": round(wall, 3),
            "resumed_from": plan["resume_from"] or None,
            "message": outcome.get("message"),
        }
    )
    write_json(work_dir / "attempts.json", {"digest": plan_digest(plan), "attempts": attempts})
    if outcome["status"] != "ok":
        raise StageFailed(_failure_message(plan, outcome, log_path))
    verdict = publish(work_dir, stage_dir, plan, outcome, attempts, wall, tune, prediction)
    with open(log_path, "a") as log:
        log.write(verdict + "\n")
    print(verdict, file=sys.stderr)
    return outcome


def publish(
    work_dir: Path,
    stage_dir: Path,
    plan: StagePlan,
    outcome: dict,
    attempts: list[dict],
    wall: float,
    tune: dict | None = None,
    prediction: dict | None = None,
) -> str:
    """Publish the finished run: its artefacts, timing report and diagnosis go into a fresh folder beside the stage's
    output folder, which then replaces it, so a rerun's folder never holds the previous run's best.pt, epoch<N>.pt or
    TensorBoard events. Returns the stage's one-line verdict. ``tune``: the tune record (stagedyolo.tune), kept in
    stage.json and timing.json.

    The order keeps the stage whole whatever stops it: the new folder is complete (renamed from `.S.publishing` to
    `.S.published-<digest>`) before the work folder is emptied, and the work folder is emptied before the swap. A run
    stopped before that point still has its work folder (the rerun publishes again); one stopped after it has the
    complete folder, which the rerun swaps in (run_stage). The old output folder is removed only after the swap.
    """
    building = _sibling(stage_dir, "publishing")
    shutil.rmtree(building, ignore_errors=True)
    findings = _write_published(building, work_dir, plan, outcome, attempts, wall, tune, prediction)
    ready = _ready_folder(stage_dir, plan)
    shutil.rmtree(ready, ignore_errors=True)
    os.rename(building, ready)
    _swap_in(ready, stage_dir, work_dir)
    return verdict_line(plan["stage"], findings)


def _write_published(
    folder: Path,
    work_dir: Path,
    plan: StagePlan,
    outcome: dict,
    attempts: list[dict],
    wall: float,
    tune: dict | None,
    prediction: dict | None,
) -> list:
    """Copy the finished run's artefacts into `folder` and write its stage.json, timing and diagnosis."""
    weights = work_dir / "weights"
    (folder / "weights").mkdir(parents=True)
    # epoch<N>.pt: the save_period checkpoints, kept since the user asked for them
    for path in [weights / "last.pt", weights / "best.pt", *sorted(weights.glob("epoch*.pt"))]:
        if path.exists():
            shutil.copy2(path, folder / "weights" / path.name)
    for path in [
        *(work_dir / name for name in ("results.csv", "opt.yaml", "hyp.yaml", "telemetry.csv")),
        handover_path(weights / "last.pt"),
        *work_dir.glob("events.out.tfevents.*"),
        *work_dir.glob("*.png"),
    ]:
        if path.exists():
            shutil.copy2(path, folder / path.name)
    record = {
        **plan,
        "amp_used": outcome.get("amp"),
        "amp_dtype": outcome.get("amp_dtype"),
        "amp_reason": outcome.get("amp_reason"),
        "validated_epochs": outcome.get("validated_epochs"),
        "best_saved_epochs": outcome.get("best_saved_epochs"),
        "engine_mode": outcome.get("engine_mode"),
        "patches": outcome.get("patches"),
        "compile": outcome.get("compile"),
        "stopped_by": outcome.get("stopped_by"),
        "attempts": attempts,
        "continuation": outcome.get("continuation"),
        "handover_on_stall": outcome.get("handover_on_stall"),
        "tune": tune,
    }
    write_json(folder / "stage.json", record)
    timing = build_timing(
        read_json(work_dir / "timing_raw.json"),
        telemetry_csv=folder / "telemetry.csv",
        wall_s=wall,
        meta={**timing_meta(plan, outcome, attempts), "tune": tune},
    )
    ran = {
        **{k: plan[k] for k in ("img", "freeze", "workers", "torch_threads")},
        "batch": plan["batch"] // (plan["gpus"] * plan.get("nodes", 1)),
        "amp": outcome.get("amp"),
    }
    timing["prediction"] = compare_prediction(prediction, ran, timing["throughput"])
    write_timing(folder, timing)
    findings = diagnose(timing, plan=plan)  # the plan tells which settings define the stage: never advised
    write_diagnosis(folder, findings)
    return findings


# The hidden folders a publish leaves beside the stage's output folder (a stage "s.x" has its own: never matched).
SIBLING_ROLE = re.compile(r"old|publishing|published-[0-9a-f]{16}")


def _sibling(stage_dir: Path, role: str) -> Path:
    """A hidden folder beside the stage's output folder (Snakemake may have created the output folder already)."""
    return stage_dir.with_name(f".{stage_dir.name}.{role}")


def _ready_folder(stage_dir: Path, plan: StagePlan) -> Path:
    """Where a complete publish of `plan` waits for its swap: named by the plan's digest, so a rerun takes up only
    its own plan's."""
    return _sibling(stage_dir, f"published-{plan_digest(plan)}")


def _swap_in(ready: Path, stage_dir: Path, work_dir: Path) -> None:
    """Empty the work folder (all but its owner file, removed when the owner lets go), then make `ready` the stage's
    output folder and remove the old one; other plans' leftovers beside it go too."""
    _empty_folder(work_dir)
    old = _sibling(stage_dir, "old")
    shutil.rmtree(old, ignore_errors=True)
    if stage_dir.exists():
        os.rename(stage_dir, old)
    os.rename(ready, stage_dir)
    for leftover in stage_dir.parent.glob(f".{stage_dir.name}.*"):
        if SIBLING_ROLE.fullmatch(leftover.name.removeprefix(f".{stage_dir.name}.")):
            shutil.rmtree(leftover, ignore_errors=True)


@contextlib.contextmanager
def _owned(work_dir: Path, stage: str):
    """Own the stage's work folder while the block runs (launch.owning); another live owner fails the stage."""
    try:
        with owning(work_dir):
            yield
    except FolderOwned as error:
        raise StageFailed(f"stage {stage}: {error}") from None


def _prepare_work_dir(work_dir: Path, plan: StagePlan, env: dict, log) -> tuple[str | None, bool]:
    """Return (the checkpoint to resume from, whether training already finished), or start from a clean folder.

    A checkpoint is reused only when the interrupted run had the same plan, batch included (the digest leaves
    out what may change between tries or machines, like the thread and worker counts), and only after loading it:
    yolov5 strips last.pt (epoch -1) once its training ends, so a run killed from then on has finished training
    and is published as it is (resuming it would fail on every rerun). Anything else is wiped: yolov5's --exist-ok
    into an old folder would append to its results.csv and add a second TensorBoard file. The attempt history
    survives a wipe, so out-of-memory retries keep halving the batch. Every wipe is logged with its reason.
    A checkpoint reader that gave no answer (timeout, signal, out of memory) says nothing about the file: the job
    fails and the folder is kept.
    """
    last = work_dir / "weights" / "last.pt"
    reason = _reason_to_start_over(work_dir, plan)
    if reason is None:
        try:
            state = read_checkpoint(last, env, log)
        except CheckpointUnanswered as error:
            raise StageFailed(
                f"stage {plan['stage']}: {error}. Its work folder {work_dir} is kept as it is: rerun "
                "the stage to resume it (it is wiped only when its checkpoint does not load)"
            ) from None
        reason = _unusable_checkpoint(last, state, read_json(work_dir / "outcome.json"))
        if reason is None and state["epoch"] == FINISHED_EPOCH:
            log.write(
                f"stagedyolo: {last} is a finished run (yolov5 stripped it when its training ended): "
                "publishing it without training again\n"
            )
            return None, True
        if reason is None:
            (work_dir / "outcome.json").unlink(missing_ok=True)
            _runtime_into_opt_yaml(work_dir, plan)
            return str(last), False
    if reason:
        log.write(f"stagedyolo: wiping the work folder {work_dir}: {reason}; the stage trains from its start\n")
    history = read_json(work_dir / "attempts.json")
    _empty_folder(work_dir)
    if history and history.get("digest") == plan_digest(plan):
        write_json(work_dir / "attempts.json", history)
    return None, False


def _reason_to_start_over(work_dir: Path, plan: StagePlan) -> str | None:
    """Why the work folder holds nothing to resume ('' when it holds nothing at all), or None when it may."""
    if not any(entry.name != OWNER_FILE for entry in _entries(work_dir)):
        return ""
    interrupted = read_json(work_dir / "plan.json")
    if not interrupted:
        return "it has no plan.json (a run stopped before it started its worker, or a folder not written by a stage)"
    if not (work_dir / "weights" / "last.pt").exists():
        return "it has no weights/last.pt (the interrupted run saved no epoch)"
    if plan_digest(interrupted) != plan_digest(plan):
        changed = sorted(
            key for key in {*interrupted, *plan} - {*RUNTIME_KEYS, "batch"} if interrupted.get(key) != plan.get(key)
        )
        return f"its run had another plan (changed: {', '.join(changed)})"
    if interrupted["batch"] != plan["batch"]:
        return f"its run had batch {interrupted['batch']}, this try has batch {plan['batch']}"
    return None


def _unusable_checkpoint(last: Path, state: dict, outcome: dict | None) -> str | None:
    """Why a checkpoint that was read cannot be resumed or published, or None."""
    if "error" in state:
        return f"{last} does not load ({state['error']})"
    if state.get("nonfinite"):
        return f"{last} holds non-finite weights ({', '.join(state['nonfinite'][:3])}...)"
    if state["epoch"] == FINISHED_EPOCH and (outcome or {}).get("status") == "nonfinite":
        return f"the run that finished {last} stopped on a non-finite loss ({outcome.get('message', '')})"
    return None


def _runtime_into_opt_yaml(work_dir: Path, plan: StagePlan) -> None:
    """yolov5's --resume reloads the interrupted run's opt.yaml: give it this machine's loader workers and cache
    (runtime settings, left out of the digest), not the ones of the machine or core count it was killed on. Explicit
    GPU indices become '' as in a new run (worker.resolve_device): a run started before that wrote them there."""
    import yaml

    path = work_dir / "opt.yaml"
    opt = yaml.safe_load(path.read_text()) if path.exists() else None
    if not isinstance(opt, dict):
        return
    opt.update(workers=plan["workers"], cache=plan["cache"])
    if explicit_gpu_indices(plan["device"]) is not None:
        opt["device"] = ""  # the launcher narrows CUDA_VISIBLE_DEVICES to them
    with replaced_atomically(path) as handle:
        handle.write(yaml.safe_dump(opt, sort_keys=False))


def _entries(folder: Path) -> list[Path]:
    return list(folder.iterdir()) if folder.is_dir() else []


def _empty_folder(folder: Path) -> None:
    """Remove everything in `folder` but the owner file, which the running supervisor holds (stage_owner)."""
    folder.mkdir(parents=True, exist_ok=True)
    for entry in _entries(folder):
        if entry.name == OWNER_FILE:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def _finished_outcome(outcome: dict) -> dict:
    """The outcome of a run that finished training but was stopped before it was published: the worker's own
    record when it got to write one (a kill while publishing, or a failure after its last epoch, which is named),
    else what is known without it. (A record of a non-finite loss never gets here: its checkpoint is wiped.)"""
    if outcome.get("status") == "ok":
        return {**outcome, "message": "published from a finished checkpoint"}
    if outcome.get("status"):
        return {
            **outcome,
            "status": "ok",
            "message": f"published from a finished checkpoint; the attempt that trained it failed after its last "
            f"epoch ({outcome['status']}: {outcome.get('message', '')})",
        }
    return {
        "status": "ok",
        "amp": None,
        "amp_reason": "not recorded: the run was stopped before it reported",
        "device": None,
        "message": "published from a finished checkpoint; its timing was not recorded",
    }


def _load_attempts(work_dir: Path, plan: StagePlan) -> list[dict]:
    previous = read_json(work_dir / "attempts.json") or {}
    return list(previous.get("attempts", [])) if previous.get("digest") == plan_digest(plan) else []


def _failure_message(plan: StagePlan, outcome: dict, log_path) -> str:
    head = f"stage {plan['stage']} failed ({outcome['status']}): {outcome.get('message', '')}"
    if outcome["status"] == "oom":
        head += f"\nIt ran out of memory at batch {plan['batch']}; Snakemake's retry runs it at half that batch."
    return f"{head}\nFull log: {log_path}"
