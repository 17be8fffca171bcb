"""The probe's steady-state timer, on a scripted clock: warm-up excluded, stops when its halves agree."""

import itertools

from stagedyolo.probe.steady import halves_agree, time_steady


class ScriptedSteps:
    """step() advances a fake clock by the next scripted duration and reports 10 images."""

    def __init__(self, durations):
        self.now, self.durations = 0.0, iter(durations)

    def clock(self):
        return self.now

    def step(self):
        self.now += next(self.durations)
        return 10


def test_warm_up_is_not_timed_and_a_steady_run_stops_at_min_steps():
    steps = ScriptedSteps([5.0, 5.0] + [0.1] * 100)  # two slow warm-up steps (worker start, autotuning)
    result = time_steady(steps.step, warmup_steps=2, min_steps=10, stable_within=0.05, max_seconds=60,
                         clock=steps.clock)  # fmt: skip
    assert result["steps"] == 10 and result["stable"] is True
    assert abs(result["images_per_s"] - 100.0) < 1e-6 and abs(result["warmup_s"] - 10.0) < 1e-9


def test_a_run_that_is_still_speeding_up_keeps_going_until_its_halves_agree():
    durations = [0.4, 0.3, 0.2, 0.15] + [0.1] * 200  # queued batches, then the steady rate
    steps = ScriptedSteps(durations)
    result = time_steady(steps.step, warmup_steps=0, min_steps=4, stable_within=0.05, max_seconds=60,
                         clock=steps.clock)  # fmt: skip
    assert result["stable"] is True and result["steps"] == 4 and result["settling_steps"] > 0
    assert abs(result["images_per_s"] - 100.0) < 1e-6  # the settling steps are not in the figure


def test_an_unsteady_run_ends_at_its_budget_and_says_so():
    steps = ScriptedSteps(0.1 * 1.1**k for k in itertools.count())  # slowing down all the time (e.g. throttling)
    result = time_steady(steps.step, warmup_steps=0, min_steps=4, stable_within=0.01, max_seconds=5,
                         clock=steps.clock)  # fmt: skip
    assert result["settling_s"] + result["seconds"] >= 5 and result["stable"] is False and result["steps"] == 4


def test_enough_ends_a_run_early_after_min_steps():
    steps = ScriptedSteps(itertools.cycle([0.01, 0.05]))  # never steady within 1 %
    result = time_steady(steps.step, warmup_steps=0, min_steps=6, stable_within=0.001, max_seconds=60,
                         enough=lambda images, seconds: images / seconds > 100, clock=steps.clock)  # fmt: skip
    assert result["stopped_early"] is True and result["steps"] == 6


def test_halves_agree():
    assert halves_agree([1.0, 1.0, 1.0, 1.04], [10] * 4, 0.05)[0] is True
    assert halves_agree([1.0, 1.0, 1.2, 1.2], [10] * 4, 0.05)[0] is False
    assert halves_agree([1.0], [10], 0.05) == (False, [])
