"""Plugins for yolov5's Callbacks: the seams through which the adapter changes engine behaviour without
editing train.py. Each is an object whose method names match yolov5 hook names."""

from __future__ import annotations

import math
import sys
import time

NONFINITE_LOSS_HELP = (
    "The training loss became {value} at iteration {ni} (epoch {epoch}) and the stage was stopped.\n"
    "Usual causes: the learning rate is too high, or AMP (fp16) overflows on an older GPU.\n"
    "Try: stages.{stage}.lr0: {lower_lr0:g} (a tenth of {lr0:g}), or stages.{stage}.amp: false."
)


def register(plugin, callbacks) -> None:
    """Register every method of `plugin` named after a yolov5 hook (yolov5's own Loggers use the same rule)."""
    for hook in callbacks._callbacks:
        method = getattr(plugin, hook, None)
        if callable(method):
            callbacks.register_action(hook, name=f"stagedyolo.{type(plugin).__name__}", callback=method)


def close_engine_loggers(callbacks) -> None:
    """Close yolov5's TensorBoard writer once train.main has returned. yolov5 never closes it: its last events
    reached the file only through the interpreter's teardown, which the worker shortens (compat.skip_exit_collection).
    train.py registers its Loggers' methods as callbacks, so the writer is found through them; closing is idempotent.
    """
    for actions in callbacks._callbacks.values():
        for action in actions:
            writer = getattr(getattr(action["callback"], "__self__", None), "tb", None)
            if callable(getattr(writer, "close", None)):
                try:
                    writer.close()
                except Exception as error:  # its events are a record of the stage, not its result
                    print(f"stagedyolo: closing yolov5's TensorBoard writer failed: {error!r}", file=sys.stderr)


class ValidationSchedule:
    """Validate every `period` epochs (epochs period, 2*period, ... counted from 1) and on the final epoch.

    yolov5 has no such option and its --noval is broken in 7.0.14, so the in-loop call to val.run is wrapped:
    on a skipped epoch it returns NaN metrics instead of running. NaN fitness is never > or == best_fitness,
    so best.pt is only ever taken from a validated epoch, and results.csv shows the skipped epochs as nan.
    The post-training validation of best.pt (outside the epoch loop) is not wrapped (the patch table's
    `final_validation` row leaves it out in fast mode).
    """

    def __init__(self, period: int, epochs: int):
        self.period, self.epochs = max(1, int(period)), int(epochs)
        self.epoch = None  # set only between an epoch's end and its fit_epoch_end, i.e. in-loop validation
        self.last_epoch = self.epochs - 1  # earlier when the stage is ended early (EpochStop's time budget)
        self.validated: list[int] = []
        self.best_saved: list[int] = []  # epochs whose checkpoint became best.pt

    def should_validate(self, epoch: int) -> bool:
        return (epoch + 1) % self.period == 0 or epoch == self.last_epoch

    def end_at(self, epoch: int) -> None:
        """The stage ends after `epoch`: validate it, so its checkpoint carries metrics like any final epoch."""
        self.last_epoch = epoch

    def on_train_epoch_end(self, epoch):
        self.epoch = epoch

    def on_fit_epoch_end(self, *args):
        self.epoch = None

    def on_model_save(self, last, epoch, final_epoch, best_fitness, fi):
        if best_fitness == fi:  # the condition under which train.py has just written best.pt
            self.best_saved.append(epoch)

    def wrap(self, run):
        import numpy as np

        def run_on_schedule(*args, **kwargs):
            if self.epoch is None or self.should_validate(self.epoch):
                if self.epoch is not None:
                    self.validated.append(self.epoch)
                return run(*args, **kwargs)
            nc = int(getattr(kwargs.get("model"), "nc", 1))
            skipped = np.full(nc, np.nan)
            return (math.nan,) * 7, skipped, skipped.copy(), (0.0, 0.0, 0.0)

        return run_on_schedule


class NonFiniteLoss(RuntimeError):
    """The loss of an epoch's last batches was non-finite: raised at the epoch's end, before yolov5 validates and
    saves the poisoned weights over the last good last.pt."""


