"""Stage telemetry: StageTimer (worker, via yolov5 callbacks), Sampler (supervisor thread -> telemetry.csv),
build_timing/write_timing (-> timing.json + timing.md). Importing this package does not import torch."""

from .sampler import Sampler
from .summary import build_timing, effective_batch, timing_markdown, validate_timing, write_timing
from .timer import StageTimer

__all__ = [
    "StageTimer",
    "Sampler",
    "build_timing",
    "write_timing",
    "validate_timing",
    "timing_markdown",
    "effective_batch",
]
