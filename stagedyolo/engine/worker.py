"""The stage process: `python -m stagedyolo.engine.worker <plan.json>` runs one yolov5 training run.

It runs in a process of its own (yolov5 keeps global state: RANK at import, a shared default Callbacks, the
caller's sys.argv) and writes `outcome.json` next to the plan, which the supervisor reads to tell an
out-of-memory failure (retried at half batch) from a NaN stop or any other failure (not retried).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from collections.abc import Mapping
from pathlib import Path

from stagedyolo.engine import compat
from stagedyolo.engine.amp import decide_amp
from stagedyolo.engine.checkpoint import nonfinite_checkpoints
from stagedyolo.engine.continuation import Continuation, handover_path, read_handover
from stagedyolo.engine.hooks import NonFiniteLoss, close_engine_loggers, register
from stagedyolo.engine.patches import EngineContext, apply_patches, compile_seconds, engine_settings
from stagedyolo.engine.stopping import STALL
from stagedyolo.engine.trial import TrialWindow
from stagedyolo.jsonio import write_json
from stagedyolo.launch import STAGE_DEVICES_ENV, exit_when_parent_dies, explicit_gpu_indices
from stagedyolo.progress import ProgressReport
from stagedyolo.telemetry import StageTimer
from stagedyolo.yolov5_facts import trained_img

# yolov5 reads RANK when imported; only rank 0 (or a single process, -1) reports.
REPORTING_RANK = int(os.environ.get("RANK", -1)) in (-1, 0)

EXIT_OOM = 75  # EX_TEMPFAIL: worth retrying with a smaller batch
EXIT_NONFINITE = 76


def main(plan_path: str, plugins=()) -> int:
    """Run the plan's stage; `plugins` are extra Callbacks plugins (tests record per-step losses with one)."""
    process_start = time.time()
    exit_when_parent_dies()  # a SIGKILLed supervisor must not leave this stage training on its own
    plan = json.loads(Path(plan_path).read_text())
    work_dir = Path(plan["work_dir"])
    compat.quiet_engine_warnings()

    import torch

    torch.set_num_threads(plan["torch_threads"])
    engine, patches, amp, continuation = load_engine(plan, torch, process_start)
    device, callbacks, schedule, guard = engine.device, engine.callbacks, engine.schedule, engine.guard
    for plugin in plugins:
        register(plugin, callbacks)
    window = TrialWindow.from_plan(plan)  # a tune trial: time the steady batches, then stop (stagedyolo.tune)
    if window:
        window.attach(callbacks)
    timer = StageTimer(cuda=device != "cpu", process_start=process_start)
    timer.register(callbacks)
    stop = engine.stop  # patience, time budget and handover end a stage at an epoch boundary (the epoch_stop row)
    register(stop, callbacks)
    register(ProgressReport(plan, timer, schedule, stop), callbacks)

    outcome = {
        "status": "ok",
        "amp": amp["amp"],
        "amp_dtype": amp["dtype"],
        "amp_reason": amp["reason"],
        "device": device or "cuda:0",
        "engine_mode": engine.mode,
        "patches": patches,
        "sync_every_batches": engine.log_every,
        "continuation": continuation,
    }
    try:
        engine.train.main(build_opt(engine.train, plan, device), callbacks)
        if guard.message:
            outcome.update(status="nonfinite", message=guard.message)
        elif REPORTING_RANK:
            # What the supervisor publishes as the stage's weights: last.pt and the handover made from it.
            last = work_dir / "weights" / "last.pt"
            if unpublishable := nonfinite_checkpoints([last, handover_path(last)], torch):
                outcome.update(status="nonfinite", message=unpublishable)  # a NaN the loss guard could not see
    except NonFiniteLoss:  # found at an epoch's end, before yolov5 saved that epoch
        outcome.update(status="nonfinite", message=guard.message)
    except torch.cuda.OutOfMemoryError as error:
        outcome.update(status="oom", message=str(error).splitlines()[0])
    except BaseException as error:  # recorded for the supervisor, then re-raised with its traceback
        outcome.update(status="error", message=f"{type(error).__name__}: {error}")
        raise
    finally:
        if REPORTING_RANK:
            if engine.compile_applied:
                outcome["compile"] = compile_seconds(torch)
            outcome["validated_epochs"] = schedule.validated
            outcome["best_saved_epochs"] = schedule.best_saved
            outcome["image_cache"] = engine.image_cache
            if window:
                outcome["trial"] = window.result()
            outcome["stopped_by"] = stop.reason
            if stop.stall:
                outcome["handover_on_stall"] = {
                    "fraction": stop.stall.fraction,
                    "intervals": stop.stall.figures,
                    "stalled": stop.reason == STALL,
                }
            if continuation:
                continuation.update(engine.continuation.report)
            write_json(work_dir / "outcome.json", outcome)
            timer.write_raw(work_dir / "timing_raw.json")
        close_engine_loggers(callbacks)  # before skip_exit_collection, which would leave its last events unwritten
    code = {"oom": EXIT_OOM, "nonfinite": EXIT_NONFINITE}.get(outcome["status"], 0)
    if code:
        print(f"stagedyolo: {outcome['message']}", file=sys.stderr)
    return code


