"""EpochStop (patience on validated epochs, time budget) and the progress line, replayed without training."""

import io
import json
import math

import pytest

from stagedyolo.engine.hooks import ValidationSchedule
from stagedyolo.engine.stopping import EpochStop
from stagedyolo.progress import PROGRESS_FILE, ProgressRelay, later_stages_s, progress_line, record_progress, run_eta_s

NAN = math.nan


def replay(stop, schedule, fitness_by_epoch, clock=None, epoch_s=0.0):
    """Drive the stopper as train.py does; returns the epoch after which training broke off, or None."""
    stop.on_train_start()
    for epoch, fitness in enumerate(fitness_by_epoch):
        if clock is not None:
            clock.now += epoch_s
        schedule.on_train_epoch_end(epoch)
        stop.on_train_epoch_end(epoch)
        validated = schedule.should_validate(epoch)
        if stop(epoch, fitness if validated else NAN):
            return epoch
    return None


class Clock:
    def __init__(self, now=0.0):
        self.now = now

    def __call__(self):
        return self.now


def test_patience_judges_validated_epochs_only():
    # validated epochs (val_period 3): 2, 5, 8. Fitness improves at 2, not at 5: stop there, never on 3 or 4.
    fitness = [NAN, NAN, 0.5, NAN, NAN, 0.4, NAN, NAN, 0.6]
    schedule = ValidationSchedule(period=3, epochs=9)
    stop = EpochStop(None, schedule, started_at=0.0).early_stopping(patience=1)
    assert replay(stop, schedule, fitness) == 5 and stop.reason == "patience"


def test_yolov5s_own_early_stopping_would_stop_on_a_skipped_epoch():
    from yolov5.utils.torch_utils import EarlyStopping  # the behaviour EpochStop replaces

    stopper = EarlyStopping(patience=1)
    assert [stopper(epoch=e, fitness=f) for e, f in enumerate([NAN, NAN, 0.5])][:2] == [False, True]


def test_patience_counts_epochs_since_the_best_and_ties_count_as_better():
    schedule = ValidationSchedule(period=1, epochs=10)
    stop = EpochStop(None, schedule, started_at=0.0).early_stopping(patience=3)
    assert replay(stop, schedule, [0.1, 0.3, 0.3, 0.2, 0.2, 0.2, 0.9]) == 5  # best at 2 (tie), 5 - 2 = 3
    assert stop.possible_stop  # train.py validates and saves epoch 5 as a final epoch, even with nosave


def test_patience_zero_never_stops():
    schedule = ValidationSchedule(period=1, epochs=5)
    stop = EpochStop(None, schedule, started_at=0.0).early_stopping(patience=0)
    assert replay(stop, schedule, [0.5, 0.1, 0.1, 0.1, 0.1]) is None and stop.reason is None


def test_time_budget_ends_at_the_epoch_after_which_one_more_would_not_fit():
    # 10 s of set-up, then 10 s per epoch, budget 35 s: after epoch 1 (30 s used) one more would reach 40 s.
    clock = Clock(10.0)
    schedule = ValidationSchedule(period=5, epochs=8)
    stop = EpochStop(35.0, schedule, started_at=0.0, clock=clock).early_stopping(patience=0)
    assert replay(stop, schedule, [0.1] * 8, clock=clock, epoch_s=10.0) == 1
    assert stop.reason == "time_budget" and stop.possible_stop
    assert schedule.last_epoch == 1 and schedule.should_validate(1)  # the last epoch is validated, as a final one


def test_a_budget_that_fits_lets_the_stage_finish():
    clock = Clock(0.0)
    schedule = ValidationSchedule(period=1, epochs=3)
    stop = EpochStop(100.0, schedule, started_at=0.0, clock=clock).early_stopping()
    assert replay(stop, schedule, [0.1] * 3, clock=clock, epoch_s=10.0) is None and stop.reason is None


def test_run_eta_scales_later_stages_by_pixels():
    plan = {
        "stage": "b",
        "img": 64,
        "run_stages": [
            {"stage": "a", "epochs": 9, "img": 64},
            {"stage": "b", "epochs": 2, "img": 64},
            {"stage": "c", "epochs": 3, "img": 128},
        ],
    }
    assert later_stages_s(plan, mean_epoch_s=10.0) == 3 * 10.0 * 4  # a is done; c: 4x the pixels
    assert run_eta_s(plan, stage_eta_s=20.0, mean_epoch_s=10.0, elapsed_s=5.0) == 20.0 + 120.0


