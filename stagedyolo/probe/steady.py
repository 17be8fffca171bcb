"""Timing a repeated step until its rate is steady. Pure Python, no torch: the probe's every measurement uses it.

The H200 run showed what short windows do: loader runs of 4-12 batches (1.3-2.9 s) ranked 4 workers above 12, and
3-6 AMP steps ranked AMP below fp32; both were warm-up (worker start, queued batches, cuDNN autotuning), not the
steady state a stage runs in for hours. So a measurement here first runs untimed warm-up steps, then times step by
step until the latest ``min_steps`` steps are steady (their first and second half agree within ``stable_within``),
or its ``max_seconds`` run out (then it is flagged ``stable: false``).

The probe as a whole has a time budget (``probe.budget_s``): ``MeasuringBudget`` gives each measurement an equal
share of what is left, and a measurement whose share runs out ends with the steps it has timed (``cut_by_budget``).
A candidate measurement that cannot even time its warm-up and two steps before the deadline, with the time the stage
loops after it need set aside, is not started (``affords``).
"""

from __future__ import annotations

import time
from collections.abc import Callable

# A measurement cut short by the budget still times this many steps: two halves to compare, one step each.
MIN_TIMED_STEPS = 2
# Untimed model steps before timing a step shape (image size, batch, autocast dtype) the process has not run yet:
# allocator, cuDNN autotuning (benchmark mode, per shape and dtype), lazy initialisation. A shape it has already run
# needs one untimed step (a new thread count, freeze or loader): on the 2-core demo machine the first step at such a
# shape was 5-15 % slower than the steady ones, the second at their rate.
MODEL_WARMUP_STEPS, SEEN_SHAPE_WARMUP_STEPS = 2, 1


# The probe may take this share of the planned training time when that is more than probe.budget_s: a training of
# hours can afford minutes of measuring, and its settings are measured better for it.
TRAINING_SHARE = 0.05

# The most the probe's choice may raise the training's images/s over the defaults the stages keep without it: what
# measuring the candidates can save, as a share of the planned training. On the 2-core CPU the demo's 10-epoch
# control ran in 47-48 s at the probe's choice (0 workers, 2 torch threads) and in 55-58 s at the defaults (1 worker,
# 1 thread): 1.2x (naive_vs_staged_demo_seeds_30e86a7 against naive_vs_staged_demo_unpaid; probe_choice measured
# 1.12x). On CUDA a GPU that waits on its loader trains at a fraction of its rate (the H200 run: 45 % data wait at a
# wrong worker count), so there the candidates are measured unless they would take longer than the whole training.
# Keyed by whether the probe runs on CUDA.
CHOICE_GAIN = {False: 0.2, True: 1.0}


class MeasuringBudget:
    """Shares the seconds until ``deadline`` among the measurements still to run: each gets an equal part of what
    is left when it starts, so one that ends early (stable, or a loader that is plainly fast enough) leaves its
    unused time to the later ones. ``budget_s``: the seconds the deadline allows from the probe's start, which
    ``note_rate`` lengthens to TRAINING_SHARE of the planned training when that is longer. The planned training is
    ``planned_train_images`` (each counted at the candidates' size by its image area, probe.rule.epochs_at) at the
    fastest rate measured in those units, or ``planned_training_s`` where the recipe has a time
    budget (recipe_minutes): the stages then train as many epochs as fill it, so the rate changes their epochs,
    not its length.
    """

    def __init__(
        self,
        deadline: float | None,
        runs: int,
        budget_s: float = 0.0,
        planned_train_images: int = 0,
        clock: Callable[[], float] = time.perf_counter,
        planned_training_s: float | None = None,
    ):
        self.deadline, self.runs_left, self.clock = deadline, max(runs, 1), clock
        self.started = None if deadline is None else deadline - budget_s
        self.planned_train_images, self.planned_training_s, self.fastest = planned_train_images, planned_training_s, 0.0

    @property
    def training_s(self) -> float:
        """The planned training's seconds: the recipe's time budget, else the planned images at the fastest rate so
        far (so not overestimated); 0 while neither is known."""
        if self.planned_training_s:
            return self.planned_training_s
        return self.planned_train_images / self.fastest if self.fastest > 0 else 0.0

    def note_rate(self, images_per_s: float | None) -> None:
        """A training rate just measured: the budget may grow to TRAINING_SHARE of the planned training."""
        self.fastest = max(self.fastest, images_per_s or 0.0)
        if self.deadline is not None and self.training_s > 0:
            self.deadline = max(self.deadline, self.started + TRAINING_SHARE * self.training_s)

    @property
    def allowed_s(self) -> float | None:
        """The seconds the budget allows from the probe's start, after any lengthening (None: no budget)."""
        return None if self.deadline is None else self.deadline - self.started

    def affords(self, floor_s: float, reserve_s: float) -> bool:
        """Whether a measurement that takes at least ``floor_s`` (its warm-up and MIN_TIMED_STEPS) fits before the
        deadline with ``reserve_s`` left for the measurements that must follow it. Always true without a budget."""
        return self.deadline is None or self.clock() + floor_s + reserve_s <= self.deadline

    def payoff(self, cuda: bool, expected: dict[str, list[float]] | None) -> dict | None:
        """Whether each part of the rest of the probe pays for itself, once a rate is known: the candidate runs may
        save CHOICE_GAIN of the planned training (``training_s``; under a time budget, as epochs); the stage
        loops make only the predictions, which save no training time, so they may cost TRAINING_SHARE of it, the share
        the budget grants the probe. ``expected``: each part's runs ("candidates", "stage_loops"), each one's expected
        seconds (child.RunCosts: its warm-up and min_steps; a loader stopping early); a part's cost is their sum, each
        at most the equal share of the time left that next_deadline would give it. None without a budget, a planned
        training, a rate or the expected seconds."""
        training_s = self.training_s
        if self.deadline is None or training_s <= 0 or self.fastest <= 0 or expected is None:
            return None
        share_s = max(self.deadline - self.clock(), 0.0) / max(self.runs_left, 1)

        def part(worth_s: float, run_s: list[float]) -> dict:
            cost_s = sum(min(share_s, s) for s in run_s)
            return {
                "runs": len(run_s),
                "worth_s": round(worth_s, 1),
                "cost_s": round(cost_s, 1),
                "measured": worth_s >= cost_s,
            }

        return {
            "training_s": round(training_s, 1),
            "at_images_per_s": round(self.fastest, 3),
            "training_from": "recipe_minutes" if self.planned_training_s else "the planned epochs",
            "candidates": {**part(CHOICE_GAIN[cuda] * training_s, expected["candidates"]), "share": CHOICE_GAIN[cuda]},
            "stage_loops": {**part(TRAINING_SHARE * training_s, expected["stage_loops"]), "share": TRAINING_SHARE},
        }

    def drop(self, runs: int) -> None:
        """Take ``runs`` planned measurements out together with their share of the time left, so that the others
        keep theirs and the probe ends sooner (skip, by contrast, leaves its share to the later runs)."""
        if self.deadline is not None:
            self.deadline -= max(self.deadline - self.clock(), 0.0) * runs / max(self.runs_left, 1)
        self.runs_left -= runs

    def skip(self) -> None:
        """A planned measurement that will not run: the later ones share its time."""
        self.runs_left -= 1

    def next_deadline(self) -> float | None:
        """The deadline of the measurement about to start (None: no budget)."""
        if self.deadline is None:
            return None
        now = self.clock()
        share = max(self.deadline - now, 0.0) / max(self.runs_left, 1)
        self.runs_left -= 1
        return now + share


