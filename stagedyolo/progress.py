"""A running stage's progress: one line per epoch in Snakemake's console, and what `stagedyolo status` reads.

The worker's `ProgressReport` hook writes `work/<stage>/progress.json` after every epoch (rank 0 only), appends the
record to `progress.jsonl` and prints the line into the stage's log. The worker's output goes to that log, not to the
console, so the supervisor runs a `ProgressRelay` that prints each record appended to `progress.jsonl` to its own
stderr, which Snakemake shows. It reads the appended lines rather than polling progress.json, whose record a short
epoch can replace before the next poll (on a loaded 2-core machine a tiny stage's epoch line went missing):

    [frozen] epoch 3/6  412.3 img/s  mAP50 0.812  stage ETA 0:00:12  run ETA 0:01:05

ETAs: the stage's is its remaining epochs at its mean epoch time so far (validation and checkpoints included),
capped by its time budget. The run's adds every later stage's epochs at that same time per epoch, scaled by its
pixel count ((img / this img)^2): a rough figure, since a frozen backbone or another batch trains at another speed.
Under the recipe's time budget (`recipe_minutes`) the later stages fill what is left of it, so the run's ETA is the
budget's end (run_eta_s).
"""

from __future__ import annotations

import json
import math
import os
import sys
import threading
import time
from pathlib import Path

from stagedyolo.jsonio import write_json

PROGRESS_FILE = "progress.json"  # the latest record: what `stagedyolo status` reads
PROGRESS_HISTORY = "progress.jsonl"  # every record, one per line: what the relay prints
MAP50 = 5  # index of mAP50 in yolov5's on_fit_epoch_end log_vals: 3 train losses, then P, R, mAP50, ...


class ProgressReport:
    """Hook on yolov5's Callbacks: after every epoch's validation, write progress.json and log the line."""

    def __init__(self, plan: dict, timer, schedule, stop, clock=time.time):
        self.plan, self.timer, self.schedule, self.stop, self.clock = plan, timer, schedule, stop, clock
        self.work_dir = Path(plan["work_dir"])
        self.world = int(os.environ.get("WORLD_SIZE", 1))  # the timer counts rank 0's share of each batch
        self.train_started: float | None = None
        self.first_epoch: int | None = None

    def on_train_start(self, *args):
        self.train_started = self.clock()

    def on_train_epoch_end(self, epoch):
        if self.first_epoch is None:
            self.first_epoch = epoch

    def on_fit_epoch_end(self, log_vals, epoch, best_fitness, fi):
        if self.first_epoch is None or self.train_started is None:
            return  # not an in-loop epoch (yolov5 calls it once more after training on COCO)
        current = self.timer.current_epoch() or {}
        now = self.clock()
        mean_epoch_s = (now - self.train_started) / (epoch - self.first_epoch + 1)
        remaining = 0 if self.stop.reason else max(0, self.schedule.last_epoch - epoch)
        stage_eta = remaining * mean_epoch_s
        if self.plan.get("time_budget_s"):
            stage_eta = min(stage_eta, max(0.0, self.plan["time_budget_s"] - (now - self.stop.started_at)))
        map50 = float(log_vals[MAP50]) if len(log_vals) > MAP50 else math.nan
        train_s, images = current.get("train_s") or 0.0, (current.get("images") or 0) * self.world
        record = {
            "stage": self.plan["stage"],
            "epoch": epoch + 1,
            "epochs": self.plan["epochs"],
            "images_per_s": round(images / train_s, 2) if train_s > 0 else None,
            "mean_epoch_s": round(mean_epoch_s, 3),
            "map50": round(map50, 4) if math.isfinite(map50) else None,
            "stage_eta_s": round(stage_eta, 1),
            "run_eta_s": round(run_eta_s(self.plan, stage_eta, mean_epoch_s, now - self.stop.started_at), 1),
            "stopping": self.stop.reason,
            "updated": now,
        }
        record_progress(self.work_dir, record)
        print(progress_line(record), flush=True)


def record_progress(work_dir: Path, record: dict) -> None:
    """The epoch's record as the latest (progress.json) and appended to the history the relay reads."""
    write_json(work_dir / PROGRESS_FILE, record)
    with open(work_dir / PROGRESS_HISTORY, "a") as history:
        history.write(json.dumps(record) + "\n")


def run_eta_s(plan: dict, stage_eta_s: float, mean_epoch_s: float, elapsed_s: float) -> float:
    """This stage's ETA plus the later stages'. Under the recipe's time budget (the plan's epochs_decision) each later
    stage sizes itself at its start to fill what the stages before it left (stagedyolo.recipe_budget), so the run
    ends about when the budget does, ``left_s`` from this stage's start, unless this stage runs past it. Without a
    budget the later stages train their configured epochs (later_stages_s)."""
    decision = plan.get("epochs_decision")
    if decision and _later_stages(plan):
        return max(stage_eta_s, decision["left_s"] - elapsed_s)
    return stage_eta_s + later_stages_s(plan, mean_epoch_s)


def later_stages_s(plan: dict, mean_epoch_s: float) -> float:
    """The stages after this one, at this stage's time per epoch scaled by their pixel count."""
    return sum(entry["epochs"] * mean_epoch_s * (entry["img"] / plan["img"]) ** 2 for entry in _later_stages(plan))


def _later_stages(plan: dict) -> list[dict]:
    names = [entry["stage"] for entry in plan.get("run_stages") or []]
    return plan["run_stages"][names.index(plan["stage"]) + 1 :] if plan["stage"] in names else []


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def progress_line(record: dict) -> str:
    speed = f"{record['images_per_s']:.1f} img/s" if record.get("images_per_s") else "? img/s"
    parts = [f"[{record['stage']}] epoch {record['epoch']}/{record['epochs']}", speed]
    if record.get("map50") is not None:
        parts.append(f"mAP50 {record['map50']:.3f}")
    parts += [f"stage ETA {duration(record.get('stage_eta_s'))}", f"run ETA {duration(record.get('run_eta_s'))}"]
    if record.get("stopping"):
        parts.append(f"(ending: {record['stopping']})")
    return "  ".join(parts)


class ProgressRelay:
    """Prints each record appended to progress.jsonl to `stream` while a stage runs (a thread in the supervisor)."""

    def __init__(self, work_dir: str | Path, stream=None, interval_s: float = 0.5):
        self.path = Path(work_dir) / PROGRESS_HISTORY
        self.stream = stream or sys.stderr
        self.interval_s = interval_s
        self._offset = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stagedyolo-progress", daemon=True)

    def __enter__(self):
        # a resumed stage's earlier records were shown by the run that wrote them
        self._offset = self.path.stat().st_size if self.path.exists() else 0
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._done.set()
        self._thread.join()
        self.poll()  # the last epoch, written just before the worker exited

    def _run(self):
        while not self._done.wait(self.interval_s):
            self.poll()

    def poll(self) -> None:
        """Print the records appended since the last poll; a line still being written waits for the next one."""
        if not self.path.exists():
            return
        with open(self.path, "rb") as history:
            history.seek(self._offset)
            appended = history.read()
        complete = appended[: appended.rfind(b"\n") + 1]
        self._offset += len(complete)
        for line in complete.decode().splitlines():
            print(progress_line(json.loads(line)), file=self.stream, flush=True)
