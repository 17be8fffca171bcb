"""The probe's stage loop does the work of train.py's training step, call for call: the probe predicts each stage's
images/s from its own loop (stagedyolo.probe.child.measure_stage_run), so a call train.py's step makes and the
probe's does not (or the reverse) would make the prediction drift from the stage it predicts. Read from the source
of both, not timed: a new yolov5 step, or a probe step that loses a call, fails here with the call's name."""

import ast
import inspect
import textwrap

from stagedyolo.engine.options import yolov5_dir
from stagedyolo.probe import child

# What train.py's step calls that the probe's does not, and why no tensor work is left out.
ONLY_IN_TRAIN_PY = {
    "enumerate": "warmup: each param group's LR and momentum (Python floats)",
    "np.interp": "warmup: the LR, momentum and accumulate (Python floats)",
    "np.interp(ni, xi, [1, nbs / batch_size]).round": "warmup: accumulate",
    "lf": "warmup: the scheduler's factor",
    "max": "warmup's accumulate and multi_scale's size (Python numbers)",
    "int": "multi_scale's size",
    "random.randrange": "multi_scale: a stage option whose cost the probe does not model",
    "math.ceil": "multi_scale",
    "nn.functional.interpolate": "multi_scale",
    "torch.cuda.amp.autocast": "the probe enters torch.autocast, the same context under its current name",
}
# What the probe's step calls that train.py's does not.
ONLY_IN_THE_PROBE = {
    "next": "the probe draws its batches itself (train.py's for loop)",
    "torch.autocast": "train.py's torch.cuda.amp.autocast",
    "torch.cuda.synchronize": "on CUDA the timed step waits for the GPU",
}


def calls(tree: ast.AST) -> set[str]:
    return {ast.unparse(node.func) for node in ast.walk(tree) if isinstance(node, ast.Call)}


def train_py_step() -> ast.AST:
    """train.py's step: from the batch's conversion to float to the optimizer step and the EMA update."""
    source = (yolov5_dir() / "train.py").read_text()
    start = source.index("            imgs = imgs.to(device, non_blocking=True)")
    return ast.parse(textwrap.dedent(source[start : source.index("            # Log", start)]))


def probe_step() -> ast.AST:
    tree = ast.parse(textwrap.dedent(inspect.getsource(child.measure_stage_run)))
    return next(node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) and node.name == "train_step")


def test_the_probes_step_calls_what_train_pys_step_calls():
    train, probe = calls(train_py_step()), calls(probe_step())
    assert train - probe == set(ONLY_IN_TRAIN_PY)
    assert probe - train == set(ONLY_IN_THE_PROBE)
