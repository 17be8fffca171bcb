"""Every change stagedyolo makes to yolov5 7.0.14's behaviour, as one table, and the one function that applies it.

A row names its target (what in yolov5 or torch changes), the reason, its guard (when it applies) and its measured
effect. `apply_patches` walks the table in order, once per stage process, and returns which rows applied and why
the others did not; the worker records that in stage.json and timing.json. docs/engine.md is generated from the
table (`python -m stagedyolo.engine.patches`), and a test keeps the two equal.

Modes (`engine.mode`, per run or per stage):
- `reproducible`: only the rows yolov5 needs to run here and that change no number it computes (but `complete_nms`,
  which scores the images yolov5's NMS time limit would leave without detections); a stage trains
  bit-identically to `python -m yolov5.train` at the same settings (tests/test_engine_patches.py checks per-step
  losses on the CPU). A stage whose val_img differs from its img validates at val_img (its training is the same).
- `fast`: those rows plus the speed rows, each behind a guard (most need CUDA). `engine.skip_patches` turns named
  speed rows off, for a machine where one measures slower, and for benchmarks/engine_speed.py's per-row effects.
AMP is not a row of this table's modes: `amp` decides it for both modes (stagedyolo.engine.amp.decide_amp).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace

from stagedyolo.engine import compat, nms
from stagedyolo.engine.continuation import Continuation
from stagedyolo.engine.hooks import FaultInjection, NonFiniteLossGuard, ValidationSchedule, register
from stagedyolo.engine.stopping import EpochStop, GainStall
from stagedyolo.engine.train_module import load_train
from stagedyolo.yolov5_facts import trained_img

MODES = ("fast", "reproducible")
DEFAULT_MODE = "fast"
# fast mode on CUDA formats the progress bar (and checks the loss for NaN) every this many batches: reading the
# loss tensors is what makes the host wait for the GPU.
LOG_EVERY = 10


@dataclass
class EngineContext:
    """What the guards decide on, and what applying the rows produces (the train module, the hook plugins)."""

    plan: dict
    device: str  # the yolov5 --device string: 'cpu', '' (first CUDA device) or indices
    amp: bool
    callbacks: object  # yolov5's Callbacks: set after the process phase, which runs before yolov5 is imported
    amp_dtype: str | None = "float16"  # autocast's dtype when amp is on (stagedyolo.engine.amp)
    mode: str = DEFAULT_MODE
    compile: bool = False
    skip: frozenset = frozenset()
    torch: object = None
    train: object = None
    schedule: ValidationSchedule | None = None
    guard: NonFiniteLossGuard | None = None
    source_edits: list = field(default_factory=list)
    module_names: dict = field(default_factory=dict)
    log_every: int = 1
    compile_applied: bool = False
    continuation: Continuation | None = None  # the worker sets it for a stage that hands over or continues
    image_cache: list = field(default_factory=list)  # each loader's RAM-cache set-up (ram_cache_store)
    started_at: float = 0.0  # the stage process's start: a time budget counts from it
    stop: EpochStop | None = None  # what ends the stage early (epoch_stop)

    @property
    def cuda(self) -> bool:
        return self.device != "cpu"


@dataclass(frozen=True)
class Patch:
    name: str
    target: str
    reason: str
    guard: str  # when it applies, in words (`when` is the same in code)
    effect: str  # measured effect, and where it was measured
    apply: Callable[[EngineContext], None]
    when: Callable[[EngineContext], str | None] = lambda ctx: None  # None: applies; else why it does not
    fast_only: bool = False
    # process: before yolov5 is imported; source: edits train.py; module: after import; job: where a job names it
    phase: str = "module"


# --------------------------------------------------------------------------------------------- guards
def _cuda_only(ctx: EngineContext) -> str | None:
    return None if ctx.cuda else "CUDA only: the stage runs on the CPU"


# --------------------------------------------------------------------------------------------- process rows
def _offline_environment(ctx: EngineContext) -> None:
    from stagedyolo.engine.offline import OFFLINE_ENV

    os.environ.update(OFFLINE_ENV)  # the supervisor set them already; this covers a worker started by hand


def _numpy_has_trapz(ctx) -> str | None:
    import numpy as np

    return "numpy still has np.trapz" if "trapz" in vars(np) else None


def _pillow_has_getsize(ctx) -> str | None:
    from PIL import ImageFont

    return "Pillow still has FreeTypeFont.getsize" if "getsize" in vars(ImageFont.FreeTypeFont) else None


def _roi_align_imports_dynamo(ctx) -> str | None:
    if compat.DYNAMO_IMPORT in (compat.torchvision_source("ops/roi_align.py") or ""):
        return None
    return "torchvision's roi_align.py does not import torch._dynamo at its top"


def _compiler_imported(ctx: EngineContext) -> str | None:
    if ctx.compile:
        return "engine.compile is true: the compiler loads and traces"
    if not compat.compiler_wrapped_optimizer_methods():
        return "this torch's optimizers have no wrappers that import torch._dynamo"
    return None


def _ddp_timeout(ctx) -> None:
    from stagedyolo.launch import bound_init_process_group_timeout

    bound_init_process_group_timeout()


def _ddp_timeout_configured(ctx) -> str | None:
    from stagedyolo.launch.command import DDP_TIMEOUT_ENV

    return None if os.environ.get(DDP_TIMEOUT_ENV) else f"single process ({DDP_TIMEOUT_ENV} not set)"


# --------------------------------------------------------------------------------------------- source rows
def _source_edit(names: Callable[[EngineContext], dict], *edits: tuple[str, str]):
    """A source row's apply: train.py's (old, new) ``edits``, and ``names(ctx)``, the names they read, defined in it."""

    def apply(ctx: EngineContext) -> None:
        ctx.source_edits.extend(edits)
        ctx.module_names.update(names(ctx))

    return apply


NOMINAL_BATCH_EDIT = _source_edit(
    lambda ctx: {"_STAGEDYOLO_NOMINAL_BATCH": int(ctx.plan["nominal_batch"])},
    ("nbs = 64  # nominal batch size", "nbs = _STAGEDYOLO_NOMINAL_BATCH  # nominal batch size (stagedyolo: per stage)"),
)
WARMUP_FLOOR_EDIT = _source_edit(
    lambda ctx: {"_STAGEDYOLO_MIN_WARMUP_ITERS": int(ctx.plan["min_warmup_iters"])},
    (
        "nw = max(round(hyp['warmup_epochs'] * nb), 100)",
        "nw = max(round(hyp['warmup_epochs'] * nb), _STAGEDYOLO_MIN_WARMUP_ITERS)",
    ),
)
_AUTOCAST_BF16_EDIT = _source_edit(
    lambda ctx: {"_STAGEDYOLO_AUTOCAST_DTYPE": ctx.torch.bfloat16},
    ("with torch.cuda.amp.autocast(amp):", "with torch.cuda.amp.autocast(amp, dtype=_STAGEDYOLO_AUTOCAST_DTYPE):"),
)


def _bf16_requested(ctx: EngineContext) -> str | None:
    return None if ctx.amp and ctx.amp_dtype == "bfloat16" else "amp is off or fp16 (autocast's default dtype)"


_LOG_EVERY_EDIT = _source_edit(
    lambda ctx: {"_STAGEDYOLO_LOG_EVERY": LOG_EVERY},
    (
        "                pbar.set_description(('%11s' * 2 + '%11.4g' * 5) %",
        "                if i % _STAGEDYOLO_LOG_EVERY == 0 or i == nb - 1: "
        "pbar.set_description(('%11s' * 2 + '%11.4g' * 5) %",
    ),
)


def _sync_every_batches(ctx: EngineContext) -> None:
    _LOG_EVERY_EDIT(ctx)
    ctx.log_every = LOG_EVERY  # the NaN guard reads the loss on the same batches (see _nonfinite_guard)


# After the loop, train.py validates best.pt again (loading it first); `results` then keeps the final epoch's own.
_FINAL_VALIDATION_EDIT = _source_edit(
    lambda ctx: {"_STAGEDYOLO_SKIP_FINAL_VALIDATION": True},
    (
        "                if f is best:\n                    LOGGER.info(f'\\nValidating {f}...')",
        "                if f is best and not _STAGEDYOLO_SKIP_FINAL_VALIDATION:\n"
        "                    LOGGER.info(f'\\nValidating {f}...')",
    ),
)
VAL_IMG_EDITS = (
    (
        "val_loader = create_dataloader(val_path,\n                                       imgsz,",
        "val_loader = create_dataloader(val_path,\n                                       _STAGEDYOLO_VAL_IMGSZ,",
    ),
    ("f'Image sizes {imgsz} train, {imgsz} val\\n'", "f'Image sizes {imgsz} train, {_STAGEDYOLO_VAL_IMGSZ} val\\n'"),
)
_VAL_IMG_EDIT = _source_edit(
    lambda ctx: {"_STAGEDYOLO_VAL_IMGSZ": trained_img(ctx.plan.get("val_img") or ctx.plan["img"])}, *VAL_IMG_EDITS
)
CONTINUATION_EDITS = (
    (
        "        del ckpt, csd",
        "        _STAGEDYOLO_CONTINUATION.take_up(ckpt, optimizer, ema, resume)\n        del ckpt, csd",
    ),
    (
        "    scheduler.last_epoch = start_epoch - 1  # do not move",
        "    scheduler.last_epoch = start_epoch - 1 + _STAGEDYOLO_CONTINUATION.schedule_shift  # do not move",
    ),
    (
        "    scaler = torch.cuda.amp.GradScaler(enabled=amp)",
        "    scaler = _STAGEDYOLO_CONTINUATION.scaler(torch.cuda.amp.GradScaler(enabled=amp))",
    ),
    (
        "                    'updates': ema.updates,",
        "                    'updates': ema.updates, 'scaler': scaler.state_dict(),\n"
        "                    'recipe_epochs': _STAGEDYOLO_EPOCHS_BEFORE + epoch + 1,\n"
        "                    'val_img': val_loader.dataset.img_size,",
    ),
)
_CONTINUATION_EDIT = _source_edit(
    lambda ctx: {
        "_STAGEDYOLO_CONTINUATION": ctx.continuation,
        "_STAGEDYOLO_EPOCHS_BEFORE": int(ctx.plan.get("recipe_epochs_before") or 0),
    },
    *CONTINUATION_EDITS,
)


def _handover_checkpoint(ctx: EngineContext) -> None:
    ctx.train.strip_optimizer = ctx.continuation.strip_keeping_handover(ctx.train.strip_optimizer)


def _continuation_set(ctx: EngineContext) -> str | None:
    return None if ctx.continuation else "no continuation (a process that is not a stage's worker)"


# --------------------------------------------------------------------------------------------- module rows
def _amp_decision(ctx: EngineContext) -> None:
    ctx.train.check_amp = lambda model: ctx.amp


def _val_period(ctx: EngineContext) -> None:
    ctx.schedule = ValidationSchedule(ctx.plan["val_period"], ctx.plan["epochs"])
    ctx.train.validate.run = ctx.schedule.wrap(ctx.train.validate.run)
    register(ctx.schedule, ctx.callbacks)


def _epoch_stop(ctx: EngineContext) -> None:
    ctx.stop = EpochStop(
        ctx.plan.get("time_budget_s"), ctx.schedule, started_at=ctx.started_at, stall=GainStall.for_plan(ctx.plan)
    )
    ctx.train.EarlyStopping = ctx.stop.early_stopping


def _local_weights(ctx: EngineContext) -> None:
    downloads = sys.modules[ctx.train.attempt_download.__module__]  # attempt_download asks the hub too
    lookup = downloads.attempt_download_from_hub

    def attempt_download_from_hub(repo_id, hf_token=None, revision=None):
        if not repo_id or os.path.isfile(repo_id):
            return None  # yolov5's own answer for no weights or a file: not a hub repository id
        return lookup(repo_id, hf_token=hf_token, revision=revision)

    ctx.train.attempt_download_from_hub = downloads.attempt_download_from_hub = attempt_download_from_hub


def _ram_cache_store(ctx: EngineContext) -> None:
    from stagedyolo.dataset.image_store import serve_ram_cache

    serve_ram_cache(ctx.plan.get("image_store"), ctx.image_cache)


def _caches_in_ram(ctx: EngineContext) -> str | None:
    return None if ctx.plan.get("cache") == "ram" else "no RAM cache: yolov5's loaders decode as usual"


def _onnx_has_dynamo(ctx: EngineContext) -> str | None:
    import inspect

    import torch

    dynamo = "dynamo" in inspect.signature(torch.onnx.export).parameters
    return None if dynamo else "torch < 2.5 has only the TorchScript-based exporter"


def _nonfinite_guard(ctx: EngineContext) -> None:
    ctx.guard = NonFiniteLossGuard(ctx.plan["stage"], ctx.plan["hyp"]["lr0"], every=ctx.log_every)
    ctx.guard.attach(ctx.callbacks)


def _fault_injection(ctx: EngineContext) -> None:
    register(FaultInjection(os.environ[FaultInjection.ENV], ctx.plan["attempt"]), ctx.callbacks)


def _fault_requested(ctx) -> str | None:
    return None if os.environ.get(FaultInjection.ENV) else f"{FaultInjection.ENV} not set"


def _nondeterministic(ctx: EngineContext) -> None:
    init_seeds, torch = ctx.train.init_seeds, ctx.torch

    def init_seeds_fast(seed=0, deterministic=False):
        init_seeds(seed, deterministic=False)  # same seeds; no use_deterministic_algorithms, no cudnn.deterministic
        torch.backends.cudnn.benchmark = True

    ctx.train.init_seeds = init_seeds_fast


def _on_model(ctx: EngineContext, change: Callable) -> None:
    """Run `change(model)` on the model train() just built, through the check_amp seam (called with it once).
    Rows applied earlier change it first (channels_last before compile)."""
    check_amp = ctx.train.check_amp

    def check_amp_then_change(model):
        amp = check_amp(model)
        change(model)
        return amp

    ctx.train.check_amp = check_amp_then_change


def _channels_last(ctx: EngineContext) -> None:
    _on_model(ctx, lambda model: model.to(memory_format=ctx.torch.channels_last))


def _compile(ctx: EngineContext) -> None:
    # nn.Module.compile compiles in place; deepcopy (the EMA, checkpoints) drops the compiled call, so the EMA
    # and the saved .pt hold the plain model.
    _on_model(ctx, lambda model: model.compile())
    ctx.compile_applied = True


def _compile_requested(ctx: EngineContext) -> str | None:
    if not ctx.compile:
        return "engine.compile is false"
    if not ctx.cuda:
        return "CUDA only: on this 2-core CPU, compiling one small conv layer took 82 s"
    return None


def _foreach_ema(ctx: EngineContext) -> None:
    ctx.train.ModelEMA = foreach_model_ema(ctx.train.ModelEMA, ctx.torch)


def _fused_optimizer(ctx: EngineContext) -> None:
    smart_optimizer = ctx.train.smart_optimizer

    def smart_optimizer_fused(model, name="Adam", lr=0.001, momentum=0.9, decay=1e-5):
        plain = smart_optimizer(model, name, lr, momentum, decay)  # yolov5's groups, hyperparameters and log line
        groups = [{k: v for k, v in group.items() if k not in ("foreach", "fused")} for group in plain.param_groups]
        return type(plain)(groups, fused=True)

    ctx.train.smart_optimizer = smart_optimizer_fused


def _fused_supported(ctx: EngineContext) -> str | None:
    optimizer = ctx.plan.get("optimizer", "SGD")
    return None if optimizer in ("SGD", "Adam", "AdamW") else f"torch has no fused {optimizer}"


def foreach_model_ema(model_ema_class, torch):
    """yolov5's ModelEMA with update() as two multi-tensor ops over all floating tensors instead of a Python loop
    of two kernels per tensor. The arithmetic is the same (v = v*d + (1-d)*m, in that order), so the result is
    bit-identical on the CPU (tests/test_engine_patches.py). The state dicts are read afresh each step: validation
    and checkpointing replace the model's and the EMA's buffers (model.half()/.float()), so a cached list would go
    stale."""
    de_parallel = sys.modules[model_ema_class.__module__].de_parallel

    class ForeachModelEMA(model_ema_class):
        def update(self, model):
            self.updates += 1
            d = self.decay(self.updates)
            msd = de_parallel(model).state_dict()
            pairs = [(v, msd[k].detach()) for k, v in self.ema.state_dict().items() if v.dtype.is_floating_point]
            if pairs:
                ema, current = (list(t) for t in zip(*pairs))
                torch._foreach_mul_(ema, d)
                torch._foreach_add_(ema, torch._foreach_mul(current, 1 - d))

    ForeachModelEMA.__qualname__ = ForeachModelEMA.__name__ = model_ema_class.__name__
    return ForeachModelEMA


# --------------------------------------------------------------------------------------------- the table
PATCHES: tuple[Patch, ...] = (
    Patch(
        "offline_environment",
        "process environment (ultralytics, torch.load, online loggers, HF hub)",
        "yolov5/ultralytics reach the network at run time and torch >= 2.6 refuses yolov5 checkpoints; "
        "stagedyolo.engine.offline.OFFLINE_ENV answers each place",
        "always",
        "no training number changes; tests/test_pipeline_e2e.py audits that no connection is attempted",
        _offline_environment,
        phase="process",
    ),
    Patch(
        "numpy_trapz",
        "numpy.trapz",
        "numpy 2.4 removed np.trapz, which yolov5's metrics call at validation",
        "numpy lacks trapz",
        "none: the same function under its new name (np.trapezoid)",
        lambda ctx: compat.numpy_trapz(),
        _numpy_has_trapz,
        phase="process",
    ),
    Patch(
        "pillow_getsize",
        "PIL.ImageFont.FreeTypeFont.getsize",
        "Pillow 10 removed getsize, which yolov5's plot annotator calls",
        "Pillow lacks getsize",
        "none: plots only",
        lambda ctx: compat.pillow_getsize(),
        _pillow_has_getsize,
        phase="process",
    ),
    Patch(
        "atomic_save",
        "torch.save (yolov5's last.pt/best.pt)",
        "a kill mid-save must leave the previous complete checkpoint, never a torn one",
        "always",
        "no fsync: it cost ~0.5 s per save on this CPU, two saves an epoch",
        lambda ctx: compat.atomic_torch_save(),
        phase="process",
    ),
    Patch(
        "deferred_imports",
        "seaborn, matplotlib.pyplot, requests, boto3 (imported by yolov5 and TensorBoard)",
        "imported at module level for plots a stage draws only with `plots: true`, URLs it never opens and s3:// "
        "log paths; each executes on its first use instead",
        "always (with plots on, seaborn and pyplot load when the first plot is drawn; a stage's train.py imports "
        "roboflow, which executes requests)",
        "seaborn alone: torch + yolov5 train/val/export imports 10.3 -> 9.0 s; pyplot and boto3 too: a stage's "
        "engine imports 7.58 -> 6.91 s (medians of 5 alternating processes, 2-core CPU, "
        "benchmarks/results/engine_imports.md)",
        lambda ctx: compat.defer_imports(),
        phase="process",
    ),
    Patch(
        "sourceless_inspect",
        "inspect as yolov5.utils.general uses it (import-time stack(), print_args)",
        "both read source lines for a filename, and print_args is train.main's first log line",
        "always (the same filenames, lines and function names: the same cv2.imread decision and log line)",
        "torch + yolov5 train.py imports 8.93 -> 8.09 s and train.main's print_args 1.38 -> 0.00 s, medians of 5 "
        "alternating processes, 2-core CPU (benchmarks/results/process_overhead.md)",
        lambda ctx: compat.sourceless_inspect(),
        phase="process",
    ),
    Patch(
        "lazy_dynamo",
        "torchvision.ops.roi_align's module-level `from torch._dynamo.utils import is_compile_supported`",
        "it imports torch._dynamo (torch.fx's symbolic shapes, sympy, FSDP) into every yolov5 process for a check "
        "inside roi_align(), which yolov5 never calls; the import moves into that check",
        "torchvision whose roi_align.py has that line (0.29)",
        "the engine imports 3.12 -> 2.12 s (medians of 5 alternating processes, 2-core CPU, "
        "benchmarks/results/engine_imports.md); kept by the export and test-evaluation processes. A process that "
        "trains loads torch._dynamo at its first step all the same (torch 2.14's optimizers import it in "
        "Optimizer.__init__ and step): no change to a stage's or the probe's time to its first step",
        lambda ctx: compat.lazy_dynamo_in_torchvision(),
        _roi_align_imports_dynamo,
        phase="process",
    ),
    Patch(
        "compiler_unloaded",
        "torch.optim's step and _disable_dynamo wrappers, torch.use_deterministic_algorithms (train.py's init_seeds)",
        "each imports torch._dynamo (and torch._inductor's config) into a process that never compiles, for what only "
        "acts while the compiler traces (graph breaks around every step, dynamo.disable, inductor's copy of the "
        "deterministic flag); grad mode, the methods and torch's flag are as before",
        "engine.compile off, and a torch whose optimizers carry those wrappers (2.14)",
        "a stage process's start to its first step 6.75 -> 4.65 s (medians of 5 alternating processes, 2-core CPU, "
        "benchmarks/results/engine_imports.md); the probe's process measures that much longer within its budget",
        lambda ctx: compat.compiler_left_unloaded(),
        _compiler_imported,
        phase="process",
    ),
    Patch(
        "ddp_timeout",
        "torch.distributed.init_process_group default timeout",
        "yolov5 passes none, so one dead rank leaves the others waiting 3 h",
        "launched with a DDP timeout",
        "bounds a hang; no effect on training",
        _ddp_timeout,
        _ddp_timeout_configured,
        phase="process",
    ),
    Patch(
        "nominal_batch",
        "train.py `nbs = 64`",
        "64 images per optimizer step leaves a small dataset few steps per epoch; settable per stage",
        "always (the default 64 is yolov5's)",
        "demo frozen stage, 8 epochs from the demo weights, with min_warmup_iters 0: mAP50 0.58 -> 0.82 (README)",
        NOMINAL_BATCH_EDIT,
        phase="source",
    ),
    Patch(
        "warmup_floor",
        "train.py `nw = max(..., 100)`",
        "warmup lasts at least 100 iterations whatever warmup_epochs says; settable per stage",
        "always (the default 100 is yolov5's)",
        "see nominal_batch (measured together)",
        WARMUP_FLOOR_EDIT,
        phase="source",
    ),
    Patch(
        "val_img",
        "train.py's validation loader (`create_dataloader(val_path, imgsz, ...)`) and its log line",
        "yolov5 validates at the training size; a phase that trains at a smaller size is judged at the recipe's "
        "target size instead (the stage's val_img), so its mAP50 is the finished model's and its fitness compares "
        "with the other stages'",
        "always (val_img equal to img is yolov5's own; training is unchanged either way)",
        "demo, stages trained at 128 px validated at 160: mAP50 0.774 vs 0.753 at 128 (frozen), 0.986 vs 0.988 "
        "(finetune); the demo reaches mAP50 0.5 at 160 px in its frozen stage instead of its last "
        "(benchmarks/results/naive_vs_staged.md)",
        _VAL_IMG_EDIT,
        phase="source",
    ),
    Patch(
        "continuation",
        "train.py after the model, optimizer and EMA are built (`del ckpt, csd`), its GradScaler "
        "and its checkpoint dict",
        "a stage continues the previous stage's training (stagedyolo.engine.continuation): optimizer state, EMA "
        "and its update count, AMP scale, and an LR schedule that reaches the stage's own lrf (yolov5's runs one "
        "epoch behind); every checkpoint also keeps the scaler and the epochs trained so far",
        "always (a stage that starts from the model or restarts from weights only saves the extra state)",
        "demo: the stages end at mAP50 0.9939 with the schedule on the stage's own lrf, 0.9911 one epoch behind "
        "(frozen 0.813 vs 0.774, finetune 0.994 vs 0.986); the recipe against one run: "
        "benchmarks/results/naive_vs_staged_demo.md",
        _CONTINUATION_EDIT,
        _continuation_set,
        phase="source",
    ),
    Patch(
        "amp_bf16",
        "train.py `torch.cuda.amp.autocast(amp)`",
        "yolov5 autocasts to fp16 only; bfloat16 has fp32's range, so no overflow and no loss scaling to tune",
        "amp: bf16 on a GPU that supports it (stagedyolo.engine.amp)",
        "GPU: open (no GPU here)",
        _AUTOCAST_BF16_EDIT,
        _bf16_requested,
        phase="source",
    ),
    Patch(
        "sync_every_batches",
        "train.py progress bar `pbar.set_description` (and the NaN guard)",
        "formatting the CUDA loss tensors every batch makes the host wait for the GPU each step",
        "fast mode, CUDA",
        "GPU: open (no GPU here); on the CPU there is nothing to wait for",
        _sync_every_batches,
        _cuda_only,
        fast_only=True,
        phase="source",
    ),
    Patch(
        "final_validation",
        "train.py after the epoch loop: `if f is best:` loads best.pt and validates it again",
        "the final epoch is always validated in the loop and best.pt's figures are in results.csv; validating it "
        "again is one more validation pass per stage, between stages, while nothing trains (the evaluate job tests "
        "the published weights)",
        "fast mode (reproducible mode validates best.pt again, as yolov5)",
        "demo (2-core CPU): 0.7-0.8 s per stage that saves best.pt (val phase minus the epochs' own validations, "
        "timing.json); on a GPU one pass over the val set per stage",
        _FINAL_VALIDATION_EDIT,
        fast_only=True,
        phase="source",
    ),
    Patch(
        "handover_checkpoint",
        "train.strip_optimizer (last.pt at the end of training)",
        "yolov5 strips the optimizer and EMA state from last.pt; the next stage needs it, so last.pt is kept "
        "first as continue.pt (the published last.pt and best.pt are stripped as yolov5 leaves them)",
        "always",
        "one copy of last.pt per stage",
        _handover_checkpoint,
        _continuation_set,
    ),
    Patch(
        "amp_decision",
        "train.check_amp",
        "check_amp may download yolov5n.pt and silently turns AMP off on failure: the plan decides AMP",
        "always",
        "no download; AMP is what `amp` says (stagedyolo.engine.amp)",
        _amp_decision,
    ),
    Patch(
        "local_weights",
        "train.attempt_download_from_hub and yolov5.utils.downloads' (which train.py's attempt_download calls)",
        "train.py asks the Hugging Face hub about every --weights twice, a local file included; the question imports "
        "huggingface_hub's client, whose answer for a file or no weights is always None",
        "always (any other name still goes to yolov5's lookup, offline: HF_HUB_OFFLINE)",
        "0.25 s less per stage process on the 2-core demo machine (yolov5's lookup of a local file, timed alone)",
        _local_weights,
    ),
    Patch(
        "val_period",
        "train.validate.run (in the epoch loop)",
        "yolov5 has no validate-every-N option and its --noval is broken in 7.0.14",
        "always (val_period 1 validates every epoch, as yolov5)",
        "val_period 5 vs 1, frozen stage, 10 epochs: epoch train+val 0.822x (benchmarks/results/val_period.json)",
        _val_period,
    ),
    Patch(
        "complete_nms",
        "yolov5.val.non_max_suppression (every validation: a stage's, the test evaluation's)",
        "yolov5 stops NMS once a batch has taken 0.5 + 0.05 x its size seconds and leaves the rest of the batch "
        "without detections; on a CPU a model that emits many low-confidence boxes (a phase trained at a smaller "
        "size, judged at the target size) passes it at most validations, understating mAP50. yolov5's function "
        "without the limit, each image's NMS stopped once it has val.py's max_det boxes (stagedyolo.engine.nms)",
        "always (where yolov5's NMS finishes within its limit, the same detections)",
        "det at 480 px, 2-core CPU: a fine-tune's last.pt 0.460 -> 0.662; NMS of one validation 9.68 -> 0.13 s "
        "against yolov5's without its limit (docs/engine.md, 'Validation's NMS')",
        lambda ctx: nms.complete_nms(),
    ),
    Patch(
        "epoch_stop",
        "train.EarlyStopping",
        "yolov5's EarlyStopping counts epochs since the best fitness whatever was validated (with val_period > 1 it "
        "stops on an epoch nobody validated); EpochStop (stagedyolo.engine.stopping) stands in: the stage's own "
        "`patience` on validated epochs, its time budget and its handover on stall, each ending the stage at an "
        "epoch boundary through yolov5's own exit",
        "always (a stage that sets no patience, time budget or handover never stops early)",
        "tests/test_stopping_real.py: patience counts validated epochs only",
        _epoch_stop,
    ),
    Patch(
        "ram_cache_store",
        "yolov5.utils.dataloaders.LoadImagesAndLabels.__init__ (`--cache ram`)",
        "yolov5 decodes every image again in each process that caches; the run's prebuilt store (cache_dataset) "
        "serves them decoded, and each loader's set-up is timed (timing.json setup_detail)",
        "cache: ram (a stage, the probe)",
        "first epoch of a RAM-cached stage: benchmarks/results/image_store.json",
        _ram_cache_store,
        _caches_in_ram,
    ),
    Patch(
        "nonfinite_guard",
        "Callbacks on_train_batch_end (callbacks.stop_training)",
        "a NaN/Inf loss would otherwise train on for hours",
        "always",
        "stops within one batch (LOG_EVERY batches with sync_every_batches)",
        _nonfinite_guard,
    ),
    Patch(
        "fault_injection",
        "Callbacks on_train_batch_start/end",
        "tests only: inject NaN, OOM or slow batches",
        "STAGEDYOLO_TEST_FAULT set",
        "tests only",
        _fault_injection,
        _fault_requested,
    ),
    Patch(
        "nondeterministic",
        "train.init_seeds(..., deterministic=True)",
        "it turns on torch.use_deterministic_algorithms and cudnn.deterministic and leaves cudnn.benchmark off",
        "fast mode, CUDA",
        "GPU: open (no GPU here)",
        _nondeterministic,
        _cuda_only,
        fast_only=True,
    ),
    Patch(
        "channels_last",
        "the model's memory format (at train.check_amp, once the model is built)",
        "NHWC convolutions use tensor cores without transposes",
        "fast mode, CUDA",
        "GPU: open (no GPU here)",
        _channels_last,
        _cuda_only,
        fast_only=True,
    ),
    Patch(
        "compile",
        "the model's forward (nn.Module.compile, at train.check_amp)",
        "fuses the many small kernels of a YOLOv5 step; compile time goes to timing.json",
        "fast mode, engine.compile: true, CUDA",
        "GPU: open (no GPU here)",
        _compile,
        _compile_requested,
        fast_only=True,
    ),
    Patch(
        "foreach_ema",
        "train.ModelEMA.update",
        "it walks the state dict in Python, two kernels per tensor, every step",
        "fast mode",
        "CPU (yolov5n, 128 px, batch 16): the update 36.6 -> 35.9 ms (1.02x, 0.1 % of a step); whole stages "
        "0.97x (0.83-1.21, within the shared machine's noise); final mAP50 unchanged. GPU: open "
        "(benchmarks/results/engine_speed.json)",
        _foreach_ema,
        fast_only=True,
    ),
    Patch(
        "fused_optimizer",
        "train.smart_optimizer (fused=True, same groups and hyperparameters)",
        "torch's default optimizer step loops over parameters in Python on the CPU (foreach on CUDA); fused is one "
        "kernel",
        "fast mode, SGD/Adam/AdamW",
        "CPU (yolov5n, 128 px, batch 16, AdamW): the step 57.4 -> 15.7 ms (3.66x, 4.3 % of a forward+backward); "
        "whole stages 1.29x (1.01-1.43); final mAP50 unchanged. GPU: open (benchmarks/results/engine_speed.json)",
        _fused_optimizer,
        _fused_supported,
        fast_only=True,
    ),
    Patch(
        "onnx_torchscript_exporter",
        "torch.onnx.export (yolov5's export_onnx)",
        "yolov5 calls it without `dynamo`; torch >= 2.9 then takes the dynamo exporter, which needs onnxscript and "
        "fails inside yolov5's try_export",
        "the export job, torch >= 2.5",
        "none: the exporter yolov5 7.0 was written for",
        lambda ctx: compat.install_onnx_export(),
        _onnx_has_dynamo,
        phase="job",
    ),
    Patch(
        "ap_per_class_record",
        "yolov5.val.ap_per_class",
        "val.run returns per-class mAP with the mean filled in for classes absent from the split; the test "
        "evaluation reads ap_per_class's own per-class figures, recorded as val.py calls it",
        "the test evaluation job",
        "none: it records, it changes no value",
        lambda ctx: compat.record_ap_per_class(),
        phase="job",
    ),
)

# A stage applies these phases in order; "job" rows are applied only where a job names them (apply_job_patches).
PHASES = ("process", "source", "module")
SKIPPABLE = tuple(p.name for p in PATCHES if p.fast_only)
# The rows that change how fast a training step runs (cuDNN's kernel choice, the model's memory format, the optimizer
# step, the EMA update). The probe applies them to its own steps (step_engine), so that what it times is the step the
# stage will run. Not `compile`: compiling takes minutes, longer than the probe's whole budget, so the probe times the
# uncompiled step and says so.
STEP_ROWS = ("nondeterministic", "channels_last", "foreach_ema", "fused_optimizer")


def engine_settings(plan: dict) -> dict:
    """EngineContext's mode, compile and skip from a plan's `engine` entry (a plan without one: the defaults)."""
    engine = plan.get("engine") or {}
    return {
        "mode": engine.get("mode", DEFAULT_MODE),
        "compile": bool(engine.get("compile", False)),
        "skip": frozenset(engine.get("skip_patches", ())),
    }


def skip_reason(patch: Patch, ctx: EngineContext) -> str | None:
    """None when the row applies to this stage, else why not."""
    if patch.fast_only and ctx.mode != "fast":
        return f"engine mode {ctx.mode}"
    if patch.name in ctx.skip:
        return "engine.skip_patches names it"
    return patch.when(ctx)


def apply_patches(ctx: EngineContext, phases: tuple[str, ...] = PHASES) -> list[dict]:
    """Apply the table's rows of ``phases`` to this process, in order; the module phase loads yolov5's train module
    into ctx.train. Returns one record per row: {name, applied, reason} (reason: the guard that held, or why the
    row did not apply). The worker applies the process phase before it imports anything of yolov5 (import shims
    act only on imports still to come), and the other phases once it has yolov5's Callbacks."""
    report = []
    for phase in phases:
        if phase == "module":
            ctx.train = load_train(ctx.source_edits, ctx.module_names)
        report += [apply_row(patch, ctx) for patch in PATCHES if patch.phase == phase]
    return report


