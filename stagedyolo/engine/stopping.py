"""Ending a stage early, at an epoch boundary: yolov5's `patience` judged on validated epochs only, and a time budget.

yolov5 7.0's train.py builds `stopper = EarlyStopping(patience=opt.patience)`. Every epoch (rank 0) it sets
`final_epoch = (epoch + 1 == epochs) or stopper.possible_stop` before validating, calls `stop = stopper(epoch, fi)`
after, saves the checkpoint (a final epoch is saved even with nosave), then breaks out of the epoch loop when `stop`
(broadcast to every DDP rank) and runs its normal ending: strip the optimizer, validate best.pt, on_train_end. That
is the one clean exit at an epoch boundary: `callbacks.stop_training` is read after a batch and returns from train()
at once, with no final validation and an unstripped last.pt. So the patch table's `epoch_stop` row replaces
train.EarlyStopping with `EpochStop.early_stopping`, which hands yolov5 this object instead.

Why not yolov5's own EarlyStopping: it counts epochs since the best fitness whatever the fitness is. With val_period
a skipped epoch's fitness is NaN (ValidationSchedule), never >= the best, so it would stop on an epoch nobody
validated.
"""

from __future__ import annotations

import math
import time

PATIENCE, TIME_BUDGET, STALL = "patience", "time_budget", "stall"


class GainStall:
    """Hand over when a phase stops paying: its validated fitness gain per second fell below ``fraction`` of the
    best gain per second this stage has had. The first interval runs from the stage's start and the fitness the
    previous stage handed over (``fitness_before``, when it was validated at this stage's val_img); without it the
    rule needs three validations. ``figures`` lists every interval: what the decision was made from."""

    def __init__(self, fraction: float, fitness_before: float | None):
        self.fraction, self.fitness_before = fraction, fitness_before
        self.last: tuple[float, float] | None = None
        self.figures: list[dict] = []

    @classmethod
    def for_plan(cls, plan: dict) -> GainStall | None:
        """The stage's handover rule (handover_on_stall), from the fitness the previous stage handed over."""
        if not plan.get("handover_on_stall"):
            return None
        return cls(plan["handover_on_stall"], plan.get("fitness_before"))

    def begin(self, train_started: float) -> None:
        if self.fitness_before is not None:
            self.last = (train_started, self.fitness_before)

    def stalled(self, epoch: int, fitness: float, now: float) -> bool:
        if self.last is not None:
            gain_per_s = (fitness - self.last[1]) / max(now - self.last[0], 1e-9)
            self.figures.append({"epoch": epoch, "fitness": round(fitness, 5), "gain_per_s": gain_per_s})
        self.last = (now, fitness)
        rates = [f["gain_per_s"] for f in self.figures]
        return len(rates) >= 2 and rates[-1] < self.fraction * max(rates)


class EpochStop:
    """yolov5's EarlyStopping interface (`possible_stop`, `__call__(epoch, fitness) -> stop`), plus hooks.

    - patience: stop at a validated epoch at least `patience` epochs after the best fitness (ties count as better,
      as in yolov5); skipped epochs are never judged.
    - time budget: at the end of an epoch's training, if the time since `started_at` plus one more epoch (the mean
      epoch time so far) would exceed `budget_s`, this epoch is the last: it is validated and saved.
    - stall (`handover_on_stall`): at a validated epoch whose gain per second stalled (GainStall). The epoch was
      validated and, unless nosave, saved; the next stage continues from it.
    ``reason`` says which one ended the stage (None: it ran all its epochs).
    """

    def __init__(
        self, budget_s: float | None, schedule, started_at: float, clock=time.time, stall: GainStall | None = None
    ):
        self.budget_s, self.schedule, self.started_at, self.clock = budget_s, schedule, started_at, clock
        self.stall = stall
        self.patience = 0
        self.best_fitness, self.best_epoch = 0.0, 0
        self.possible_stop = False  # read by train.py: this epoch is final (validate and save it)
        self.reason: str | None = None
        self.train_started: float | None = None
        self.first_epoch: int | None = None

    def early_stopping(self, patience=0):
        """Stands in for yolov5's `EarlyStopping(patience=opt.patience)`: opt (or a resumed run's opt.yaml) keeps
        deciding the patience."""
        self.patience = int(patience or 0)
        return self

    def on_train_start(self, *args):
        self.train_started = self.clock()
        if self.stall:
            self.stall.begin(self.train_started)

    def on_train_epoch_end(self, epoch):
        if self.first_epoch is None:
            self.first_epoch = epoch
        if self._budget_ends_after(epoch):
            self.reason = TIME_BUDGET
            self.schedule.end_at(epoch)
        self.possible_stop = self.reason == TIME_BUDGET or self._patience_may_stop_at(epoch)

    def __call__(self, epoch: int, fitness) -> bool:
        fitness = float(fitness)
        if not math.isfinite(fitness):  # an epoch the schedule skipped (NaN) is never judged
            return self.reason == TIME_BUDGET
        if fitness >= self.best_fitness:
            self.best_epoch, self.best_fitness = epoch, fitness
        if self.reason == TIME_BUDGET:
            return True
        if self.stall and self.stall.stalled(epoch, fitness, self.clock()):
            self.reason = STALL
            print(
                f"stagedyolo: handing over at epoch {epoch}: the fitness gain per second fell below "
                f"{self.stall.fraction:g} of this stage's best ({self.stall.figures})"
            )
            return True
        if self.patience and epoch - self.best_epoch >= self.patience:
            self.reason = PATIENCE
            print(
                f"stagedyolo: stopping early at epoch {epoch}: no better fitness in the {epoch - self.best_epoch} "
                f"epochs since epoch {self.best_epoch} (patience {self.patience}, validated epochs only)"
            )
            return True
        return False

    def _patience_may_stop_at(self, epoch: int) -> bool:
        """Whether this epoch's validation may end the stage (then train.py saves it even with nosave)."""
        return bool(self.patience) and self.schedule.should_validate(epoch) and epoch - self.best_epoch >= self.patience

    def _budget_ends_after(self, epoch: int) -> bool:
        if self.budget_s is None or self.train_started is None or epoch + 1 >= self.schedule.epochs:
            return False
        now = self.clock()
        mean_epoch_s = (now - self.train_started) / (epoch - self.first_epoch + 1)
        ends = now - self.started_at + mean_epoch_s > self.budget_s
        if ends:
            print(
                f"stagedyolo: time budget: epoch {epoch} is the last ({now - self.started_at:.0f} s used, one more "
                f"epoch ~{mean_epoch_s:.0f} s, budget {self.budget_s:.0f} s)"
            )
        return ends
