"""The clock that runs while nothing trains: from the `snakemake` call to the first training step, and between stages.

Each gap is measured from stamps the jobs write: env.json's `snakemake_started_unix` (the `snakemake` call, read by
verify_env from its parent processes, or from Snakemake's log file where a shell had exec'd it after other commands:
`snakemake_started`) and `job_started_unix` (verify_env, the run's first job), and each stage's
timing.json `clock` (its worker's process start, first and last training step). The first row is Snakemake's own
start-up (parsing, the DAG, the first job's launch). The gap before a stage holds the previous stage's checkpoint
stripping and publishing (and, in reproducible mode, yolov5's second validation of best.pt), Snakemake's hand-off and
this stage's process start and set-up (imports, dataset scan, model build); the first stage's gap holds the data
preparation and the probe too (and on the demo its stand-in pretraining).

A rerun of some stages only (a changed `stages.finetune.epochs` reruns finetune and highres) leaves the earlier jobs'
stamps from an earlier `snakemake` call. The time between two calls is nobody's fixed cost, so a gap whose two ends
carry different calls' stamps (env.json's, each timing.json's `clock.snakemake_call`) is not given.
"""

from __future__ import annotations

import datetime
from pathlib import Path

# Snakemake names its log file after the moment it sets it up (.snakemake/log/<local ISO time>.snakemake.log), after
# its own imports and before it reads the Snakefile: 1-3 s after its process started on the 2-core machine. A process
# that started much earlier than that was not Snakemake yet: `bash -c "pip install ... && snakemake ..."` runs the
# last command in the shell's own process (exec), whose start time is the shell's, so the install would count as
# Snakemake's start-up (a fresh clone's one-liner showed 106 s "to the first job").
EXEC_SUSPECT_S = 30.0
LOG_SUFFIX = ".snakemake.log"

# psutil reads a process's start time from its clock ticks since boot: one process reads alike to well within this.
CALL_STAMP_TOLERANCE_S = 0.5


def fixed_costs(
    job_started_unix: float | None,
    stages: list[dict],
    snakemake_started_unix: float | None = None,
    snakemake_call_unix: float | None = None,
) -> dict:
    """``stages``: [{name, timing}] in run order. Returns {rows: [{stage, until, after, gap_s, setup_s, other_call}],
    total_s, run_s, share, clock_from}; a gap is None where a stamp is missing (an older timing.json) or its ends ran
    in two snakemake calls (``other_call`` true; then total, run and share are None too). Without the snakemake
    call's stamp (a cluster executor ran verify_env elsewhere) the clock starts at the first job.
    ``snakemake_call_unix``: verify_env's call's process start, which the stages' ``clock.snakemake_call`` is compared
    with (the start itself may be the log's time instead: snakemake_started); default the start."""
    rows, previous_end, after = [], job_started_unix, "the run's first job (verify_env)"
    previous_call = snakemake_started_unix if snakemake_call_unix is None else snakemake_call_unix
    called = snakemake_started_unix is not None
    if called:
        gap = _between(snakemake_started_unix, job_started_unix)
        until, after_call = "the run's first job", "the snakemake call"
        row = {"stage": None, "until": until, "after": after_call, "gap_s": gap, "setup_s": None, "other_call": False}
        rows.append(row)
    for stage in stages:
        clock = (stage.get("timing") or {}).get("clock") or {}
        start, call = clock.get("train_start"), clock.get("snakemake_call")
        other_call = _two_calls(previous_call, call)
        rows.append(
            {
                "stage": stage["name"],
                "until": f"{stage['name']}'s first training step",
                "after": after,
                "gap_s": None if other_call else _between(previous_end, start),
                "setup_s": _between(clock.get("process_start"), start),
                "other_call": other_call,
            }
        )
        previous_end, after = clock.get("train_end"), f"{stage['name']}'s last training step"
        previous_call = call if call is not None else previous_call
    gaps = [row["gap_s"] for row in rows]
    total = round(sum(gaps), 1) if gaps and None not in gaps else None
    spans_calls = any(row["other_call"] for row in rows)
    run = None if spans_calls else _between(snakemake_started_unix if called else job_started_unix, previous_end)
    clock_from = "the snakemake call" if called else "the first job"
    share = round(total / run, 3) if total and run else None
    return {"rows": rows, "total_s": total, "run_s": run, "share": share, "clock_from": clock_from}


