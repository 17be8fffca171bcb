"""Shims that let yolov5 7.0.14 run on current numpy, Pillow and torch, and load faster: rows of the patch table
(stagedyolo.engine.patches), which applies them in the stage process.

Each shim restores an API the engine calls and a newer release removed, or defers an import; none changes
behaviour otherwise.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile

# yolov5.utils.plots imports seaborn (and through it scipy.stats) at module level, for label plots that stages draw
# only with `plots: true` and the probe, export and test evaluation never draw: 1.6-1.7 s of every yolov5 process's
# imports on the 2-core demo machine (python -X importtime). Loaded on first use instead.
DEFERRED_IMPORTS = ("seaborn",)


def install() -> None:
    """All four, for a process that uses yolov5 without training a stage (the probe, export, test evaluation)."""
    numpy_trapz()
    pillow_getsize()
    atomic_torch_save()
    defer_plot_imports()


def defer_plot_imports() -> None:
    """Before yolov5 is imported: the DEFERRED_IMPORTS it imports run on their first use (once per process)."""
    if not any(isinstance(finder, DeferredImports) for finder in sys.meta_path):
        sys.meta_path.insert(0, DeferredImports(DEFERRED_IMPORTS))


class DeferredImports:
    """A meta path finder that gives the modules in ``names`` a lazy loader (importlib's LazyLoader): each is
    executed on its first attribute access instead of when imported. Installed before yolov5 is imported, it acts
    only once yolov5 imports them, after torch and torchvision have registered their operators (which inspect
    every loaded module, and would execute a lazy one: correct, only no longer deferred)."""

    def __init__(self, names: tuple[str, ...]):
        self.names = set(names)

    def find_spec(self, name, path=None, target=None):
        if name not in self.names:
            return None
        self.names.discard(name)  # once: the lookup below must reach the real finders, not this one
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return None
        spec.loader = importlib.util.LazyLoader(spec.loader)
        return spec


def numpy_trapz() -> None:
    # numpy 2.4 removed np.trapz (yolov5 metrics.compute_ap); pyproject pins numpy<2.4, this covers a newer one.
    import numpy as np

    if not hasattr(np, "trapz"):
        np.trapz = np.trapezoid


def pillow_getsize() -> None:
    # Pillow 10 removed FreeTypeFont.getsize, used by yolov5's plot annotator.
    from PIL import ImageFont

    if not hasattr(ImageFont.FreeTypeFont, "getsize"):

        def getsize(self, text, *args, **kwargs):
            left, top, right, bottom = self.getbbox(text, *args, **kwargs)
            return right - left, bottom - top

        ImageFont.FreeTypeFont.getsize = getsize


def atomic_torch_save() -> None:
    """yolov5 writes last.pt/best.pt with a plain torch.save: a kill mid-write leaves a corrupt checkpoint.

    Saving to a temporary file in the same folder, then os.replace, means a reader (or a resume) sees either the
    previous complete file or the new complete one, never a torn one. No fsync: it cost ~0.5 s per save here
    (two saves an epoch), and a process kill, the case resume handles, cannot lose data the kernel already has.
    A power loss can: the docs promise recovery from kills, not from power loss.
    """
    import torch

    if getattr(torch.save, "_stagedyolo_atomic", False):
        return
    plain_save = torch.save

    def atomic_save(obj, f, *args, **kwargs):
        if not isinstance(f, (str, os.PathLike)):
            return plain_save(obj, f, *args, **kwargs)
        target = os.fspath(f)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".pt", dir=os.path.dirname(target) or ".")
        try:
            with os.fdopen(fd, "wb") as handle:
                plain_save(obj, handle, *args, **kwargs)
            os.replace(tmp, target)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    atomic_save._stagedyolo_atomic = True
    atomic_save.plain_save = plain_save
    torch.save = atomic_save


def install_onnx_export() -> None:
    """yolov5's export_onnx calls torch.onnx.export(...) without `dynamo`; torch >= 2.9 then takes the dynamo
    exporter, which needs onnxscript and fails inside yolov5's try_export. The TorchScript-based exporter is the one
    yolov5 7.0 was written and tested for, so the export job asks for it."""
    import functools
    import inspect

    import torch

    if "dynamo" not in inspect.signature(torch.onnx.export).parameters:  # torch < 2.5: TorchScript-based only
        return
    if getattr(torch.onnx.export, "_stagedyolo_legacy", False):
        return
    export = functools.partial(torch.onnx.export, dynamo=False)
    export._stagedyolo_legacy = True
    torch.onnx.export = export
