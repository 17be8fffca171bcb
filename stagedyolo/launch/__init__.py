"""Launching a training stage on 1 or N GPUs, on one node or several, and making sure all of its processes end
(docs/ddp.md)."""

from .command import (
    DDP_TIMEOUT_ENV,
    DEFAULT_DDP_TIMEOUT_S,
    STAGE_DEVICES_ENV,
    LaunchError,
    build_stage_command,
    check_total_batch,
    explicit_gpu_indices,
    stage_gpu_env,
    thread_budget,
    threads_per_rank,
    visible_gpus,
)
from .ddp_timeout import bound_init_process_group_timeout
from .nodes import RDZV_HOST_ENV, RDZV_PORT_ENV, NodeLayout, expand_hostlist, rendezvous_port, slurm_layout
from .owner import OWNER_FILE, FolderOwned, owning
from .parent_watch import exit_when_job_starter_dies, exit_when_parent_dies, parent_death_preexec
from .supervisor import SupervisedResult, run_supervised, start_session, supervise

__all__ = [
    "DDP_TIMEOUT_ENV",
    "DEFAULT_DDP_TIMEOUT_S",
    "OWNER_FILE",
    "RDZV_HOST_ENV",
    "RDZV_PORT_ENV",
    "STAGE_DEVICES_ENV",
    "FolderOwned",
    "LaunchError",
    "NodeLayout",
    "SupervisedResult",
    "bound_init_process_group_timeout",
    "build_stage_command",
    "check_total_batch",
    "exit_when_job_starter_dies",
    "exit_when_parent_dies",
    "expand_hostlist",
    "explicit_gpu_indices",
    "owning",
    "parent_death_preexec",
    "rendezvous_port",
    "run_supervised",
    "slurm_layout",
    "stage_gpu_env",
    "start_session",
    "supervise",
    "thread_budget",
    "threads_per_rank",
    "visible_gpus",
]
