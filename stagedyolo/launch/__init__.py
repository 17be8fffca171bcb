"""Launching a training stage on 1 or N GPUs and making sure all of its processes end (docs/ddp.md)."""

from .command import (
    DDP_TIMEOUT_ENV,
    DEFAULT_DDP_TIMEOUT_S,
    STAGE_DEVICES_ENV,
    LaunchError,
    build_stage_command,
    check_total_batch,
    explicit_gpu_indices,
    stage_gpu_env,
    threads_per_rank,
    visible_gpus,
    yolov5_device,
)
from .ddp_timeout import bound_init_process_group_timeout
from .lr import LR_SCALING_MODES, scaled_lr0, yolov5_accumulate
from .owner import OWNER_FILE, FolderOwned, owning
from .parent_watch import exit_when_job_starter_dies, exit_when_parent_dies, parent_death_preexec
from .ports import free_port
from .supervisor import SupervisedResult, run_supervised, start_session, supervise

__all__ = [
    "DDP_TIMEOUT_ENV",
    "DEFAULT_DDP_TIMEOUT_S",
    "LR_SCALING_MODES",
    "OWNER_FILE",
    "STAGE_DEVICES_ENV",
    "FolderOwned",
    "LaunchError",
    "SupervisedResult",
    "bound_init_process_group_timeout",
    "build_stage_command",
    "check_total_batch",
    "exit_when_job_starter_dies",
    "exit_when_parent_dies",
    "explicit_gpu_indices",
    "free_port",
    "owning",
    "parent_death_preexec",
    "run_supervised",
    "scaled_lr0",
    "stage_gpu_env",
    "start_session",
    "supervise",
    "threads_per_rank",
    "visible_gpus",
    "yolov5_accumulate",
    "yolov5_device",
]
