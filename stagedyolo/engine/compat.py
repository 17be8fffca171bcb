"""Shims that let yolov5 7.0.14 run on current numpy, Pillow and torch, and load and exit faster: rows of the patch
table (stagedyolo.engine.patches), which applies them in the stage process, and `skip_exit_collection` for the end
of every process that loaded them.

Each shim restores an API the engine calls and a newer release removed, defers an import, or spares a cost yolov5
pays for nothing it uses (source lines read for a filename); none changes behaviour otherwise.
"""

from __future__ import annotations

import functools
import gc
import importlib.util
import inspect
import os
import sys
import types
import warnings
from pathlib import Path

# Modules every yolov5 process imports at module level and a stage uses only in cases it may never reach; each runs
# on its first use instead. Seconds are cumulative import times on the 2-core demo machine (python -X importtime):
# - seaborn (and through it scipy.stats), 1.6-1.7 s: yolov5.utils.plots, for label plots drawn only with `plots: true`;
# - matplotlib.pyplot, 0.4-0.5 s: yolov5.utils.metrics and .plots, for plots likewise (matplotlib itself, which
#   yolov5 configures at import, loads as before);
# - requests, 0.24-0.29 s: yolov5.models.common and .utils.downloads, for URLs and downloads none of them makes (a
#   stage executes it all the same: train.py imports roboflow, which imports requests.exceptions);
# - boto3, 0.45-0.48 s: TensorBoard's file layer, for s3:// log paths.
DEFERRED_IMPORTS = ("seaborn", "matplotlib.pyplot", "requests", "boto3")
# yolov5.utils.general reads source lines through inspect twice for a filename: as it is imported, inspect.stack()
# (to decide whether to replace cv2.imread & co.), and in print_args (train.main's first log line),
# inspect.getframeinfo. On the 2-core demo machine: imports 8.9 -> 8.1 s, print_args 1.4 -> 0.0 s
# (benchmarks/results/process_overhead.md; most of print_args's 1.4 s was seaborn, which a deferred module no longer
# executes for such a search: MODULE_IDENTITY).
SOURCELESS_INSPECT_MODULE = "yolov5.utils.general"
# torchvision 0.29's ops/roi_align.py imports torch._dynamo at its top (torch.fx's symbolic shapes, sympy, FSDP) for
# one check inside roi_align(), which yolov5 never calls; every yolov5 process imports it through torchvision.ops.
# Executed with that import moved into the check, torch._dynamo loads on the first roi_align call or whatever else
# needs it, not at import. torch 2.14's optimizers import it when built and at each step, so a process that trains
# (a stage, the probe) still loads it, before its first step; the export and the test evaluation never do.
LAZY_DYNAMO_MODULE = "torchvision.ops.roi_align"
DYNAMO_IMPORT = "from torch._dynamo.utils import is_compile_supported\n"
DYNAMO_ON_CALL = """\
def is_compile_supported(device_type):  # stagedyolo: torch._dynamo is imported on the first call
    from torch._dynamo.utils import is_compile_supported as supported

    return supported(device_type)
"""

# torch 2.14 imports its compiler (torch._dynamo, 1.7-1.9 s on the 2-core demo machine) into every process that
# trains, for calls that only act while the compiler traces: torch.optim's step wrapper (_use_grad_for_differentiable)
# calls torch._dynamo.graph_break() around every step, its _disable_dynamo wrappers (add_param_group, zero_grad,
# state_dict, load_state_dict) wrap the method in torch._dynamo.disable on first call, and use_deterministic_algorithms
# (yolov5's init_seeds) imports torch._inductor.config to hand the compiler the flag.
INDUCTOR_CONFIG = "torch._inductor.config"


def quiet_engine_warnings() -> None:
    """Silence the warnings yolov5 raises in every process that trains with it (the stage worker, the probe): its
    torch.cuda.amp.autocast(...) call, made every batch, whose deprecation warning would flood the log, and its
    import of pkg_resources."""
    warnings.filterwarnings("ignore", message=r".*torch\.cuda\.amp\.(autocast|GradScaler).*", category=FutureWarning)
    warnings.filterwarnings("ignore", message="pkg_resources is deprecated", category=UserWarning)


def sourceless_inspect() -> None:
    """Before yolov5 is imported: SOURCELESS_INSPECT_MODULE executes with an inspect.stack() that reads no source,
    and its `inspect` is then sourceless_inspect_module() (once per process)."""
    SourcelessInspectFinder.install((SOURCELESS_INSPECT_MODULE,))


def stack_without_source(context: int = 1) -> list[inspect.FrameInfo]:
    """inspect.stack() without source context (``context`` is ignored): the same frames, filenames (the code's own,
    which inspect.stack also reports for every file that exists), line numbers and function names."""
    frame, frames = sys._getframe(1), []
    while frame is not None:
        code = frame.f_code
        frames.append(inspect.FrameInfo(frame, code.co_filename, frame.f_lineno, code.co_name, None, None))
        frame = frame.f_back
    return frames


