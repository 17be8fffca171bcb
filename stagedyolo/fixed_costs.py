"""The clock that runs while nothing trains: from the `snakemake` call to the first training step, and between stages.

Each gap is measured from stamps the jobs write: env.json's `snakemake_started_unix` (the `snakemake` call, read by
verify_env from its parent processes) and `job_started_unix` (verify_env, the run's first job), and each stage's
timing.json `clock` (its worker's process start, first and last training step). The first row is Snakemake's own
start-up (parsing, the DAG, the first job's launch). The gap before a stage holds the previous stage's checkpoint
stripping and publishing (and, in reproducible mode, yolov5's second validation of best.pt), Snakemake's hand-off and
this stage's process start and set-up (imports, dataset scan, model build); the first stage's gap holds the data
preparation and the probe too (and on the demo its stand-in pretraining).
"""

from __future__ import annotations


def fixed_costs(
    job_started_unix: float | None, stages: list[dict], snakemake_started_unix: float | None = None
) -> dict:
    """``stages``: [{name, timing}] in run order. Returns {rows: [{stage, until, after, gap_s, setup_s}], total_s,
    run_s, share, clock_from}; a gap is None where a stamp is missing (an older timing.json). Without the snakemake
    call's stamp (a cluster executor ran verify_env elsewhere) the clock starts at the first job."""
    rows, previous_end, after = [], job_started_unix, "the run's first job (verify_env)"
    called = snakemake_started_unix is not None
    if called:
        gap = _between(snakemake_started_unix, job_started_unix)
        until, after_call = "the run's first job", "the snakemake call"
        rows.append({"stage": None, "until": until, "after": after_call, "gap_s": gap, "setup_s": None})
    for stage in stages:
        clock = (stage.get("timing") or {}).get("clock") or {}
        start = clock.get("train_start")
        rows.append(
            {
                "stage": stage["name"],
                "until": f"{stage['name']}'s first training step",
                "after": after,
                "gap_s": _between(previous_end, start),
                "setup_s": _between(clock.get("process_start"), start),
            }
        )
        previous_end, after = clock.get("train_end"), f"{stage['name']}'s last training step"
    gaps = [row["gap_s"] for row in rows]
    total = round(sum(gaps), 1) if gaps and None not in gaps else None
    run = _between(snakemake_started_unix if called else job_started_unix, previous_end)
    clock_from = "the snakemake call" if called else "the first job"
    share = round(total / run, 3) if total and run else None
    return {"rows": rows, "total_s": total, "run_s": run, "share": share, "clock_from": clock_from}


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