def load_engine(plan: dict, torch, started_at: float = 0.0) -> tuple[EngineContext, list[dict], dict, dict | None]:
    """The engine for ``plan``: AMP decided, then every change to yolov5's behaviour (stagedyolo.engine.patches)
    applied, the process rows before anything of yolov5 is imported (its import shims act only on imports still to
    come), the others on yolov5's Callbacks and train module. In between, a continuing stage takes up what the
    previous one handed over (take_up_plan): reading it unpickles yolov5's model classes, so after the shims, and the
    later rows read the LR and epochs it resolves. Returns the context, the rows' report, AMP and the take-up record."""
    device = resolve_device(plan["device"], torch.cuda.is_available())
    cuda = device != "cpu"
    bf16 = torch.cuda.is_bf16_supported() if cuda and plan["amp"] == "bf16" else None
    amp = decide_amp(plan["amp"], cuda, plan.get("amp_source", "config"), bf16_supported=bf16)
    engine = EngineContext(
        plan,
        device,
        amp["amp"],
        None,
        amp_dtype=amp["dtype"],
        torch=torch,
        continuation=Continuation(plan["weights"] if plan.get("continues") else None, plan.get("optimizer", "SGD")),
        started_at=started_at,
        **engine_settings(plan),
    )
    patches = apply_patches(engine, phases=("process",))
    taken_up = take_up_plan(plan, torch)
    from yolov5.utils.callbacks import Callbacks

    engine.callbacks = Callbacks()  # never yolov5's shared default instance
    return engine, patches + apply_patches(engine, phases=("source", "module")), amp, taken_up


def take_up_plan(plan: dict, torch) -> dict | None:
    """For a stage that continues the previous one: read what it handed over (stagedyolo.engine.continuation) and
    complete the plan with it, in place: the learning rate to start at (unless the stage named its own lr0), the
    epochs trained so far and the seed its random draws start from. Returns the record for stage.json, or None for
    a stage that starts a training."""
    plan["recipe_epochs_before"] = 0
    if not plan.get("continues"):
        return None
    handover = read_handover(plan["weights"], torch)
    plan["recipe_epochs_before"] = handover["recipe_epochs"]
    if handover["val_img"] == trained_img(plan.get("val_img") or plan["img"]):  # else not comparable
        plan["fitness_before"] = handover["fitness"]
    if plan.get("lr_from_previous"):
        plan["hyp"]["lr0"] = handover["lr"]
    # train.py seeds the sampler's shuffles and the augmentations from opt.seed at its start: at one seed, every
    # stage would replay the first stage's epochs in the same order with the same augmentations. A continuing stage
    # draws from the seed (yolov5's default 0) plus the epochs already trained; build_opt passes it on as an option.
    options = plan.setdefault("options", {})
    options["seed"] = options.get("seed", 0) + handover["recipe_epochs"]
    return {
        "from": plan["weights"],
        "lr0": plan["hyp"]["lr0"],
        "lr0_source": "the previous stage's handover" if plan.get("lr_from_previous") else "the stage's own lr0",
        "recipe_epochs_before": handover["recipe_epochs"],
        "seed": options["seed"],
        "warmup": "none: it ran once, in the first stage",
        "autoanchor": "off: it ran once, in the first stage",
    }


