"""StageTimer against a fake clock, driven in the exact hook order of yolov5 7.0.14 train.py."""

import json

import pytest

from stagedyolo.telemetry import StageTimer
from stagedyolo.telemetry import timer as timer_mod


class Callbacks:
    """The subset of yolov5.utils.callbacks.Callbacks the timer uses (importing yolov5 takes ~10 s)."""

    HOOKS = (
        "on_pretrain_routine_start",
        "on_pretrain_routine_end",
        "on_train_start",
        "on_train_epoch_start",
        "on_train_batch_start",
        "optimizer_step",
        "on_before_zero_grad",
        "on_train_batch_end",
        "on_train_epoch_end",
        "on_val_start",
        "on_val_batch_start",
        "on_val_image_end",
        "on_val_batch_end",
        "on_val_end",
        "on_fit_epoch_end",
        "on_model_save",
        "on_train_end",
        "on_params_update",
        "teardown",
    )

    def __init__(self):
        self._callbacks = {h: [] for h in self.HOOKS}
        self.stop_training = False

    def register_action(self, hook, name="", callback=None):
        assert hook in self._callbacks and callable(callback)
        self._callbacks[hook].append({"name": name, "callback": callback})

    def run(self, hook, *args, **kwargs):
        for a in self._callbacks[hook]:
            a["callback"](*args, **kwargs)


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t

    def advance(self, dt):
        self.t += dt


class Imgs:
    def __init__(self, n):
        self.shape = (n, 3, 64, 64)


class Loggers:
    """Stands in for yolov5's Loggers: registered inside train(), after the timer; costs time at known hooks."""

    def __init__(self, clock, batch_log=0.0, fit_log=0.0, save_log=0.0, end_log=0.0):
        self.clock, self.batch_log, self.fit_log, self.save_log, self.end_log = (
            clock,
            batch_log,
            fit_log,
            save_log,
            end_log,
        )

    def on_train_batch_end(self, model, ni, *a):
        if ni < 2:
            self.clock.advance(self.batch_log)

    def on_fit_epoch_end(self, *a):
        self.clock.advance(self.fit_log)

    def on_model_save(self, *a):
        self.clock.advance(self.save_log)

    def on_train_end(self, *a):
        self.clock.advance(self.end_log)


def fake_train(
    cb,
    clock,
    epochs=3,
    nb=4,
    bs=8,
    wait=0.1,
    comp=0.5,
    first_wait=1.0,
    val=2.0,
    ckpt=0.3,
    loggers=None,
    build=5.0,
    validate=lambda e: True,
    stop_at=None,
    final_val=1.5,
    strip=0.2,
):
    """Replays yolov5 train.py's callback order (train.py lines 81-487) with known durations."""
    cb.run("on_pretrain_routine_start")
    clock.advance(build)
    if loggers:  # Loggers(...) registered here in train(), i.e. after the timer
        for k in ("on_train_batch_end", "on_fit_epoch_end", "on_model_save", "on_train_end"):
            cb.register_action(k, callback=getattr(loggers, k))
    cb.run("on_pretrain_routine_end", None, None)
    cb.run("on_train_start")
    for epoch in range(epochs):
        cb.run("on_train_epoch_start")
        for i in range(nb):
            clock.advance(first_wait if (epoch == 0 and i == 0) else wait)
            cb.run("on_train_batch_start")
            clock.advance(comp)
            cb.run("on_train_batch_end", None, i + nb * epoch, Imgs(bs), None, None, [0.0])
            if stop_at == (epoch, i):
                cb.stop_training = True
                return
        cb.run("on_train_epoch_end", epoch=epoch)
        if validate(epoch):
            clock.advance(0.1)
            cb.run("on_val_start")
            clock.advance(val - 0.1)
        cb.run("on_fit_epoch_end", [], epoch, 0.0, 0.0)
        clock.advance(ckpt)
        cb.run("on_model_save", None, epoch, epoch == epochs - 1, 0.0, 0.0)
    clock.advance(strip)
    cb.run("on_val_start")  # post-training validation of best.pt
    clock.advance(final_val)
    cb.run("on_train_end", None, None, epochs - 1, None)


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(timer_mod, "_pc", c)
    return c


