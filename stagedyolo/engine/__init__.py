"""The engine adapter: the one place that knows how the packaged YOLOv5 v7.0 train.py behaves.

- `patches`: the one table of every change to yolov5's behaviour (and `engine.mode`), applied by `apply_patches`.
- `offline`: the process environment that keeps yolov5/ultralytics from reaching the network.
- `compat`: in-process shims for current numpy, Pillow and torch (rows of the patch table), and the quick end of
  every process that loaded torch (`skip_exit_collection`).
- `plan`: a stage spec from config, resolved into everything one yolov5 run needs.
- `hooks`: callbacks plugged into yolov5 (validation period, NaN guard, test-only fault injection; rows too).
- `train_module`: yolov5's train.py compiled with the table's source edits (nominal batch, warmup floor...).
- `checkpoint`: the epoch a checkpoint holds (-1 once yolov5 finished and stripped it).
- `worker`: the entry point of the stage process (`python -m stagedyolo.engine.worker plan.json`).
"""
