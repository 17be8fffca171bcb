"""Giving YOLOv5's init_process_group a bounded timeout (it passes none, so torch's default applies)."""

from __future__ import annotations

import functools
import os
from datetime import timedelta
from types import ModuleType

from .command import DDP_TIMEOUT_ENV


def bound_init_process_group_timeout(
    timeout_s: float | None = None, dist: ModuleType | None = None
) -> timedelta | None:
    """Make ``dist.init_process_group`` default to ``timeout_s`` (else $STAGEDYOLO_DDP_TIMEOUT_S); return it.

    Call it in each rank before YOLOv5's train.main. YOLOv5 calls ``dist.init_process_group(backend=...)``
    through the module attribute, so replacing the attribute is enough; a timeout the caller passes explicitly
    still wins. The timeout bounds every later collective too, so it must cover rank 0's validation and
    checkpoint save, during which the other ranks wait. With nothing configured (not under build_stage_command)
    it changes nothing and returns None. Calling it twice does not wrap twice.
    """
    if timeout_s is None:
        configured = os.environ.get(DDP_TIMEOUT_ENV)
        if not configured:
            return None
        timeout_s = float(configured)
    if timeout_s <= 0:
        raise ValueError(f"the DDP timeout must be a positive number of seconds, not {timeout_s}")
    if dist is None:
        import torch.distributed as dist
    timeout = timedelta(seconds=timeout_s)
    original = getattr(dist.init_process_group, "__wrapped__", dist.init_process_group)

    @functools.wraps(original)
    def init_process_group_with_timeout(*args, **kwargs):
        timeout_given = len(args) >= 3 or kwargs.get("timeout") is not None  # (backend, init_method, timeout)
        if not timeout_given:
            kwargs["timeout"] = timeout
        return original(*args, **kwargs)

    dist.init_process_group = init_process_group_with_timeout
    return timeout