def test_run_eta_under_a_time_budget_is_the_budgets_end():
    outline = [{"stage": "a", "epochs": 9, "img": 64}, {"stage": "b", "epochs": 3, "img": 128}]
    plan = {"stage": "a", "img": 64, "run_stages": outline, "epochs_decision": {"left_s": 300.0}}
    # b will be sized to what a leaves of the 300 s, whatever its configured 3 epochs would take
    assert run_eta_s(plan, stage_eta_s=40.0, mean_epoch_s=10.0, elapsed_s=100.0) == 200.0
    assert run_eta_s(plan, stage_eta_s=250.0, mean_epoch_s=10.0, elapsed_s=100.0) == 250.0  # a itself runs past it
    last = {**plan, "stage": "b", "img": 128}
    assert run_eta_s(last, stage_eta_s=30.0, mean_epoch_s=10.0, elapsed_s=100.0) == 30.0  # nothing after it


def test_progress_line_and_relay_print_each_epoch_once(tmp_path):
    record = {
        "stage": "frozen",
        "epoch": 3,
        "epochs": 6,
        "images_per_s": 412.34,
        "map50": 0.8123,
        "stage_eta_s": 12,
        "run_eta_s": 3725,
        "stopping": None,
        "updated": 1.0,
    }
    line = progress_line(record)
    assert line == "[frozen] epoch 3/6  412.3 img/s  mAP50 0.812  stage ETA 0:00:12  run ETA 1:02:05"
    record_progress(tmp_path, {**record, "epoch": 2})  # a resumed stage's earlier epoch: already shown
    stream = io.StringIO()
    with ProgressRelay(tmp_path, stream=stream, interval_s=60) as relay:
        record_progress(tmp_path, record)
        relay.poll()
        relay.poll()  # unchanged: not printed again
        # two epochs between polls (a short epoch on a loaded machine): both are printed
        record_progress(tmp_path, {**record, "epoch": 4, "map50": None, "updated": 2.0})
        record_progress(tmp_path, {**record, "epoch": 5, "updated": 3.0})
    assert stream.getvalue().splitlines() == [
        line,
        "[frozen] epoch 4/6  412.3 img/s  stage ETA 0:00:12  run ETA 1:02:05",
        line.replace("epoch 3/6", "epoch 5/6"),
    ]
    assert json.loads((tmp_path / PROGRESS_FILE).read_text())["epoch"] == 5  # status reads the latest


def test_a_phase_hands_over_when_its_gain_per_second_stalls_and_records_the_figures():
    from stagedyolo.engine.stopping import STALL, GainStall

    times = iter([0.0, 10.0, 20.0, 30.0, 40.0])
    schedule = ValidationSchedule(1, 10)
    stop = EpochStop(None, schedule, started_at=0.0, clock=lambda: next(times), stall=GainStall(0.25, 0.10))
    stop.on_train_start()  # t = 0, from the handed-over fitness 0.10
    assert stop(0, 0.20) is False  # +0.01 / s
    assert stop(1, 0.28) is False  # +0.008 / s: still >= a quarter of the best
    assert stop(2, 0.29) is True and stop.reason == STALL  # +0.001 / s < 0.25 * 0.01
    assert [f["epoch"] for f in stop.stall.figures] == [0, 1, 2]
    assert stop.stall.figures[0]["gain_per_s"] == pytest.approx(0.01)


def test_without_a_handed_over_fitness_the_stall_rule_waits_for_three_validations():
    from stagedyolo.engine.stopping import GainStall

    times = iter([0.0, 10.0, 20.0, 30.0])
    stop = EpochStop(
        None, ValidationSchedule(1, 10), started_at=0.0, clock=lambda: next(times), stall=GainStall(0.25, None)
    )
    stop.on_train_start()
    assert stop(0, 0.5) is False and stop(1, 0.6) is False  # one interval: nothing to compare with
    assert stop(2, 0.6) is True
