"""A short engine job run in Snakemake's own script process (export, test evaluation), not a stage process.

It needs what a stage process gets: the offline environment set before yolov5 is imported (ultralytics reads
YOLO_OFFLINE at import), the patch table's process rows, a deliberate torch thread count, and yolov5's chatter in
the job's log rather than on the console (yolov5's LOGGER writes to the stdout it saw at import, so the redirect is
at the file descriptor level and also catches C-level warnings).
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

from stagedyolo.engine.offline import engine_environment
from stagedyolo.engine.patches import apply_job_patches


@contextlib.contextmanager
def engine_job(engine_home: str | os.PathLike, log_path: str | os.PathLike, threads: int, rows: tuple[str, ...] = ()):
    """Run the body offline, with `threads` torch threads, its output appended to `log_path`. Yields the records of
    the patch rows it applied (the process rows and ``rows``), for the job's own record."""
    os.environ.update(engine_environment(engine_home, base={}))
    os.environ["OMP_NUM_THREADS"] = str(threads)
    patches = apply_job_patches(rows)
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(log_path, "a") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            import torch

            torch.set_num_threads(threads)
            yield patches
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
