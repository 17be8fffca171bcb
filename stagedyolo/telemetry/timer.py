"""StageTimer: per-batch / per-epoch / per-phase timing of one yolov5 training process, through yolov5's Callbacks.

How the boundaries map onto yolov5 7.0.14 ``train.py`` (rank -1/0 only)::

    process start ─ on_pretrain_routine_start ─ on_train_start              setup (imports | dataset+model build)
    on_train_epoch_start                                                    epoch starts
      repeat per batch:
        [data wait]  previous batch end (late hook) or epoch start → on_train_batch_start
        [compute]    on_train_batch_start → on_train_batch_end (ours, registered first)
        [logging]    on_train_batch_end (ours) → on_train_batch_end (late, after yolov5's Loggers)
    on_train_epoch_end                                                      train = epoch start → here − batch logging
      [val]        on_train_epoch_end → on_fit_epoch_end (ours)            ema attrs, val.run, fitness (on_val_start
                                                                            only flags "validated": in-loop val.run has
                                                                            plots=False, so on_val_end never fires)
      [logging]    on_fit_epoch_end (ours) → on_fit_epoch_end (late)        yolov5's Loggers: results.csv, TensorBoard
      [checkpoint] on_fit_epoch_end (late) → on_model_save (ours)           ckpt deepcopy + torch.save
      [logging]    on_model_save (ours) → on_model_save (late)
      [other]      → next on_train_epoch_start                              early-stop bookkeeping
    after the last epoch:
      [checkpoint] → on_val_start of the post-training validation           strip_optimizer(last, best), attempt_load
      [val]        on_val_start → on_train_end (ours)                       validation of best.pt (+ its plots)
      [logging]    on_train_end (ours) → on_train_end (late)                yolov5's Loggers: results.png, TB images

yolov5's Loggers register their hooks inside ``train()``, i.e. after ours. The "late" hooks are therefore appended
from our ``on_train_start`` (which fires after the Loggers were registered), so they run after every other action.

CUDA asynchrony: no synchronisation is added. Each batch yolov5 formats the running mean loss (a CUDA tensor) for
its progress bar (``pbar.set_description(... % (*mloss, ...))``) *before* ``on_train_batch_end``; converting the
tensor to a Python float blocks until the stream has executed everything queued before it — forward, backward,
optimizer step and EMA update. So ``on_train_batch_end`` is a synchronised boundary and compute/data-wait split
correctly. Epoch/val/save boundaries come after host-side reads of results, equally synchronised.
Peak memory is read with ``torch.cuda.max_memory_allocated/reserved`` (no sync) at each epoch end and at write.

Per batch the cost is three ``perf_counter()`` calls, two list appends and one attribute read (``imgs.shape[0]``).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from stagedyolo.fixed_costs import snakemake_call_unix
from stagedyolo.jsonio import write_json
from stagedyolo.telemetry.summary import quantile

RAW_VERSION = 1
_pc = time.perf_counter

SYNC_NOTE = (
    "no added synchronisation: on_train_batch_end fires after yolov5 formats the CUDA loss tensors for its progress "
    "bar, which blocks until forward/backward/optimizer/EMA of the batch have executed"
)


def _process_start_unix() -> float | None:
    try:
        import psutil

        return psutil.Process(os.getpid()).create_time()
    except Exception:  # pragma: no cover - psutil is a dependency, but timing must never break training
        return None


class StageTimer:
    """Collects timings through yolov5 callbacks; one per training process (rank 0).

    ``process_start``: UNIX time the process started (default: psutil's create_time of this process).
    ``snakemake_call``: UNIX time the `snakemake` call running this stage started (default: read from the parent
    processes, None where none is one); the report's fixed costs compare it across stages.
    ``cuda``: the device is CUDA; enables torch peak-memory readings (torch is imported only then).
    """

    def __init__(self, cuda: bool = False, process_start: float | None = None, snakemake_call: float | None = None):
        self.cuda = bool(cuda)
        self._wall0, self._pc0 = time.time(), _pc()
        self.process_start = process_start if process_start is not None else _process_start_unix()
        self.snakemake_call = snakemake_call if snakemake_call is not None else snakemake_call_unix()[0]
        self.callbacks = None
        self._late_registered = False
        self.t_pretrain = None
        self.t_train_start = None
        self.t_train_end = None
        self.t_train_end_late = None
        self.epochs: list[dict] = []
        self.final: dict = {}
        self._cur = None  # current epoch dict
        self._state = "setup"  # setup|started|train|after_train_epoch|after_fit|saving|tail|final|done
        self._t_mark = None  # last phase boundary
        self._last = None  # end of previous batch's work (data wait starts here)
        self._bs = None
        self._dw: list[float] = []
        self._cp: list[float] = []
        self._imgs = 0
        self._blog = 0.0
        self._final_val_start = None
        self.errors: list[str] = []

    # ------------------------------------------------------------------ registration
    _EARLY = (
        "on_pretrain_routine_start",
        "on_train_start",
        "on_train_epoch_start",
        "on_train_batch_start",
        "on_train_batch_end",
        "on_train_epoch_end",
        "on_val_start",
        "on_fit_epoch_end",
        "on_model_save",
        "on_train_end",
    )
    _LATE = ("on_train_batch_end", "on_fit_epoch_end", "on_model_save", "on_train_end")

    def register(self, callbacks) -> None:
        """Register the hook methods on a ``yolov5.utils.callbacks.Callbacks``; call before ``train.main``."""
        self.callbacks = callbacks
        for hook in self._EARLY:
            callbacks.register_action(hook, name="stagedyolo.StageTimer", callback=getattr(self, hook))

    def _register_late(self) -> None:
        if self._late_registered or self.callbacks is None:
            return
        for hook in self._LATE:
            self.callbacks.register_action(
                hook, name="stagedyolo.StageTimer.late", callback=getattr(self, f"_{hook}_late")
            )
        self._late_registered = True

    def _unix(self, t_pc: float | None) -> float | None:
        return None if t_pc is None else self._wall0 + (t_pc - self._pc0)

    # ------------------------------------------------------------------ hooks
    def on_pretrain_routine_start(self, *a, **k):
        self.t_pretrain = _pc()

    def on_train_start(self, *a, **k):
        self.t_train_start = _pc()
        self._t_mark = self.t_train_start
        self._state = "started"
        self._register_late()

    def on_train_epoch_start(self, *a, **k):
        now = _pc()
        self._close_tail(now)
        self._cur = {
            "epoch": len(self.epochs),
            "t_start": now,
            "complete": False,
            "validated": False,
            "saved": False,
            "gap_before_s": (now - self._t_mark) if self._t_mark is not None else 0.0,
        }
        self._dw, self._cp, self._imgs, self._blog = [], [], 0, 0.0
        self._last = now
        self._state = "train"

    def on_train_batch_start(self, *a, **k):
        now = _pc()
        self._dw.append(now - self._last)
        self._bs = now

    def on_train_batch_end(self, model=None, ni=None, imgs=None, *a, **k):
        now = _pc()
        self._cp.append(now - self._bs)
        self._last = now
        try:
            self._imgs += imgs.shape[0]
        except AttributeError:
            pass

    def _on_train_batch_end_late(self, *a, **k):
        now = _pc()
        self._blog += now - self._last
        self._last = now

    def on_train_epoch_end(self, epoch=None, *a, **k):
        now = _pc()
        if self._cur is None:
            return
        if epoch is not None:
            self._cur["epoch"] = int(epoch)
        self._end_train(now)
        self._state = "after_train_epoch"

    def on_val_start(self, *a, **k):
        now = _pc()
        if self._state == "after_train_epoch":
            self._cur["validated"] = True
        elif self._state in ("tail", "started") and self.t_train_start is not None and self.epochs:
            self._final_val_start = now  # post-training validation of best.pt

    def on_fit_epoch_end(self, *a, **k):
        now = _pc()
        if self._state != "after_train_epoch":
            return  # e.g. the extra COCO call after training: counted in the final phase
        self._cur["val_s"] = now - self._t_mark
        self._t_mark = now
        self._state = "after_fit"

    def _on_fit_epoch_end_late(self, *a, **k):
        now = _pc()
        if self._state != "after_fit":
            return
        self._cur["logging_s"] += now - self._t_mark
        self._t_mark = now
        self._end_epoch()

    def on_model_save(self, *a, **k):
        now = _pc()
        if self._state != "tail" or not self.epochs:
            return
        e = self.epochs[-1]
        e["checkpoint_s"] += now - self._t_mark
        e["saved"] = True
        self._t_mark = now
        self._state = "saving"

    def _on_model_save_late(self, *a, **k):
        now = _pc()
        if self._state != "saving":
            return
        self.epochs[-1]["logging_s"] += now - self._t_mark
        self._t_mark = now
        self._state = "tail"

    def on_train_end(self, *a, **k):
        now = _pc()
        self._close_partial(now)
        self.t_train_end = now
        mark = self._t_mark if self._t_mark is not None else now
        if self._final_val_start is not None and self._final_val_start >= mark:
            self.final["checkpoint_s"] = self._final_val_start - mark
            self.final["val_s"] = now - self._final_val_start
        else:
            self.final["checkpoint_s"] = now - mark
            self.final["val_s"] = 0.0
        self._t_mark = now
        self._state = "final"

    def _on_train_end_late(self, *a, **k):
        now = _pc()
        if self.t_train_end is None:
            return
        self.t_train_end_late = now
        self.final["logging_s"] = now - self.t_train_end
        self._state = "done"

    # ------------------------------------------------------------------ helpers
    def _batch_totals(self) -> dict:
        """The current epoch's batch counts and sums so far."""
        return {
            "batches": len(self._cp),
            "images": self._imgs,
            "data_wait_s": sum(self._dw[: len(self._cp)]),
            "compute_s": sum(self._cp),
            "batch_logging_s": self._blog,
        }

    def _end_train(self, now: float) -> None:
        """Close the current epoch's train part at ``now``: batch figures, train_s, the later phases at 0, memory."""
        c = self._cur
        c.update(self._batch_totals())
        sdw, scp = sorted(self._dw), sorted(self._cp)
        c["data_wait_p50_s"], c["data_wait_p90_s"] = quantile(sdw, 0.5), quantile(sdw, 0.9)
        c["data_wait_max_s"] = sdw[-1] if sdw else None
        c["compute_p50_s"], c["compute_p90_s"] = quantile(scp, 0.5), quantile(scp, 0.9)
        self._dw, self._cp = [], []
        c["train_s"] = (now - c["t_start"]) - c["batch_logging_s"]
        c["val_s"] = c["logging_s"] = c["checkpoint_s"] = 0.0
        self._record_memory(c)
        self._t_mark = now

    def _end_epoch(self, complete: bool = True) -> None:
        self._cur["complete"] = complete
        self.epochs.append(self._cur)
        self._cur = None
        self._state = "tail"

    def _close_tail(self, now: float) -> None:
        """Time since the last boundary of the previous epoch (no save: early-stop bookkeeping) goes to 'other'."""
        if self._state == "after_fit":  # late hook never fired (no Loggers registered): count as epoch end
            self._end_epoch()
        if self.epochs and self._state == "tail":
            self.epochs[-1]["tail_s"] = now - self._t_mark
            self._t_mark = now

    def _close_partial(self, now: float) -> None:
        """Fold an epoch whose later boundaries never came (stop, crash, missing late hooks) into the record."""
        if self._state == "train":
            self._end_train(now)
            self._end_epoch(complete=False)
        elif self._state in ("after_train_epoch", "after_fit"):
            key = "val_s" if self._state == "after_train_epoch" else "logging_s"
            self._cur[key] += now - self._t_mark
            self._t_mark = now
            self._end_epoch(complete=False)
        elif self._state == "saving":
            self._state = "tail"

    def _record_memory(self, c: dict) -> None:
        if not self.cuda:
            return
        try:
            import torch

            c["torch_max_allocated_bytes"] = int(torch.cuda.max_memory_allocated())
            c["torch_max_reserved_bytes"] = int(torch.cuda.max_memory_reserved())
        except Exception as exc:  # never break training for telemetry
            self.errors.append(f"memory: {exc!r}")

    def memory(self) -> dict:
        """Peak torch memory on the current CUDA device, or nulls with the reason."""
        unknown = dict.fromkeys(("torch_max_allocated_bytes", "torch_max_reserved_bytes", "total_bytes", "device_name"))
        if not self.cuda:
            return {**unknown, "reason": "device is not CUDA"}
        try:
            import torch

            dev = torch.cuda.current_device()
            props = torch.cuda.get_device_properties(dev)
            return {
                "torch_max_allocated_bytes": int(torch.cuda.max_memory_allocated(dev)),
                "torch_max_reserved_bytes": int(torch.cuda.max_memory_reserved(dev)),
                "total_bytes": int(props.total_memory),
                "device_name": props.name,
                "reason": None,
            }
        except Exception as exc:
            return {**unknown, "reason": f"torch.cuda unavailable: {exc!r}"}

    # ------------------------------------------------------------------ output
    def current_epoch(self) -> dict | None:
        """The epoch being finished (train_s, images, val_s once known), or the last complete one; None before any."""
        if self._cur is not None:
            return dict(self._cur)
        return dict(self.epochs[-1]) if self.epochs else None

    def raw(self) -> dict:
        """The raw record (a plain dict; safe to call at any time, also mid-epoch after a failure)."""
        now = _pc()
        epochs = [dict(e) for e in self.epochs]
        if self._state == "train":  # interrupted mid-epoch: snapshot without mutating
            c = {**self._cur, **self._batch_totals()}
            c.update(train_s=(now - c["t_start"]) - self._blog, val_s=0.0, logging_s=0.0, checkpoint_s=0.0)
            epochs.append(c)
        elif self._cur is not None:
            epochs.append(dict(self._cur))
        for e in epochs:
            e["t_start_unix"] = self._unix(e.pop("t_start", None))
            e.setdefault("tail_s", 0.0)

        def since(t0, t1):
            return None if t0 is None or t1 is None else t1 - t0

        return {
            "version": RAW_VERSION,
            "pid": os.getpid(),
            "cuda": self.cuda,
            "sync": SYNC_NOTE if self.cuda else "CPU: synchronous execution",
            "process_start_unix": self.process_start,
            "snakemake_call_unix": self.snakemake_call,
            "pretrain_start_unix": self._unix(self.t_pretrain),
            "train_start_unix": self._unix(self.t_train_start),
            "train_end_unix": self._unix(self.t_train_end_late or self.t_train_end),
            "written_unix": self._unix(now),
            "setup_s": since(self.process_start, self._unix(self.t_train_start)),
            "setup_imports_s": since(self.process_start, self._unix(self.t_pretrain)),
            "setup_build_s": since(self.t_pretrain, self.t_train_start),
            "start_gap_s": epochs[0]["gap_before_s"] if epochs else None,
            "finished": self.t_train_end is not None,
            "late_hooks": self._late_registered,
            "epochs": epochs,
            "final": dict(self.final),
            "memory": self.memory(),
            "errors": list(self.errors),
        }

    def write_raw(self, path) -> Path:
        """Write ``raw()`` as JSON (atomic replace). Best effort: meant to be called in ``finally`` too."""
        write_json(path, self.raw())
        return Path(path)
