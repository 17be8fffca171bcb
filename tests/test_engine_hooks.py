import math

import numpy as np
import pytest
import torch

from stagedyolo.engine.hooks import NonFiniteLossGuard, ValidationSchedule
from stagedyolo.engine.worker import resolve_device


class FakeCallbacks:
    stop_training = False


def test_validation_schedule_validates_every_period_and_the_final_epoch():
    schedule = ValidationSchedule(period=5, epochs=12)
    assert [e + 1 for e in range(12) if schedule.should_validate(e)] == [5, 10, 12]


def test_skipped_validation_returns_nan_so_best_never_comes_from_it():
    calls = []
    schedule = ValidationSchedule(period=2, epochs=4)
    run = schedule.wrap(lambda *a, **k: calls.append(1) or ((0.5,) * 7, np.zeros(3), np.zeros(3), (0, 0, 0)))
    model = type("M", (), {"nc": 3})()
    schedule.on_train_epoch_end(epoch=0)
    results, maps, _, _ = run(model=model)
    assert not calls and all(math.isnan(r) for r in results) and maps.shape == (3,)
    schedule.on_fit_epoch_end()
    schedule.on_train_epoch_end(epoch=1)
    assert run(model=model)[0] == (0.5,) * 7 and calls == [1]
    schedule.on_fit_epoch_end()
    run(model=model)  # outside the epoch loop (yolov5's final check of best.pt): always runs
    assert calls == [1, 1] and schedule.validated == [1]


def test_nonfinite_guard_stops_training_with_the_documented_message():
    callbacks = FakeCallbacks()
    guard = NonFiniteLossGuard("finetune", lr0=0.002)
    guard.callbacks = callbacks
    guard.on_train_batch_end(None, 3, None, None, None, [torch.tensor(0.1)] * 3)
    assert not callbacks.stop_training
    guard.on_train_batch_end(None, 4, None, None, None, [torch.tensor(float("nan"))] * 3)
    assert callbacks.stop_training
    assert "iteration 4" in guard.message and "stages.finetune.lr0: 0.0002" in guard.message
    assert "stages.finetune.amp: false" in guard.message


@pytest.mark.parametrize(
    ("device", "cuda", "expected"),
    [("auto", False, "cpu"), ("auto", True, ""), ("cuda", True, ""), ("0,1", True, "0,1")],
)
def test_resolve_device(device, cuda, expected):
    assert resolve_device(device, cuda) == expected


def test_close_engine_loggers_closes_the_tensorboard_writer_train_py_registered(tmp_path):
    """train.py registers its Loggers' methods as callbacks; the writer they hold is found through them and closed,
    so its events are on disk (and a second close, as when several hooks share the Loggers, does nothing)."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from torch.utils.tensorboard import SummaryWriter
    from yolov5.utils.callbacks import Callbacks

    from stagedyolo.engine.hooks import close_engine_loggers

    class Loggers:  # the shape of yolov5.utils.loggers.Loggers that matters here: hook methods and `tb`
        def __init__(self):
            self.tb = SummaryWriter(str(tmp_path), flush_secs=3600, max_queue=1000)  # nothing flushes by itself

        def on_fit_epoch_end(self, *args):
            self.tb.add_scalar("metrics/mAP_0.5", 0.5, 3)

        def on_train_end(self, *args):
            pass

    callbacks, loggers = Callbacks(), Loggers()
    for hook in ("on_fit_epoch_end", "on_train_end"):
        callbacks.register_action(hook, callback=getattr(loggers, hook))
    callbacks.run("on_fit_epoch_end")
    close_engine_loggers(callbacks)
    (events,) = tmp_path.glob("events.out.tfevents.*")
    assert [e.step for e in EventFileLoader(str(events)).Load() if e.summary.value] == [3]
    assert loggers.tb.all_writers is None  # closed