def sourceless_inspect_module() -> types.SimpleNamespace:
    """The inspect module, except that stack() and getframeinfo() read no source lines (getframeinfo as with
    context=0: the same filename, line and function)."""
    return types.SimpleNamespace(
        **{
            **vars(inspect),
            "stack": stack_without_source,
            "getframeinfo": functools.partial(inspect.getframeinfo, context=0),
        }
    )


class LoaderWrappingFinder:
    """A meta path finder for the modules in ``names``: the real finders find each one, once, and its loader is
    wrapped in ``wrap_loader`` (a subclass names it)."""

    wrap_loader = None

    def __init__(self, names: tuple[str, ...]):
        self.names = set(names)

    def find_spec(self, name, path=None, target=None):
        if name not in self.names:
            return None
        self.names.discard(name)  # once: the lookup below must reach the real finders, not this one
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return None
        spec.loader = self.wrap_loader(spec.loader)
        return spec

    @classmethod
    def install(cls, names: tuple[str, ...]) -> None:
        """Put one for ``names`` first on sys.meta_path, unless one of this class is there already."""
        if not any(isinstance(finder, cls) for finder in sys.meta_path):
            sys.meta_path.insert(0, cls(names))


class WrappedLoader:
    """A module's real loader, except for exec_module (a subclass's)."""

    def __init__(self, loader):
        self.loader = loader

    def __getattr__(self, attribute):  # create_module, get_source, get_filename...: the real loader's
        return getattr(self.loader, attribute)


class _SourcelessInspectLoader(WrappedLoader):
    def exec_module(self, module):
        stack, inspect.stack = inspect.stack, stack_without_source
        try:
            self.loader.exec_module(module)
        finally:
            inspect.stack = stack
        module.inspect = sourceless_inspect_module()


class SourcelessInspectFinder(LoaderWrappingFinder):
    """Its loader executes the module with inspect.stack replaced by stack_without_source (restored afterwards),
    then gives it sourceless_inspect_module() as its `inspect`."""

    wrap_loader = _SourcelessInspectLoader


def torchvision_source(relative: str) -> str | None:
    """A torchvision file's source, found without importing torchvision (whose import is what a shim may change)."""
    spec = importlib.util.find_spec("torchvision")
    if spec is None or not spec.origin:
        return None
    path = Path(spec.origin).parent / relative
    return path.read_text(encoding="utf-8") if path.exists() else None


def lazy_dynamo_in_torchvision() -> None:
    """Before torchvision is imported: LAZY_DYNAMO_MODULE executes with its torch._dynamo import moved into the check
    that uses it."""
    LazyDynamoFinder.install((LAZY_DYNAMO_MODULE,))


def compiler_left_unloaded() -> None:
    """For a process that never compiles, torch's calls that would import its compiler only for what the compiler
    reads run without it: each torch.optim step sets grad mode as its wrapper does, minus the graph breaks; the
    _disable_dynamo wrappers call their method directly (what they do once dynamo is loaded, outside a trace); and
    use_deterministic_algorithms sets torch's flag, and inductor's copy only where INDUCTOR_CONFIG is imported."""
    import torch

    for cls, name, kind, method in compiler_wrapped_optimizer_methods():
        if kind == "step":
            setattr(cls, name, _grad_mode_step(method, torch))
        else:
            setattr(method, "__dynamo_disable", method)  # the wrapper's cache of the disabled method
    flag_code = getattr(torch.use_deterministic_algorithms, "__code__", None)
    if flag_code is not None and INDUCTOR_CONFIG in flag_code.co_names:  # names a module it imports: torch's own

        def use_deterministic_algorithms(mode: bool, *, warn_only: bool = False) -> None:
            inductor_config = sys.modules.get(INDUCTOR_CONFIG)
            if inductor_config is not None:
                inductor_config.deterministic = mode
            torch._C._set_deterministic_algorithms(mode, warn_only=warn_only)

        torch.use_deterministic_algorithms = use_deterministic_algorithms


def compiler_wrapped_optimizer_methods() -> list[tuple]:
    """(class, name, kind, method) for each method of torch.optim's optimizers that a wrapper still imports
    torch._dynamo for: kind "step" (the step wrapper) or "disable" (a _disable_dynamo wrapper not yet called). The
    wrappers are recognised by their code object, so another torch's wrappers are left as they are."""
    import torch
    from torch.optim import optimizer

    codes = {
        optimizer._use_grad_for_differentiable(lambda self: None).__code__: "step",
        torch._disable_dynamo(lambda: None).__code__: "disable",
    }
    found, classes = [], [optimizer.Optimizer]
    while classes:
        cls = classes.pop()
        classes += cls.__subclasses__()
        for name, attribute in vars(cls).items():
            kind, method = codes.get(getattr(attribute, "__code__", None)), getattr(attribute, "__wrapped__", None)
            if kind and method is not None and getattr(method, "__dynamo_disable", None) is None:
                found.append((cls, name, kind, method))
    return found


def _grad_mode_step(step, torch):
    @functools.wraps(step)
    def grad_mode_step(self, *args, **kwargs):
        grad_enabled = torch.is_grad_enabled()
        try:
            torch.set_grad_enabled(self.defaults["differentiable"])
            return step(self, *args, **kwargs)
        finally:
            torch.set_grad_enabled(grad_enabled)

    return grad_mode_step