def test_phases_and_batches(clock):
    cb = Callbacks()
    t = StageTimer(cuda=False, process_start=None)
    t.register(cb)
    logs = Loggers(clock, batch_log=0.7, fit_log=0.05, save_log=0.01, end_log=3.0)
    fake_train(cb, clock, loggers=logs)
    raw = t.raw()
    assert raw["finished"] and raw["late_hooks"]
    assert raw["setup_build_s"] == pytest.approx(5.0)
    eps = raw["epochs"]
    assert [e["epoch"] for e in eps] == [0, 1, 2]
    e0, e1 = eps[0], eps[1]
    assert e0["batches"] == 4 and e0["images"] == 32
    # logger plot time on the first two batches is logging, not data wait of the next batch
    assert e0["batch_logging_s"] == pytest.approx(1.4)
    assert e0["data_wait_s"] == pytest.approx(1.0 + 3 * 0.1)
    assert e0["compute_s"] == pytest.approx(4 * 0.5)
    assert e0["train_s"] == pytest.approx(1.3 + 2.0)
    assert e1["data_wait_s"] == pytest.approx(0.4) and e1["batch_logging_s"] == 0
    for e in eps:
        assert e["val_s"] == pytest.approx(2.0)
        assert e["logging_s"] == pytest.approx(0.06)
        assert e["checkpoint_s"] == pytest.approx(0.3)
        assert e["validated"] and e["saved"] and e["complete"]
        assert e["compute_p50_s"] == pytest.approx(0.5)
    assert raw["final"]["checkpoint_s"] == pytest.approx(0.2)
    assert raw["final"]["val_s"] == pytest.approx(1.5)
    assert raw["final"]["logging_s"] == pytest.approx(3.0)
    assert raw["memory"]["torch_max_allocated_bytes"] is None and raw["memory"]["reason"]


def test_total_time_is_accounted(clock):
    """Every second between on_train_start and the late on_train_end lands in exactly one bucket."""
    cb = Callbacks()
    t = StageTimer()
    t.register(cb)
    start = clock.t
    fake_train(cb, clock, loggers=Loggers(clock, 0.3, 0.2, 0.1, 1.0), validate=lambda e: e == 2)
    raw = t.raw()
    buckets = sum(
        e["train_s"]
        + e["batch_logging_s"]
        + e["val_s"]
        + e["logging_s"]
        + e["checkpoint_s"]
        + e["tail_s"]
        + e["gap_before_s"]
        for e in raw["epochs"]
    )
    buckets += sum(raw["final"].values())
    assert buckets == pytest.approx(clock.t - (start + 5.0))
    assert [e["validated"] for e in raw["epochs"]] == [False, False, True]
    assert raw["epochs"][0]["val_s"] == pytest.approx(0.0)


def test_without_late_hooks_degrades_gracefully(clock):
    """If nothing registers after the timer (no Loggers), epochs still close and add up."""
    cb = Callbacks()
    t = StageTimer()
    t.register(cb)
    fake_train(cb, clock, epochs=2)
    raw = t.raw()
    assert len(raw["epochs"]) == 2 and all(e["complete"] for e in raw["epochs"])
    assert raw["epochs"][1]["checkpoint_s"] == pytest.approx(0.3)


def test_stop_mid_epoch_and_write_raw(clock, tmp_path):
    cb = Callbacks()
    t = StageTimer()
    t.register(cb)
    fake_train(cb, clock, epochs=3, stop_at=(1, 1))
    p = t.write_raw(tmp_path / "timing_raw.json")
    raw = json.loads(p.read_text())
    assert not raw["finished"]
    assert len(raw["epochs"]) == 2
    assert raw["epochs"][0]["complete"] and not raw["epochs"][1]["complete"]
    assert raw["epochs"][1]["batches"] == 2 and raw["epochs"][1]["images"] == 16
    # raw() must not mutate state: a second call gives the same epochs
    assert len(t.raw()["epochs"]) == 2


def test_process_start_gives_setup(clock):
    t = StageTimer(process_start=0.0)
    cb = Callbacks()
    t.register(cb)
    t._wall0, t._pc0 = 100.0, clock.t  # pin the perf->unix mapping
    clock.advance(7.0)
    cb.run("on_pretrain_routine_start")
    clock.advance(3.0)
    cb.run("on_train_start")
    raw = t.raw()
    assert raw["setup_imports_s"] == pytest.approx(107.0)
    assert raw["setup_build_s"] == pytest.approx(3.0)
    assert raw["setup_s"] == pytest.approx(110.0)


@pytest.mark.exclusive  # a wall-clock bound
def test_real_clock_overhead_is_tiny():
    """Per-batch hook cost with the real perf_counter: a regression guard (generous bound)."""
    import time

    cb = Callbacks()
    t = StageTimer()
    t.register(cb)
    cb.run("on_train_start")
    cb.run("on_train_epoch_start")
    imgs = Imgs(16)
    n = 20000
    t0 = time.perf_counter()
    for i in range(n):
        cb.run("on_train_batch_start")
        cb.run("on_train_batch_end", None, i, imgs, None, None, None)
    per_batch = (time.perf_counter() - t0) / n
    assert per_batch < 50e-6  # yolov5n batches take >= 10 ms even on a big GPU