def area_ratio(img: int, at: int) -> float:
    """How many images at ``at`` px one image at ``img`` px costs: a step's cost grows with its image area (the
    candidates' size is the probe's unit for steps, memory and the planned training)."""
    return (img / at) ** 2


def unpaid(payoff: dict | None, part: str) -> bool:
    """Whether ``part`` of the probe ("candidates" or "stage_loops") was judged not to pay (MeasuringBudget.payoff)
    and so not measured."""
    return payoff is not None and not payoff[part]["measured"]


def halves_agree(durations: list[float], images: list[int], stable_within: float) -> tuple[bool, list[float]]:
    """Whether the rates (images/s) of the first and second half of the timed steps differ by at most
    ``stable_within`` of the larger one; and both rates."""
    half = len(durations) // 2
    if half == 0:
        return False, []
    rates = [
        sum(images[:half]) / max(sum(durations[:half]), 1e-9),
        sum(images[half:]) / max(sum(durations[half:]), 1e-9),
    ]
    return abs(rates[0] - rates[1]) <= stable_within * max(rates), [round(r, 3) for r in rates]


def time_steady(
    step: Callable[[], int],
    *,
    warmup_steps: int,
    min_steps: int,
    stable_within: float,
    max_seconds: float,
    enough: Callable[[int, float], bool] | None = None,
    deadline: float | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> dict:
    """Time ``step`` (returns the images it processed) in its steady state.

    After ``warmup_steps`` untimed steps, steps are timed one by one; the measurement is the latest ``min_steps``
    of them, once its two halves agree within ``stable_within``. Steps before that window were still settling
    (a queue draining, clocks ramping) and count as warm-up too (``settling_steps``). ``enough(images, seconds)``
    may end a run early once its answer cannot matter (a loader far faster than the model cannot be the
    bottleneck). ``max_seconds`` bounds the timed part; then the latest window is reported with ``stable: false``.
    ``deadline`` (a ``clock()`` time, from MeasuringBudget) ends the timed part once MIN_TIMED_STEPS are timed and
    another step would end past it, with ``cut_by_budget``; the warm-up always runs in full, since a figure that
    includes it is not the steady one.
    """
    started = clock()
    for _ in range(warmup_steps):
        step()
    warmup_s = clock() - started
    durations: list[float] = []
    images: list[int] = []
    stable, rates, stopped_early, cut_by_budget = False, [], False, False
    window = slice(-min_steps, None)
    while True:
        t0 = clock()
        images.append(step())
        durations.append(clock() - t0)
        if len(durations) >= min_steps:
            stable, rates = halves_agree(durations[window], images[window], stable_within)
            if stable:
                break
            if enough is not None and enough(sum(images[window]), sum(durations[window])):
                stopped_early = True
                break
        if sum(durations) >= max_seconds:
            break
        # A step that would end past the deadline (judged by the last one) is not started: the probe's budget
        # holds, rather than being overrun by half a step on average.
        if deadline is not None and clock() + durations[-1] > deadline and len(durations) >= MIN_TIMED_STEPS:
            stable, rates = halves_agree(durations[window], images[window], stable_within)
            cut_by_budget = True
            break
    timed, counted = durations[window], images[window]
    seconds = sum(timed)
    return {
        "images_per_s": round(sum(counted) / seconds, 3) if seconds > 0 else None,
        "steps": len(timed),
        "images": sum(counted),
        "seconds": round(seconds, 4),
        "warmup_steps": warmup_steps,
        "warmup_s": round(warmup_s, 4),
        "settling_steps": len(durations) - len(timed),
        "settling_s": round(sum(durations) - seconds, 4),
        "stable": stable,  # the window's two halves agreed within stable_within
        "half_rates": rates,
        "stopped_early": stopped_early,
        "cut_by_budget": cut_by_budget,
    }