def resolve_device(device: str, cuda_available: bool, env: Mapping[str, str] | None = None) -> str:
    """The yolov5 --device string: '' (the first visible CUDA device(s)), 'cpu', or CUDA indices such as '0,1'.

    yolov5's select_device writes explicit indices into CUDA_VISIBLE_DEVICES, replacing the GPUs a scheduler assigned
    ("1" under "4,5" would train on physical GPU 1). The stage launcher maps them onto the visible GPUs itself
    (launch.stage_gpu_env) and marks the result (STAGE_DEVICES_ENV); under it, explicit indices become ''.
    """
    env = os.environ if env is None else env
    device = str(device).strip().lower()
    if device == "auto":
        return "" if cuda_available else "cpu"
    if device == "cuda":
        # Not "0": yolov5 writes --device into CUDA_VISIBLE_DEVICES, which would override the scheduler's choice.
        return ""
    narrowed = env.get(STAGE_DEVICES_ENV)
    if explicit_gpu_indices(device) and narrowed is not None and narrowed == env.get("CUDA_VISIBLE_DEVICES"):
        return ""  # the visible GPUs are exactly the ones the setting named, in its order
    return device


def build_opt(train, plan: dict, device: str):
    """yolov5's argparse options for this plan. parse_opt reads the caller's sys.argv, so it is emptied."""
    argv, sys.argv = sys.argv, sys.argv[:1]
    try:
        opt = train.parse_opt(known=True)
    finally:
        sys.argv = argv
    work_dir = Path(plan["work_dir"])
    if plan.get("resume_from"):
        # resume reloads the interrupted run's opt.yaml (same plan: the supervisor checked its digest).
        opt.resume = plan["resume_from"]
        return opt
    hyp_path = work_dir / "stage_hyp.yaml"
    import yaml

    hyp_path.write_text(yaml.safe_dump(plan["hyp"], sort_keys=False))
    opt.data = plan["data"]
    opt.weights = plan["weights"] or ""  # absolute or '': a relative path goes to the HF hub first
    opt.cfg = "" if plan["weights"] else plan["cfg"]  # a checkpoint carries its own model yaml
    opt.hyp = str(hyp_path)
    opt.epochs = plan["epochs"]
    opt.batch_size = plan["batch"]
    opt.imgsz = plan["img"]
    opt.device = device
    opt.workers = plan["workers"]
    opt.project, opt.name, opt.exist_ok = str(work_dir.parent), work_dir.name, True
    opt.freeze = [plan["freeze"]]
    opt.cache = plan["cache"]
    opt.noplots = not plan["plots"]
    opt.nosave = plan["nosave"]
    opt.sync_bn = plan["sync_bn"]
    opt.optimizer = plan.get("optimizer", "SGD")
    # The stage's yolov5 options, under yolov5's names (options.YOLOV5_OPTIONS). patience reaches the EarlyStopping
    # that train.py builds from opt, which the epoch_stop row replaces with EpochStop (validated epochs only).
    opt.patience = 0  # an older plan without options: never stop early
    for key, value in plan.get("options", {}).items():
        if not hasattr(opt, key):  # a yolov5 other than 7.0.14 renamed it: fail instead of silently ignoring it
            raise RuntimeError(f"yolov5's train.py has no option {key!r}: stagedyolo supports yolov5==7.0.14")
        setattr(opt, key, value)
    return opt


if __name__ == "__main__":
    try:
        code = main(sys.argv[1])
    except SystemExit:
        raise
    except BaseException:
        traceback.print_exc()
        code = 1
    compat.skip_exit_collection()  # outcome.json, timing_raw.json and the checkpoints are written and closed
    sys.exit(code)
