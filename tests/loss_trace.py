"""Per-step losses of one training run, for tests: `python tests/loss_trace.py worker|bare plan.json out.json`.

worker: the stage process (stagedyolo.engine.worker) on the plan, with the patch table.
bare: yolov5's own, unpatched train.main with the options the worker would pass (worker.build_opt).
Both write yolov5's running mean losses (box, obj, cls) after every batch, as exact floats.
"""

import json
import sys
from pathlib import Path


class LossTrace:
    def __init__(self):
        self.steps = []

    def on_train_batch_end(self, model, ni, imgs, targets, paths, mloss):
        self.steps.append([float(v) for v in mloss])


def bare(plan_path: str, trace: LossTrace) -> None:
    import torch

    plan = json.loads(Path(plan_path).read_text())
    torch.set_num_threads(plan["torch_threads"])
    import yolov5.train as train
    from yolov5.utils.callbacks import Callbacks

    from stagedyolo.engine.hooks import register
    from stagedyolo.engine.worker import build_opt

    callbacks = Callbacks()
    register(trace, callbacks)
    train.main(build_opt(train, plan, "cpu"), callbacks)


def main(kind: str, plan_path: str, out: str) -> int:
    trace = LossTrace()
    if kind == "worker":
        from stagedyolo.engine import worker

        rc = worker.main(plan_path, plugins=[trace])
    else:
        bare(plan_path, trace)
        rc = 0
    Path(out).write_text(json.dumps(trace.steps))
    return rc


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
