"""The probe's steady-state timer, on a scripted clock: warm-up excluded, stops when its halves agree, and the
probe's time budget shared among its measurements."""

import itertools

from stagedyolo.probe.steady import MIN_TIMED_STEPS, MeasuringBudget, halves_agree, time_steady


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
    result = time_steady(
        steps.step, warmup_steps=2, min_steps=10, stable_within=0.05, max_seconds=60, clock=steps.clock
    )
    assert result["steps"] == 10 and result["stable"] is True
    assert abs(result["images_per_s"] - 100.0) < 1e-6 and abs(result["warmup_s"] - 10.0) < 1e-9


def test_a_run_that_is_still_speeding_up_keeps_going_until_its_halves_agree():
    durations = [0.4, 0.3, 0.2, 0.15] + [0.1] * 200  # queued batches, then the steady rate
    steps = ScriptedSteps(durations)
    result = time_steady(steps.step, warmup_steps=0, min_steps=4, stable_within=0.05, max_seconds=60, clock=steps.clock)
    assert result["stable"] is True and result["steps"] == 4 and result["settling_steps"] > 0
    assert abs(result["images_per_s"] - 100.0) < 1e-6  # the settling steps are not in the figure


def test_an_unsteady_run_ends_at_its_budget_and_says_so():
    steps = ScriptedSteps(0.1 * 1.1**k for k in itertools.count())  # slowing down all the time (e.g. throttling)
    result = time_steady(steps.step, warmup_steps=0, min_steps=4, stable_within=0.01, max_seconds=5, clock=steps.clock)
    assert result["settling_s"] + result["seconds"] >= 5 and result["stable"] is False and result["steps"] == 4


def test_enough_ends_a_run_early_after_min_steps():
    steps = ScriptedSteps(itertools.cycle([0.01, 0.05]))  # never steady within 1 %
    result = time_steady(
        steps.step,
        warmup_steps=0,
        min_steps=6,
        stable_within=0.001,
        max_seconds=60,
        enough=lambda images, seconds: images / seconds > 100,
        clock=steps.clock,
    )
    assert result["stopped_early"] is True and result["steps"] == 6


def test_halves_agree():
    assert halves_agree([1.0, 1.0, 1.0, 1.04], [10] * 4, 0.05)[0] is True
    assert halves_agree([1.0, 1.0, 1.2, 1.2], [10] * 4, 0.05)[0] is False
    assert halves_agree([1.0], [10], 0.05) == (False, [])


def test_a_deadline_ends_the_timed_part_after_the_full_warm_up_and_says_so():
    steps = ScriptedSteps([2.0, 2.0] + [0.1 * 1.1**k for k in range(100)])  # never steady
    result = time_steady(
        steps.step, warmup_steps=2, min_steps=10, stable_within=0.01, max_seconds=60, deadline=3.0, clock=steps.clock
    )
    # The deadline passed during the warm-up, which still ran in full; then the fewest steps a figure needs.
    assert result["warmup_s"] == 4.0 and result["steps"] == MIN_TIMED_STEPS and result["cut_by_budget"] is True
    assert abs(result["images_per_s"] - 20 / (0.1 + 0.11)) < 1e-3
    steps = ScriptedSteps([0.1] * 100)
    result = time_steady(
        steps.step, warmup_steps=0, min_steps=10, stable_within=0.05, max_seconds=60, deadline=99.0, clock=steps.clock
    )
    assert result["cut_by_budget"] is False and result["stable"] is True and result["steps"] == 10


def test_a_step_that_would_end_past_the_deadline_is_not_started():
    steps = ScriptedSteps([1.0] * 100)
    result = time_steady(
        steps.step, warmup_steps=0, min_steps=10, stable_within=0.0, max_seconds=60, deadline=3.5, clock=steps.clock
    )
    # After three steps (3.0 s) a fourth would end at 4.0 s, past 3.5 s: the run ends within its budget.
    assert result["steps"] == 3 and steps.now == 3.0 and result["cut_by_budget"] is True


def test_the_budget_gives_each_measurement_an_equal_share_of_what_is_left():
    now = [0.0]
    budget = MeasuringBudget(deadline=12.0, runs=3, clock=lambda: now[0])
    assert budget.next_deadline() == 4.0  # 12 s for 3 runs
    now[0] = 2.0  # the first ended early (steady): the other two share the rest
    assert budget.next_deadline() == 7.0
    now[0] = 9.0  # the second overran (its warm-up): the last still gets what is left, none of it lost
    assert budget.next_deadline() == 12.0
    now[0] = 13.0  # past the deadline: a run gets no timed share (time_steady still times MIN_TIMED_STEPS)
    assert budget.next_deadline() == 13.0
    assert MeasuringBudget(deadline=None, runs=3).next_deadline() is None


def test_a_run_is_afforded_only_with_the_time_kept_for_the_runs_after_it_and_a_skipped_one_leaves_its_share():
    now = [4.0]
    budget = MeasuringBudget(deadline=12.0, runs=4, clock=lambda: now[0])
    assert budget.affords(floor_s=3.0, reserve_s=5.0)  # 4 + 3 + 5 = 12: just fits
    assert not budget.affords(floor_s=3.5, reserve_s=5.0)
    budget.skip()  # three runs left share the 8 s
    assert budget.next_deadline() == 4.0 + 8.0 / 3
    assert MeasuringBudget(deadline=None, runs=2).affords(floor_s=1e9, reserve_s=1e9)  # no budget: always


def test_the_budget_grows_to_a_share_of_the_planned_training_at_the_fastest_rate_and_never_shrinks():
    now = [0.0]
    short = MeasuringBudget(deadline=15.0, runs=4, budget_s=15.0, planned_train_images=1000, clock=lambda: now[0])
    short.note_rate(100.0)  # 10 s of training: a 0.5 s share, less than the 15 s
    assert short.deadline == 15.0
    budget = MeasuringBudget(deadline=15.0, runs=4, budget_s=15.0, planned_train_images=3_600_000, clock=lambda: now[0])
    budget.note_rate(None)  # a failed run: no rate, no change
    assert budget.deadline == 15.0
    budget.note_rate(1000.0)  # an hour of training: 180 s
    assert budget.deadline == 180.0 and budget.allowed_s == 180.0 and budget.next_deadline() == 45.0
    budget.note_rate(500.0)  # a slower run does not make the training look longer
    assert budget.deadline == 180.0
    budget.note_rate(2000.0)  # a faster one makes it shorter, but the budget never shrinks
    assert budget.deadline == 180.0


def test_under_a_recipe_time_budget_the_planned_training_lasts_the_budget_whatever_the_rate():
    budget = MeasuringBudget(deadline=15.0, runs=4, budget_s=15.0, planned_train_images=1000, planned_training_s=600.0)
    assert budget.training_s == 600.0
    assert budget.payoff(False, {"candidates": [1.0], "stage_loops": [1.0]}) is None  # only once a rate is known
    budget.note_rate(100.0)  # 10 s of the planned epochs at this rate, but the stages will fill 600 s
    assert budget.allowed_s == 30.0  # 5 % of 600 s
    assert MeasuringBudget(deadline=15.0, runs=4, planned_train_images=1000).training_s == 0.0  # no rate yet