def _two_calls(earlier: float | None, later: float | None) -> bool:
    """Whether two snakemake-call stamps name different calls (one process's start time reads alike every time;
    unknown stamps tell nothing)."""
    return earlier is not None and later is not None and abs(later - earlier) > CALL_STAMP_TOLERANCE_S


def _between(start: float | None, end: float | None) -> float | None:
    return round(end - start, 1) if start is not None and end is not None else None


def markdown(costs: dict) -> str:
    lines = [
        "## Fixed costs: the clock while nothing trains",
        "",
        "| up to | measured from | gap s | of which its own process set-up s |",
        "|---|---|---:|---:|",
    ]
    for row in costs["rows"]:
        lines.append(f"| {row['until']} | {row['after']} | {_cell(row['gap_s'])} | {_cell(row['setup_s'])} |")
    if any(row.get("other_call") for row in costs["rows"]):
        lines += [
            "",
            "n/a: the step before it ran in an earlier snakemake call (this call reran only the later jobs); the time "
            "between two calls is no fixed cost.",
        ]
    if costs["share"] is not None:
        startup = "Snakemake's start-up, " if costs["clock_from"] == "the snakemake call" else ""
        lines += [
            "",
            f"{costs['total_s']} s of the {costs['run_s']} s from {costs['clock_from']} to the last training step "
            f"({100 * costs['share']:.0f} %) trained nothing: {startup}data preparation and the probe before the "
            "first stage; each stage's last checkpoint, publishing, hand-off and process set-up between stages.",
        ]
    return "\n".join(lines) + "\n"


def _cell(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def snakemake_call_unix() -> tuple[float | None, str | None]:
    """When the `snakemake` call that runs this job started: its outermost ancestor process whose command line
    names snakemake. (None, why) where the job runs elsewhere (a cluster executor's node) or the tree is unreadable.
    verify_env stamps env.json with it, and each stage's worker its timing.json (`clock.snakemake_call`), so the report
    can tell a gap within one call from the time between two."""
    import psutil

    try:
        ancestors = psutil.Process().parents()
        started = [p.create_time() for p in ancestors if _is_snakemake(p.cmdline())]
    except psutil.Error as exc:
        return None, f"the job's parent processes could not be read ({type(exc).__name__})"
    if not started:
        return None, "no snakemake process among the job's parents (a cluster executor runs it on another node)"
    return started[-1], None  # parents() runs from the nearest to the outermost


def _is_snakemake(cmdline: list[str]) -> bool:
    """`snakemake ...` (its console script, run by python) or `python -m snakemake ...`, but not the snakemake an
    executor starts to run one job (`--target-jobs`: a cluster node's job step, or a local job's subprocess)."""
    return any(Path(part).name == "snakemake" for part in cmdline[:3]) and "--target-jobs" not in cmdline


def snakemake_started(
    call: tuple[float | None, str | None], workdir: str | Path = "."
) -> tuple[float | None, str | None]:
    """verify_env's stamp of the snakemake call's start, and why it is not the plain process start where it is not:
    ``call`` (snakemake_call_unix's reading: the call's process start, or None and why), unless the call's log file
    in ``workdir`` was set up more than EXEC_SUSPECT_S later; then the log's time (Snakemake's own imports left out)."""
    started, reason = call
    if started is None:
        return None, reason
    logged = latest_log_time(Path(workdir) / ".snakemake" / "log")
    if logged is None or logged - started <= EXEC_SUSPECT_S:
        return started, None
    return logged, (
        f"the snakemake process started {logged - started:.0f} s before Snakemake set up its log: a shell that ran "
        "other commands first had exec'd it, so the clock starts at the log (Snakemake's own imports left out)"
    )


def latest_log_time(log_dir: Path) -> float | None:
    """The UNIX time in the newest Snakemake log file's name (local time, as Snakemake writes it), or None."""
    times = []
    for path in log_dir.glob(f"*{LOG_SUFFIX}"):
        try:
            stamp = datetime.datetime.strptime(path.name[: -len(LOG_SUFFIX)], "%Y-%m-%dT%H%M%S.%f")
        except ValueError:
            continue
        times.append(stamp.timestamp())
    return max(times, default=None)
