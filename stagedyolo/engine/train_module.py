"""yolov5's train.py compiled from its own source with the patch table's source edits (stagedyolo.engine.patches).

The two hard-coded step-count constants made settable per stage are such edits; train.py 7.0 fixes,
inside `train()`:
- `nbs = 64`: gradients accumulate until 64 images per optimizer step. On a dataset of a few hundred images that
  is 4 optimizer steps per epoch at batch 16; a stage of a few epochs barely moves.
- `nw = max(round(warmup_epochs * nb), 100)`: warmup lasts at least 100 iterations, so `warmup_epochs` cannot
  shorten it and a short stage on a small dataset never leaves warmup.
Neither is an option, so the module is compiled from yolov5's own source with those two expressions replaced by
names the patch table supplies. Every replacement must match exactly once: a different train.py fails loudly here
instead of training with silently unpatched constants. Defaults (64, 100) reproduce yolov5 exactly.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path


def patched_source(source: str, edits) -> str:
    """`source` with each (old, new) of `edits` replaced; every old text must occur exactly once."""
    for old, new in edits:
        count = source.count(old)
        if count != 1:
            raise RuntimeError(
                f"yolov5's train.py has {count} occurrence(s) of {old!r}, expected 1: stagedyolo supports the "
                "packaged yolov5 7.0.14 (pip install 'yolov5==7.0.14')"
            )
        source = source.replace(old, new)
    return source


def load_train(edits=(), names: dict | None = None):
    """Import `yolov5.train` compiled from its source with `edits` applied and `names` defined in it; returns it.

    The edits and names are the patch table's source rows (stagedyolo.engine.patches). It replaces
    `yolov5.train` in sys.modules, so it is called once, before anything else imports yolov5.train (the worker
    is one process per stage for this reason, among others).
    """
    spec = importlib.util.find_spec("yolov5.train")
    path = Path(spec.origin)
    module = types.ModuleType("yolov5.train")
    module.__file__, module.__package__, module.__spec__ = str(path), "yolov5", spec
    module.__dict__.update(names or {})
    source = patched_source(path.read_text(encoding="utf-8"), edits)
    code = compile(source, str(path), "exec")  # tracebacks keep the path
    sys.modules["yolov5.train"] = module
    try:
        exec(code, module.__dict__)
    except BaseException:
        del sys.modules["yolov5.train"]
        raise
    import yolov5

    yolov5.train = module
    return module