def apply_job_patches(rows: tuple[str, ...] = (), plan: dict | None = None) -> list[dict]:
    """For a process that uses yolov5 without training a stage (the probe, the export, the test evaluation): the
    process rows, then the rows it names in ``rows`` (applied whatever their phase; ``plan`` holds what their guards
    read, e.g. the probe's cache and image store). Call it before yolov5 is imported. Returns the rows' records."""
    ctx = EngineContext(plan or {}, "cpu", False, None)
    chosen = [p for p in PATCHES if p.phase == "process" or p.name in rows]
    unknown = set(rows) - {p.name for p in chosen}
    if unknown:
        raise ValueError(f"no such patch row(s): {sorted(unknown)}")
    return [apply_row(patch, ctx) for patch in chosen]


def apply_row(patch: Patch, ctx: EngineContext) -> dict:
    """Apply one row where its guard holds; its record {name, applied, reason}."""
    reason = skip_reason(patch, ctx)
    if reason is None:
        patch.apply(ctx)
    return {"name": patch.name, "applied": reason is None, "reason": reason or patch.guard}


def step_engine(engine: dict, optimizer: str, device: str, torch) -> tuple[SimpleNamespace, list[dict]]:
    """yolov5's pieces of a training step (init_seeds, check_amp, smart_optimizer, ModelEMA) with the STEP_ROWS that
    apply to a stage of ``engine`` (a plan's `engine` entry) and ``optimizer`` on ``device``, for a process that
    runs training steps without train.py's loop (the probe). Call init_seeds and check_amp(model) as train.py does.
    Returns the pieces and the rows' report, as apply_patches does."""
    from yolov5.utils.general import init_seeds
    from yolov5.utils.torch_utils import ModelEMA, smart_optimizer

    pieces = SimpleNamespace(
        init_seeds=init_seeds, check_amp=lambda model: None, smart_optimizer=smart_optimizer, ModelEMA=ModelEMA
    )
    ctx = EngineContext(
        {"engine": engine, "optimizer": optimizer},
        device,
        False,
        None,
        torch=torch,
        train=pieces,
        **engine_settings({"engine": engine}),
    )
    return pieces, [apply_row(patch, ctx) for patch in PATCHES if patch.name in STEP_ROWS]