class _LazyDynamoLoader(WrappedLoader):
    def exec_module(self, module):
        source = self.loader.get_source(module.__name__)
        if DYNAMO_IMPORT not in (source or ""):  # another torchvision: as it is
            self.loader.exec_module(module)
            return
        edited = source.replace(DYNAMO_IMPORT, DYNAMO_ON_CALL, 1)
        exec(compile(edited, self.loader.get_filename(module.__name__), "exec"), module.__dict__)


class LazyDynamoFinder(LoaderWrappingFinder):
    wrap_loader = _LazyDynamoLoader


def defer_imports() -> None:
    """Before yolov5 is imported: the DEFERRED_IMPORTS it imports run on their first use (once per process)."""
    DeferredImports.install(DEFERRED_IMPORTS)


# What a module has before it executes (the import system sets all but __class__): reading these runs none of its
# code, so a deferred module answers them unexecuted. Every loaded module is read this way: inspect.getmodule reads
# each one's __file__ and class (torch's and torchvision's operator registrations call it as yolov5 is imported), and
# importing a module a second time reads its __spec__. importlib's LazyLoader executes on these reads too, so with it
# requests and pyplot would run at import after all. `__path__` is not among them: importing a package's submodule
# reads it, and the package's own code must run first.
MODULE_IDENTITY = frozenset(
    {"__class__", "__name__", "__spec__", "__file__", "__cached__", "__loader__", "__package__"}
)


class DeferredModule(types.ModuleType):
    """A module imported but not executed: the first read of anything besides its MODULE_IDENTITY executes it."""

    def __getattribute__(self, attribute):
        if attribute in MODULE_IDENTITY:
            return super().__getattribute__(attribute)
        self.__class__ = types.ModuleType  # a plain module from here on, also while it executes
        self.__spec__.loader.exec_module(self)
        return getattr(self, attribute)


class _DeferringLoader(WrappedLoader):
    def exec_module(self, module):
        module.__spec__.loader = module.__loader__ = self.loader  # it executes the module, on first use
        module.__class__ = DeferredModule


class DeferredImports(LoaderWrappingFinder):
    """Imports the modules in ``names`` as DeferredModules: each is executed on first use instead of when imported."""

    wrap_loader = _DeferringLoader


def skip_exit_collection() -> None:
    """Call last in a process that loaded torch (and yolov5): collect what is garbage now, so its finalizers run
    (files flush, dataloader workers stop), then freeze the rest, which lives until the process ends anyway.

    Without it the interpreter's teardown runs full garbage collections over the millions of objects those imports
    created while it clears the modules: 2.2-3.2 s after importing yolov5's train.py on the 2-core demo machine,
    0.8-0.9 s with it (benchmarks/results/process_overhead.md). atexit handlers and the flush of sys.stdout and
    sys.stderr still run; what no longer runs are the finalizers of objects still reachable now that only those
    collections would have reclaimed (reference cycles freed as the modules are cleared). So a buffering writer is
    closed before this (the stage worker closes yolov5's TensorBoard writer: hooks.close_engine_loggers).
    """
    gc.collect()
    gc.freeze()


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

    from stagedyolo.jsonio import replaced_atomically

    if getattr(torch.save, "_stagedyolo_atomic", False):
        return
    plain_save = torch.save

    def atomic_save(obj, f, *args, **kwargs):
        if not isinstance(f, (str, os.PathLike)):
            return plain_save(obj, f, *args, **kwargs)
        # A unique temporary name (two savers never collide), its mode what a plain open() gives: mkstemp's 0600
        # hid published weights from collaborators on a shared folder.
        with replaced_atomically(f, "wb") as handle:
            plain_save(obj, handle, *args, **kwargs)

    atomic_save._stagedyolo_atomic = True
    torch.save = atomic_save


def record_ap_per_class() -> None:
    """Record what yolov5's val.py gets from ap_per_class (its per-class precision, recall and AP) as
    ``val.ap_per_class.last``: val.run returns per-class mAP with the mean filled in for classes absent from the
    split, so the test evaluation reads the recorded figures instead. Recording changes no value."""
    from yolov5 import val

    if hasattr(val.ap_per_class, "last"):
        return
    ap_per_class = val.ap_per_class

    def recording(*stats, **kwargs):
        recording.last = ap_per_class(*stats, **kwargs)
        return recording.last

    recording.last = None
    val.ap_per_class = recording


def install_onnx_export() -> None:
    """yolov5's export_onnx calls torch.onnx.export(...) without `dynamo`; torch >= 2.9 then takes the dynamo
    exporter, which needs onnxscript and fails inside yolov5's try_export. The TorchScript-based exporter is the one
    yolov5 7.0 was written and tested for, so the export job asks for it (the row's guard: a torch >= 2.5, whose
    export has `dynamo`)."""
    import torch

    if getattr(torch.onnx.export, "_stagedyolo_legacy", False):
        return
    export = functools.partial(torch.onnx.export, dynamo=False)
    export._stagedyolo_legacy = True
    torch.onnx.export = export
