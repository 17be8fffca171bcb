"""The command line and environment that start one training stage on 1 or N GPUs, on one node or several
(see docs/ddp.md)."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

from .errors import LaunchError
from .nodes import NodeLayout, slurm_layout, srun_command, srun_environment

# Read by bound_init_process_group_timeout() in each rank: YOLOv5 calls init_process_group without a timeout.
DDP_TIMEOUT_ENV = "STAGEDYOLO_DDP_TIMEOUT_S"
# Long enough for rank 0 to validate and save while the other ranks wait in their next collective; NCCL's own
# default (10 min in torch 2.x) can be shorter than a large validation set takes.
DEFAULT_DDP_TIMEOUT_S = 30 * 60
# How long torchrun waits after SIGTERM before it SIGKILLs the ranks (its own default is 30 s).
DEFAULT_RANK_SHUTDOWN_S = 5
# Set beside CUDA_VISIBLE_DEVICES when the launcher narrowed it to exactly the stage's GPUs: the worker then names no
# GPU ids to yolov5 (engine.worker.resolve_device), whose select_device would write them into CUDA_VISIBLE_DEVICES.
STAGE_DEVICES_ENV = "STAGEDYOLO_STAGE_DEVICES"


def visible_gpus(env: Mapping[str, str] | None = None) -> list[str] | None:
    """The GPU ids the scheduler left visible (CUDA_VISIBLE_DEVICES), in order; None when it is unset.

    Like CUDA, the list ends at the first entry that is not a device ("-1" hides every GPU). Ids may be indices
    or UUIDs (GPU-..., MIG-...).
    """
    env = os.environ if env is None else env
    raw = env.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return None
    ids: list[str] = []
    for entry in (part.strip() for part in raw.split(",")):
        if not entry or entry.startswith("-"):
            break
        ids.append(entry)
    return ids


def explicit_gpu_indices(device: str | None) -> list[int] | None:
    """The CUDA indices a device setting names ('0', '0,1'), or None for 'auto', 'cuda', 'cpu' and the like."""
    parts = [part.strip() for part in str(device or "").split(",")]
    if not all(part.isdigit() for part in parts):
        return None
    return [int(part) for part in parts]


def stage_gpu_env(
    gpus: int, env: Mapping[str, str], stage: str = "<stage>", device: str | None = None
) -> dict[str, str]:
    """CUDA_VISIBLE_DEVICES for the stage: the GPUs an explicit ``device`` ('1', '0,2') names among the visible ones,
    else the first ``gpus`` of the scheduler's set, or 0..gpus-1 when it is unset. Indices count the visible GPUs, as
    torch's cuda:N does, so "device: 1" under the scheduler's "4,5" is GPU 5, never physical GPU 1."""
    if gpus == 0:
        return {}
    visible = visible_gpus(env)
    scheduler_set = f"CUDA_VISIBLE_DEVICES={env.get('CUDA_VISIBLE_DEVICES')!r}"
    indices = explicit_gpu_indices(device)
    if indices is None:
        if visible is not None and len(visible) < gpus:
            raise LaunchError(
                f"stages.{stage}.gpus is {gpus} but {scheduler_set} leaves {len(visible)} visible: request {gpus} "
                f"GPUs from the scheduler (Snakemake: resources gpu={gpus})"
            )
        indices = list(range(gpus))
    elif len(indices) < gpus:
        raise LaunchError(
            f"stages.{stage}.device {device!r} names {len(indices)} GPU(s) but gpus is {gpus}: name "
            f"{gpus} indices, or use device: cuda for the first {gpus} visible ones"
        )
    indices = indices[:gpus]
    if visible is None:  # nothing hidden: the indices are CUDA's own
        chosen = [str(index) for index in indices]
    else:
        missing = [index for index in indices if index >= len(visible)]
        if missing:
            raise LaunchError(
                f"stages.{stage}.device {device!r}: GPU index {missing[0]} is not among the {len(visible)} that "
                f"{scheduler_set} leaves visible (indices count the visible GPUs)"
            )
        chosen = [visible[index] for index in indices]
    return {"CUDA_VISIBLE_DEVICES": ",".join(chosen), STAGE_DEVICES_ENV: ",".join(chosen)}


def thread_budget(env: Mapping[str, str]) -> int:
    """The cores a stage's job may use on its node: OMP_NUM_THREADS when the caller set it (Snakemake sets it to the
    rule's ``threads``), else the CPUs this process may run on."""
    try:
        return int(env.get("OMP_NUM_THREADS", ""))
    except ValueError:
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def threads_per_rank(gpus: int, env: Mapping[str, str]) -> int:
    """OMP threads for each rank: the job's thread budget on its node (thread_budget) split over the node's ranks,
    at least 1. Without a split, N ranks each start one thread per core and fight over them."""
    return max(1, thread_budget(env) // max(gpus, 1))


def check_total_batch(batch: int, gpus: int, stage: str = "<stage>") -> None:
    """Reject a total batch that DDP cannot split evenly over ``gpus`` ranks."""
    if gpus <= 1:
        return
    if batch <= 0:
        raise LaunchError(
            f"stages.{stage}.batch {batch} is not allowed with {gpus} GPUs: YOLOv5's AutoBatch (-1) does not work "
            f"under DDP, give a total batch that is a multiple of {gpus}"
        )
    if batch % gpus:
        lower = batch // gpus * gpus
        choices = f"{lower} or {lower + gpus}" if lower else str(lower + gpus)
        raise LaunchError(
            f"stages.{stage}.batch {batch} is the total batch over {gpus} GPUs and must be a multiple of {gpus}: "
            f"use {choices}"
        )


def build_stage_command(
    worker_args: Sequence[str],
    gpus: int,
    batch: int,
    *,
    nodes: int = 1,
    python: str = sys.executable,
    env: Mapping[str, str] | None = None,
    port: int | None = None,
    stage: str = "<stage>",
    device: str | None = None,
    ddp_timeout_s: int = DEFAULT_DDP_TIMEOUT_S,
    rank_shutdown_s: int = DEFAULT_RANK_SHUTDOWN_S,
    log_dir: str | os.PathLike | None = None,
) -> tuple[list[str], dict[str, str]]:
    """The argv and environment that run ``python *worker_args`` for one stage: directly for one process, through
    torchrun when gpus > 1, and through srun starting torchrun on each node when nodes > 1.

    ``worker_args`` is what follows ``python`` for a single process, e.g. ``["-m", "stagedyolo.engine.worker",
    "plan.json"]``. ``gpus`` counts GPUs (ranks) per node, and ``batch`` is the stage's total batch over all
    ``nodes * gpus`` ranks. One node: with ``port=None`` the rendezvous store binds port 0, so the OS picks a free
    port at the moment it listens and two stages on one host cannot race for it. Several nodes: the stage runs in a
    SLURM allocation and the port is fixed in advance (nodes.rendezvous_port). ``device``: the stage's device
    setting; explicit indices choose its GPUs among the visible ones (stage_gpu_env), on every node alike.
    ``log_dir``: where torchrun keeps its per-run folder (the stage's own work folder); without it torchrun makes a
    ``torchelastic_*`` folder in the system's temporary directory and leaves it there.
    """
    if not worker_args:
        raise LaunchError("worker_args is empty: pass at least ['-m', 'stagedyolo.engine.worker', <plan>]")
    if gpus < 0:
        raise LaunchError(f"stages.{stage}.gpus must be 0 (CPU) or more, not {gpus}")
    if nodes < 1 or (nodes > 1 and gpus < 1):
        raise LaunchError(f"stages.{stage}.nodes is {nodes}: use 1, or more with gpus of 1 or more on each node")
    check_total_batch(batch, nodes * gpus, stage)

    scheduler_env = dict(os.environ if env is None else env)
    child_env = dict(scheduler_env)
    child_env.update(stage_gpu_env(gpus, child_env, stage, device))
    child_env["OMP_NUM_THREADS"] = str(threads_per_rank(gpus, child_env))
    if gpus <= 1 and nodes == 1:
        return [python, *worker_args], child_env

    child_env[DDP_TIMEOUT_ENV] = str(int(ddp_timeout_s))
    # 1 = a collective that times out or fails tears the rank down instead of leaving it hung (NCCL).
    child_env.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    # An environment variable rather than --shutdown-timeout: older torchrun versions reject the flag.
    child_env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] = str(int(rank_shutdown_s))
    if nodes == 1:
        endpoint = f"127.0.0.1:{0 if port is None else port}"
        return _torchrun_argv(python, worker_args, gpus, endpoint, log_dir=log_dir), child_env
    layout = slurm_layout(nodes, scheduler_env, stage, port)
    agent = _torchrun_argv(python, worker_args, gpus, layout.endpoint, layout, log_dir)
    return [*srun_command(layout, thread_budget(scheduler_env)), *agent], srun_environment(child_env)


def _torchrun_argv(
    python: str,
    worker_args: Sequence[str],
    gpus: int,
    endpoint: str,
    layout: NodeLayout | None = None,
    log_dir: str | os.PathLike | None = None,
) -> list[str]:
    """One torchrun agent: ``gpus`` ranks on its node; with a layout, one of the layout's agents, which meet at its
    endpoint under the job's id (the agents of one stage, never another job's that reuses the port)."""
    rendezvous = ["--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint]
    if layout:
        rendezvous += ["--rdzv-id", layout.job_id]
    logs = [] if log_dir is None else ["--log-dir", str(log_dir)]  # each agent makes its own folder inside
    return [
        python,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        str(layout.nodes if layout else 1),
        "--nproc-per-node",
        str(gpus),
        *rendezvous,
        # A failed rank fails the stage; retrying is Snakemake's job (--retries), not torchrun's.
        "--max-restarts",
        "0",
        *logs,
        *worker_args,
    ]
