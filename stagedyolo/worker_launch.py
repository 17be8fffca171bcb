"""One worker process of a stage or of a tune trial: started under the sampler and the progress relay, and what
build_timing needs to know about the run besides its timer and telemetry. Shared by stagedyolo.stage and
stagedyolo.tune, below both."""

from __future__ import annotations

import subprocess
from pathlib import Path

from stagedyolo.jsonio import write_json
from stagedyolo.launch import build_stage_command, run_supervised
from stagedyolo.progress import ProgressRelay
from stagedyolo.stage_plan import StagePlan
from stagedyolo.telemetry import Sampler

# What timing_meta copies as is: from the plan (the second set may be missing), and from the worker's outcome.
_PLAN_KEYS = ("stage", "batch", "workers", "img", "epochs", "gpus", "val_period", "plots", "nosave", "nominal_batch")
_OPTIONAL_PLAN_KEYS = ("img_decision", "val_img", "time_budget_s", "freeze", "epochs_decision")
_OUTCOME_KEYS = ("amp", "amp_dtype", "amp_reason", "device", "image_cache", "stopped_by", "handover_on_stall")
_ENGINE_KEYS = ("engine_mode", "patches", "sync_every_batches", "compile")


def timing_meta(plan: StagePlan, outcome: dict, attempts: list[dict]) -> dict:
    """What build_timing needs to know about a run besides its timer and telemetry (a stage's or a tune trial's)."""
    return {
        **{key: plan[key] for key in _PLAN_KEYS},
        **{key: plan.get(key) for key in _OPTIONAL_PLAN_KEYS},
        **{key: outcome.get(key) for key in _OUTCOME_KEYS + _ENGINE_KEYS},
        "cache": plan["cache"] or "none",
        "threads": plan["torch_threads"],
        "patience": plan.get("options", {}).get("patience"),
        "attempts": attempts,
        **outcome.get("sampler", {}),
    }


def launch_worker(plan: StagePlan, env: dict, log, work_dir: Path, telemetry_interval: float) -> tuple[int, dict]:
    """Run the worker while the sampler records the host and GPUs; returns its exit code and the sampler's info."""
    plan_path = work_dir / "plan.json"
    write_json(plan_path, plan)
    argv, env = worker_command(plan, plan_path, env)
    samplers = []

    def start_sampler(pid: int) -> None:  # samples the worker's whole process tree, ranks and loaders included
        samplers.append(Sampler(work_dir / "telemetry.csv", interval_s=telemetry_interval, root_pid=pid).start())

    try:
        # run_supervised: the stage's own process group, signals forwarded, no rank or loader worker left behind.
        # The relay shows each epoch's progress line on our stderr (Snakemake's console); the worker's goes to the log.
        with ProgressRelay(work_dir):
            returncode = run_supervised(argv, env, stdout=log, stderr=subprocess.STDOUT, on_start=start_sampler)
    finally:
        for sampler in samplers:
            sampler.stop()
    return returncode, samplers[0].info() if samplers else {}


def worker_command(plan: StagePlan, plan_path: Path, env: dict) -> tuple[list[str], dict]:
    """The worker's argv and environment: on the GPUs the stage's device names among the visible ones (explicit
    indices count the scheduler's GPUs; the worker then names none to yolov5, which would overwrite the variable),
    on each of the plan's nodes (one torch.distributed.run per node of the SLURM allocation)."""
    gpus = 0 if plan["device"] == "cpu" else plan["gpus"]
    return build_stage_command(
        ["-m", "stagedyolo.engine.worker", str(plan_path)],
        gpus,
        plan["batch"],
        nodes=plan.get("nodes", 1),
        env=env,
        stage=plan["stage"],
        device=plan["device"],
        log_dir=plan_path.parent / "torchrun",
    )
