"""`stagedyolo status [results/<run>]`: what a run is doing, read from its folders alone (no Snakemake needed).

- `stages/<stage>/timing.json` and `stage.json`: a published (finished) stage.
- `work/<stage>/`: a stage that started and was not published yet: `progress.json` (the last epoch's line, see
  stagedyolo.progress), `outcome.json` (the worker ended), `attempts.json` (failed attempts).
- The order of the stages comes from `run_stages` in the newest plan; an older run without it is listed by time.

A started stage is `running` only while something runs it: a worker process on this machine (`python -m
stagedyolo.engine.worker <work>/plan.json`, torchrun's ranks included), or a folder written to within HEARTBEAT_S
(the stage's sampler appends to telemetry.csv every telemetry.interval_s, at most 60 s: a stage on another machine
of a shared folder, or one between its start and its worker's). Otherwise it is `stopped`: a killed Snakemake
leaves no outcome.json behind, and its last progress line would read as running forever.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import psutil

from stagedyolo.jsonio import read_json
from stagedyolo.progress import PROGRESS_FILE, progress_line

WORKER_MODULE = "stagedyolo.engine.worker"
HEARTBEAT_S = 180  # three of the longest telemetry interval the config allows
HEARTBEAT_FILES = ("telemetry.csv", PROGRESS_FILE, "plan.json", "attempts.json")


def latest_run(results_dir: Path) -> Path | None:
    runs = [path for path in results_dir.glob("*") if (path / "stages").is_dir() or (path / "work").is_dir()]
    return max(runs, key=lambda path: path.stat().st_mtime, default=None)


def stage_order(run: Path) -> list[str]:
    records = [*run.glob("work/*/plan.json"), *run.glob("stages/*/stage.json")]
    for path in sorted(records, key=lambda p: p.stat().st_mtime, reverse=True):
        stages = (read_json(path) or {}).get("run_stages")
        if stages:
            return [entry["stage"] for entry in stages]
    folders = [*run.glob("stages/*"), *run.glob("work/*")]
    return list(dict.fromkeys(p.name for p in sorted(folders, key=lambda p: p.stat().st_mtime)))


def stage_status(run: Path, stage: str, now: float) -> str:
    work, published = run / "work" / stage, run / "stages" / stage
    if (work / "plan.json").exists():
        return _unpublished(work, now)
    timing = read_json(published / "timing.json")
    if timing:
        record = read_json(published / "stage.json") or {}
        ended = f", ended by {record['stopped_by']}" if record.get("stopped_by") else ""
        epochs = f"{timing['epochs_completed']}/{record.get('epochs', '?')}"
        return f"done      {epochs} epochs in {timing['wall_s']:.0f} s{ended}"
    return "waiting"


def _unpublished(work: Path, now: float) -> str:
    outcome = read_json(work / "outcome.json")
    attempts = (read_json(work / "attempts.json") or {}).get("attempts") or []
    if outcome and outcome.get("status") != "ok":
        return f"failed    {outcome['status']}: {outcome.get('message') or ''}".rstrip()
    if outcome:
        return "finishing (training ended, publishing)"
    retry = f" (attempt {len(attempts) + 1}, last: {attempts[-1]['status']})" if attempts else ""
    progress = read_json(work / PROGRESS_FILE)
    if not stage_alive(work, now):
        last = f"; last: {progress_line(progress)}" if progress else ""
        return (
            f"stopped   no process runs it (nothing written for {now - last_written(work):.0f} s){last}; "
            "run snakemake again to resume it"
        )
    if not progress:
        return f"starting{retry}"
    age = now - float(progress.get("updated", now))
    return f"running   {progress_line(progress)}  (updated {age:.0f} s ago){retry}"


def stage_alive(work: Path, now: float) -> bool:
    return now - last_written(work) < HEARTBEAT_S or bool(worker_processes(work))


def last_written(work: Path) -> float:
    """When the stage last wrote to its work folder (its sampler, every telemetry.interval_s, while it runs)."""
    times = [path.stat().st_mtime for path in (work / name for name in HEARTBEAT_FILES) if path.exists()]
    return max(times, default=0.0)


def worker_processes(work: Path) -> list[int]:
    """PIDs of this machine's processes running the stage's worker on work/plan.json (a relative plan path is the
    process's own working directory's)."""
    plan = os.path.realpath(work / "plan.json")
    pids = []
    for process in psutil.process_iter(["cmdline", "cwd"]):
        cmdline = process.info["cmdline"] or []
        if WORKER_MODULE not in cmdline:
            continue
        arguments = cmdline[cmdline.index(WORKER_MODULE) + 1 :]
        cwd = process.info["cwd"] or ""  # unreadable (another user's process): only an absolute path matches
        if any(os.path.realpath(os.path.join(cwd, arg)) == plan for arg in arguments if cwd or os.path.isabs(arg)):
            pids.append(process.pid)
    return pids


def run_status(run: Path, now: float | None = None) -> str:
    now = time.time() if now is None else now
    stages = stage_order(run)
    width = max((len(stage) for stage in stages), default=0)
    lines = [f"run {run}"] + [f"  {stage:<{width}}  {stage_status(run, stage, now)}" for stage in stages]
    if not stages:
        lines.append("  no stage has started yet")
    return "\n".join(lines)
