"""yolov5 7.0's constants and formulas that stagedyolo reasons with, written once.

A leaf: it imports nothing of stagedyolo and not yolov5 itself (importing yolov5 costs seconds), so the recipe, the
probe, telemetry and the diagnosis can all read it. Each value is the one in the packaged yolov5 7.0.14.
"""

from __future__ import annotations

import math

# train.py's `nbs`: gradients accumulate until this many images per optimizer step.
NOMINAL_BATCH = 64
# train.py's warmup floor: `nw = max(round(warmup_epochs * nb), 100)` iterations.
MIN_WARMUP_ITERS = 100
# The largest stride of the yolov5 detection models: check_img_size rounds an image size up to a multiple of it.
MAX_STRIDE = 32
# The finest stride of the yolov5 detection models (the P3 output): a box under this many pixels at the training size
# spans less than one cell of the finest grid.
MIN_STRIDE = 8
# results.csv's column of the validated mAP at IoU 0.5.
MAP50_COLUMN = "metrics/mAP_0.5"


def accumulate(batch: int, nominal_batch: int = NOMINAL_BATCH) -> int:
    """Batches per optimizer step: train.py's `accumulate = max(round(nbs / batch_size), 1)`."""
    return max(round(nominal_batch / batch), 1)


def trained_img(img: int, stride: int = MAX_STRIDE) -> int:
    """The image size yolov5 really trains and exports at: check_img_size rounds up to a multiple of the stride."""
    return math.ceil(img / stride) * stride
