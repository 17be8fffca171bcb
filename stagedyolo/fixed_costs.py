"""The clock that runs while nothing trains: from the run's first job to the first training step, and between stages.

Each gap is measured from stamps the jobs write: env.json's `job_started_unix` (verify_env, the run's first job) and
each stage's timing.json `clock` (its worker's process start, first and last training step). The gap before a stage
holds the previous stage's checkpoint stripping and publishing (and, in reproducible mode, yolov5's second
validation of best.pt), Snakemake's hand-off and this stage's process start and set-up (imports, dataset scan, model
build); the first gap holds the data preparation and the probe too. Snakemake's own start-up before its first job is
not in it.
"""

from __future__ import annotations


def fixed_costs(job_started_unix: float | None, stages: list[dict]) -> dict:
    """``stages``: [{name, timing}] in run order. Returns {rows: [{stage, after, gap_s, setup_s}], total_s,
    run_s, share}; a gap is None where a stamp is missing (an older timing.json)."""
    rows, previous_end, after = [], job_started_unix, "the run's first job (verify_env)"
    for stage in stages:
        clock = (stage.get("timing") or {}).get("clock") or {}
        start = clock.get("train_start")
        rows.append(
            {
                "stage": stage["name"],
                "after": after,
                "gap_s": _between(previous_end, start),
                "setup_s": _between(clock.get("process_start"), start),
            }
        )
        previous_end, after = clock.get("train_end"), f"{stage['name']}'s last training step"
    gaps = [row["gap_s"] for row in rows]
    total = round(sum(gaps), 1) if gaps and None not in gaps else None
    run = _between(job_started_unix, previous_end)
    return {"rows": rows, "total_s": total, "run_s": run, "share": round(total / run, 3) if total and run else None}


def _between(start: float | None, end: float | None) -> float | None:
    return round(end - start, 1) if start is not None and end is not None else None


def markdown(costs: dict) -> str:
    lines = [
        "## Fixed costs: the clock while nothing trains",
        "",
        "| before the first step of | measured from | gap s | of which its own process set-up s |",
        "|---|---|---:|---:|",
    ]
    for row in costs["rows"]:
        lines.append(f"| {row['stage']} | {row['after']} | {_cell(row['gap_s'])} | {_cell(row['setup_s'])} |")
    if costs["share"] is not None:
        lines += [
            "",
            f"{costs['total_s']} s of the {costs['run_s']} s from the first job to the last training step "
            f"({100 * costs['share']:.0f} %) trained nothing: data preparation and the probe before the first "
            "stage; each stage's last checkpoint, publishing, hand-off and process set-up between stages.",
        ]
    return "\n".join(lines) + "\n"


def _cell(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"
