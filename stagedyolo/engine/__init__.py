"""The engine adapter: the one place that knows how the packaged YOLOv5 v7.0 train.py behaves.

- `patches`: the one table of every change to yolov5's behaviour (and `engine.mode`), applied by `apply_patches`.
- `offline`: the process environment that keeps yolov5/ultralytics from reaching the network.
- `compat`: in-process shims for current numpy, Pillow and torch (rows of the patch table), and the quick end of
  every process that loaded torch (`skip_exit_collection`).
- `options`: yolov5's hyperparameters and train.py options as a stage sets them (the plan itself is built by
  `stagedyolo.stage_plan`).
- `amp`: the one AMP policy, for the probe's recommendation and the stage's decision.
- `continuation`: what a stage hands to the next so that the stages are one training, and how it is taken up.
- `hooks`: callbacks plugged into yolov5 (validation period, NaN guard, test-only fault injection; rows too).
- `stopping`: ending a stage early at an epoch boundary (patience on validated epochs, time budget, stall).
- `trial`: a tune trial's measuring window inside the worker.
- `train_module`: yolov5's train.py compiled with the table's source edits (nominal batch, warmup floor...).
- `checkpoint`: the epoch a checkpoint holds (-1 once yolov5 finished and stripped it).
- `worker`: the entry point of the stage process (`python -m stagedyolo.engine.worker plan.json`).
- `job`: a short engine job (export, test evaluation) run in Snakemake's own script process.
"""