def compile_seconds(torch) -> dict:
    """torch.compile's own record of its compile time (dynamo's totals), for timing.json."""
    try:
        names, values = torch._dynamo.utils.compile_times(repr="csv", aggregate=True)
        times = dict(zip(names, (float(v) for v in values)))
    except Exception as error:  # private API: report why, never break a finished stage
        return {"compile_s": None, "reason": f"torch._dynamo.utils.compile_times failed: {error!r}"}
    total = times.get("_compile.compile_inner", 0.0) + times.get("backward._backward_impl", 0.0)
    return {"compile_s": round(total, 3), "reason": "dynamo compile_inner + backward compile totals"}


# --------------------------------------------------------------------------------------------- docs
DOC_BEGIN = "<!-- patches table: generated by `python -m stagedyolo.engine.patches`; do not edit by hand -->"
DOC_END = "<!-- end of patches table -->"


def markdown_table() -> str:
    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    lines = [
        DOC_BEGIN,
        "",
        "| # | row | modes | target | reason | guard | measured effect |",
        "|---:|---|---|---|---|---|---|",
    ]
    for i, p in enumerate(PATCHES, 1):
        modes = "fast" if p.fast_only else "fast, reproducible"
        lines.append(
            f"| {i} | `{p.name}` | {modes} | {cell(p.target)} | {cell(p.reason)} | {cell(p.guard)} | {cell(p.effect)} |"
        )
    return "\n".join([*lines, "", DOC_END])


def docs_with_table(text: str) -> str:
    head, _, rest = text.partition(DOC_BEGIN)
    _, _, tail = rest.partition(DOC_END)
    return head + markdown_table() + tail


if __name__ == "__main__":  # rewrite docs/engine.md's table from PATCHES
    from pathlib import Path

    doc = Path(__file__).resolve().parents[2] / "docs" / "engine.md"
    doc.write_text(docs_with_table(doc.read_text()))
    print(f"wrote {doc}")
