"""`stagedyolo status [results/<run>]`: what a run is doing, read from its folders alone (no Snakemake needed).

- `stages/<stage>/timing.json` and `stage.json`: a published (finished) stage.
- `work/<stage>/`: a stage that started and was not published yet: `progress.json` (the last epoch's line, see
  stagedyolo.progress), `outcome.json` (the worker ended), `attempts.json` (failed attempts).
- The order of the stages comes from `run_stages` in the newest plan; an older run without it is listed by time.
"""

from __future__ import annotations

import time
from pathlib import Path

from stagedyolo.jsonio import read_json
from stagedyolo.progress import PROGRESS_FILE, progress_line


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
        return f"done      {timing['epochs_completed']}/{record.get('epochs', '?')} epochs in {timing['wall_s']:.0f} s{ended}"
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
    if not progress:
        return f"starting{retry}"
    age = now - float(progress.get("updated", now))
    return f"running   {progress_line(progress)}  (updated {age:.0f} s ago){retry}"


def run_status(run: Path, now: float | None = None) -> str:
    now = time.time() if now is None else now
    stages = stage_order(run)
    width = max((len(stage) for stage in stages), default=0)
    lines = [f"run {run}"] + [f"  {stage:<{width}}  {stage_status(run, stage, now)}" for stage in stages]
    if not stages:
        lines.append("  no stage has started yet")
    return "\n".join(lines)