class NonFiniteLossGuard:
    """Stops training within one iteration of the loss turning NaN/Inf, instead of burning hours on it.

    yolov5's running mean loss stays non-finite once one batch is, so checking it each batch is enough; the
    check reads values the progress bar already synchronised, so it adds no GPU sync. With `every` > 1 (the
    patch table's sync_every_batches, where the progress bar formats the loss only every N batches) it checks
    batches 0, N, 2N... of each epoch, which the bar formats too, so it adds no sync there either; a NaN stops
    training within N batches. The epoch's last batch is checked too (one sync per epoch): its running mean covers
    the batches after the last check, and the final epoch has no next one to see them. A NaN found there raises
    NonFiniteLoss, since yolov5 reads stop_training only inside its batch loop and would save the epoch first.
    """

    def __init__(self, stage: str, lr0: float, every: int = 1):
        self.stage, self.lr0, self.every = stage, lr0, max(1, int(every))
        self.message: str | None = None
        self.callbacks = None
        self.epoch = 0
        self.batches = 0  # batches of this epoch so far
        self.unchecked: tuple | None = None  # (ni, mloss) of the epoch's latest batch, when it was not checked

    def attach(self, callbacks) -> None:
        self.callbacks = callbacks
        register(self, callbacks)

    def on_train_batch_end(self, model, ni, imgs, targets, paths, mloss):
        self.batches += 1
        self.unchecked = (ni, mloss)
        if (self.batches - 1) % self.every:
            return
        self.unchecked = None
        if self._found_nonfinite(ni, mloss):
            self.callbacks.stop_training = True

    def on_train_epoch_end(self, epoch):
        unchecked, self.unchecked = self.unchecked, None
        if unchecked and self._found_nonfinite(*unchecked):
            raise NonFiniteLoss(self.message)
        self.epoch, self.batches = epoch + 1, 0

    def _found_nonfinite(self, ni, mloss) -> bool:
        bad = next((value for value in map(float, mloss) if not math.isfinite(value)), None)
        if bad is None:
            return False
        self.message = NONFINITE_LOSS_HELP.format(
            value=bad, ni=ni, epoch=self.epoch, stage=self.stage, lr0=self.lr0, lower_lr0=self.lr0 / 10
        )
        return True


class FaultInjection:
    """Faults injected on purpose, for tests only: they run only when STAGEDYOLO_TEST_FAULT is set.

    - `nan@N`: poison the model's weights after iteration N, so the real loss turns NaN.
    - `oom@attempt1`: raise CUDA's out-of-memory error at the first batch of attempt 1.
    - `sleep@S`: sleep S seconds after every batch (keeps a stage running long enough to be killed).
    - `stall@train_end`: hang once training has ended (so a test can kill the stage after yolov5 has stripped
      last.pt).
    - `nan_weights@final`: poison the final epoch's saved last.pt (model and EMA) while the loss stays finite, so
      only the check of the weights after training can see it.
    """

    ENV = "STAGEDYOLO_TEST_FAULT"

    def __init__(self, spec: str, attempt: int):
        self.kind, _, self.arg = spec.partition("@")
        self.attempt = attempt

    def on_train_batch_start(self):
        if self.kind == "oom" and self.arg == f"attempt{self.attempt}":
            import torch

            raise torch.cuda.OutOfMemoryError("CUDA out of memory. (injected by STAGEDYOLO_TEST_FAULT)")

    def on_model_save(self, last, epoch, final_epoch, best_fitness, fi):
        if self.kind == "nan_weights" and self.arg == "final" and final_epoch:
            import torch

            checkpoint = torch.load(last, map_location="cpu", weights_only=False)
            with torch.no_grad():
                for parameter in (p for key in ("model", "ema") for p in checkpoint[key].parameters()):
                    parameter.fill_(float("nan"))
            torch.save(checkpoint, last)

    def on_train_end(self, last, best, epoch, results):
        if self.kind == "stall" and self.arg == "train_end":
            print("stagedyolo test fault: stalling after training", flush=True)
            time.sleep(3600)

    def on_train_batch_end(self, model, ni, imgs, targets, paths, mloss):
        if self.kind == "nan" and ni == int(self.arg):
            import torch

            with torch.no_grad():
                for parameter in model.parameters():
                    parameter.fill_(float("nan"))
        elif self.kind == "sleep":
            time.sleep(float(self.arg))
