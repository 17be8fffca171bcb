"""The learning rate a stage hands to YOLOv5, and why it is not scaled by default (see docs/ddp.md)."""

from __future__ import annotations

from stagedyolo.engine.train_module import YOLOV5_NOMINAL_BATCH

LR_SCALING_MODES = ("none", "linear")


def yolov5_accumulate(batch: int, nominal_batch: int = YOLOV5_NOMINAL_BATCH) -> int:
    """The gradient-accumulation steps YOLOv5 7.0 uses after warmup (train.py: ``max(round(nbs / batch), 1)``).

    ``batch`` is the total batch over all ranks: YOLOv5 computes this from ``--batch-size`` before splitting it.
    """
    return max(round(nominal_batch / batch), 1)


def scaled_lr0(lr0: float, batch: int, mode: str = "none", nominal_batch: int = YOLOV5_NOMINAL_BATCH) -> float:
    """The ``lr0`` to write into the stage's hyp file for a total ``batch`` under ``lr_scaling: mode``.

    - ``none`` (default): ``lr0`` unchanged. YOLOv5 already normalises to ``nominal_batch`` by accumulating
      gradients and scaling weight decay, and under DDP it multiplies the loss by WORLD_SIZE, so a stage with a
      total batch B on N GPUs takes the same optimizer steps as one GPU with batch B.
    - ``linear``: ``lr0 * effective_batch / nominal_batch`` with ``effective_batch = batch * accumulate``, the
      batch one optimizer step actually sees. That is the factor YOLOv5 applies to weight decay, so LR and weight
      decay move together. Up to 64 accumulation makes the factor about 1 (only the rounding of ``accumulate`` is
      left: 48 -> 0.75, 40 -> 1.25); above 64 it is ``batch / 64``.
    """
    if mode not in LR_SCALING_MODES:
        raise ValueError(f"lr_scaling must be one of {', '.join(LR_SCALING_MODES)}, not {mode!r}")
    if batch <= 0:
        raise ValueError(f"batch must be a positive total batch size, not {batch}")
    if mode == "none":
        return lr0
    effective_batch = batch * yolov5_accumulate(batch, nominal_batch)
    return lr0 * effective_batch / nominal_batch
