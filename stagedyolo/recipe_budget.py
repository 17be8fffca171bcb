"""The recipe's time budget (config `recipe_minutes`): the stages together take about that long.

Ultralytics' `time=` re-fits one training's epochs to the wall-clock after its first epoch. A recipe here is several
stages, each a process whose plan (and so its LR line and validation schedule) is fixed before yolov5 starts, so
each stage sizes itself at its start, from what the stages before it measured:

- what is left: the budget less the wall-clock the stages before it took (each one's timing.json `wall_s`, summed
  along the chain in `config.epochs_decision.spent_s`);
- its share: every stage still to run (this one and the later ones) trains its configured epochs times one factor,
  the factor that makes their predicted seconds fill what is left. One factor keeps the recipe's shape and its LR
  line, whose per-stage hyp.lrf are fitted to the stages' fractions of the epochs, which one factor leaves as they
  are;
- an epoch's predicted seconds at stage j: the training seconds the latest measured stage at the same freeze took
  per epoch (else any measured stage), scaled to stage j by the probe's predicted images/s of both stages where it
  measured them, else by the pixel ratio; plus a checkpoint per saved epoch and a validation per validated epoch,
  and each stage's own set-up, all as measured;
- the first stage has nothing measured before it: its epoch comes from the probe (its predicted images/s, else the
  probe's first model run), its validation at the same rate, no set-up; without a probe it trains its configured
  epochs.

Each stage corrects what the estimates before it missed, so the error left is the last stage's own estimate. The
pixel ratio overstates what a smaller size saves where fixed per-image costs dominate (a 128-px epoch of the demo
took 0.95x a 160-px one on a 2-core CPU), so there the last stage, at the target size, is predicted dearer than it
is and the recipe ends under budget rather than over it; and no stage may run past what is left (budgeted_settings),
so one slower than predicted ends at an epoch boundary. A stage's epochs follow the measurements, so a rerun may
train another number of them; a resumed stage plans from the same inputs and so keeps its epochs.
"""

from __future__ import annotations

from statistics import median

from stagedyolo.recipe import stage_img


def measured_costs(timing: dict) -> dict:
    """A finished stage's figures from its timing.json: the seconds of a steady epoch's training (the median of its
    epochs after the first, which carries the process's one-off costs), of a checkpoint and of a validation, and its
    fixed seconds: its wall-clock less a steady epoch's costs for each epoch (set-up, the first epoch's extra,
    the ending)."""
    epochs = [e for e in timing["epochs"] if e.get("complete")] or timing["epochs"]
    parts = ("train_s", "val_s", "checkpoint_s", "logging_s", "other_s")
    validated = [e["val_s"] for e in epochs if e.get("validated")]
    saved = [e["checkpoint_s"] for e in epochs if e.get("saved")]
    steady = median(e["train_s"] for e in epochs[1:] or epochs)
    in_epochs = sum(e.get(p) or 0.0 for e in timing["epochs"] for p in parts) - (epochs[0]["train_s"] - steady)
    return {
        "stage": timing["stage"],
        "img": timing["config"]["img"],
        "freeze": timing["config"].get("freeze") or 0,
        "train_epoch_s": round(steady, 4),
        "val_s": round(median(validated), 4) if validated else None,
        "checkpoint_s": round(median(saved), 4) if saved else 0.0,
        "fixed_s": round(max(0.0, timing["wall_s"] - in_epochs), 4),
    }


def size_stage(
    budget: dict,
    *,
    previous: dict | None,
    predictions: dict,
    first_rate: float | None,
    images: tuple[int, int],
    boxes_need: int | None,
) -> dict:
    """This stage's epochs under the budget and what decided them (timing.json `config.epochs_decision`).

    ``previous``: the previous stage's timing.json (None for the first stage); ``predictions``: the probe's
    predicted images/s by stage (None where it did not measure); ``first_rate``: the images/s of the probe's first
    model run; ``images``: (training, validation) images."""
    stages = [{**shape, "trained_img": stage_img(shape, boxes_need)[0]} for shape in budget["stages"]]
    spent, measured = 0.0, []
    if previous:
        before = previous["config"].get("epochs_decision") or {}
        spent = float(before.get("spent_s") or 0.0) + float(previous["wall_s"])
        measured = [*(before.get("measured") or []), measured_costs(previous)]
    record = {
        "configured": stages[0]["epochs"],
        "budget_s": round(budget["budget_s"], 1),
        "spent_s": round(spent, 2),
        "left_s": round(budget["budget_s"] - spent, 2),
        "measured": measured,
    }
    references = measured or _probe_reference(stages[0], predictions, first_rate, images)
    if not references:
        return {**record, "epochs": stages[0]["epochs"], "factor": None, "basis": "nothing measured or predicted"}
    costs = [_epoch_costs(shape, references, predictions, images) for shape in stages]
    fixed = sum(cost["fixed_s"] for cost in costs)
    per_factor = sum(shape["epochs"] * cost["epoch_s"] for shape, cost in zip(stages, costs))
    factor = max(0.0, record["left_s"] - fixed) / per_factor
    epochs = max(1, round(stages[0]["epochs"] * factor))
    predicted = costs[0]["fixed_s"] + epochs * costs[0]["epoch_s"]
    return {
        **record,
        "epochs": epochs,
        "factor": round(factor, 4),
        "basis": costs[0]["basis"],
        "predicted_s": round(predicted, 2),
    }


def budgeted_settings(spec: dict, decision: dict) -> dict:
    """The stage settings a budget decides: its epochs, the record of why, and its time_budget_min capped at what
    is left of the recipe's budget, so that a stage slower than predicted ends at an epoch boundary (validated and
    saved, engine.stopping) instead of running past the budget. At least one epoch always runs."""
    left_min = max(decision["left_s"], 0.0) / 60 or 1e-3
    own = spec.get("time_budget_min")
    return {
        "epochs": decision["epochs"],
        "epochs_decision": decision,
        "time_budget_min": min(own, left_min) if own else left_min,
    }


def _probe_reference(first: dict, predictions: dict, first_rate: float | None, images: tuple[int, int]) -> list[dict]:
    """The first stage's stand-in for a measured stage: its epoch at the probe's predicted images/s (else its first
    model run's), its validation at the same rate, no set-up or checkpoint. Empty without a probe figure."""
    rate = predictions.get(first["stage"]) or first_rate
    if not rate:
        return []
    source = "prediction" if predictions.get(first["stage"]) else "first model run"
    train, val = images[0] / rate, images[1] / rate
    return [
        {
            "stage": first["stage"],
            "img": first["trained_img"],
            "freeze": first["freeze"] or 0,
            "train_epoch_s": train,
            "val_s": val,
            "checkpoint_s": 0.0,
            "fixed_s": 0.0,
            "source": f"the probe's {source}",
        }
    ]


def _epoch_costs(shape: dict, references: list[dict], predictions: dict, images: tuple[int, int]) -> dict:
    """Stage ``shape``'s predicted seconds per epoch (its training and checkpoint, and its share of a validation
    every val_period) and its set-up, from the latest reference at the same freeze (else the latest)."""
    same_freeze = [r for r in references if r["freeze"] == (shape["freeze"] or 0)]
    ref = (same_freeze or references)[-1]
    ref_rate, rate = predictions.get(ref["stage"]), predictions.get(shape["stage"])
    if ref_rate and rate:
        scale, how = ref_rate / rate, "the probe's predicted images/s"
    else:
        scale, how = (shape["trained_img"] / ref["img"]) ** 2, "the pixel ratio"
    val = next((r["val_s"] for r in reversed(references) if r["val_s"] is not None), None)
    if val is None:  # no stage validated yet: at the training rate
        val = ref["train_epoch_s"] * images[1] / images[0]
    checkpoint = 0.0 if shape["nosave"] else ref["checkpoint_s"]
    return {
        "epoch_s": ref["train_epoch_s"] * scale + checkpoint + val / max(1, int(shape["val_period"])),
        "fixed_s": ref["fixed_s"],
        "basis": f"{ref.get('source') or ref['stage'] + ' measured'}, scaled by {how}",
    }


def budget_use(stages: list[dict]) -> dict | None:
    """How the stages used the recipe's time budget, for the run report (``stages``: [{name, timing}] in run order):
    per stage its configured and trained epochs, its factor, what was left at its start, its prediction and what it
    took. None when no stage was sized by a budget."""
    rows = [_budget_row(stage["name"], stage.get("timing") or {}) for stage in stages]
    rows = [row for row in rows if row]
    if not rows:
        return None
    budget_s, took_s = rows[0]["budget_s"], round(sum(row["took_s"] for row in rows), 1)
    return {
        "budget_s": budget_s,
        "took_s": took_s,
        "off_pct": round(100 * (took_s / budget_s - 1), 1) if budget_s > 0 else None,
        "every_stage": len(rows) == len(stages),  # a stage with no timing.json is not counted
        "stages": rows,
    }


def _budget_row(name: str, timing: dict) -> dict | None:
    decision = (timing.get("config") or {}).get("epochs_decision")
    if not decision:
        return None
    return {
        "stage": name,
        "budget_s": decision["budget_s"],
        "configured": decision["configured"],
        "epochs": decision["epochs"],
        "trained": timing.get("epochs_completed"),
        "factor": decision.get("factor"),
        "left_s": decision["left_s"],
        "predicted_s": decision.get("predicted_s"),
        "took_s": round(float(timing["wall_s"]), 1),
        "ended_by": timing.get("stopped_by"),
        "basis": decision["basis"],
    }


def budget_markdown(use: dict | None) -> str:
    """The run report's section on the time budget; empty without one."""
    if not use:
        return ""
    off = "" if use["off_pct"] is None else f" ({use['off_pct']:+.1f} %)"
    lines = [
        "## Time budget (recipe_minutes)",
        "",
        f"The stages took {use['took_s']:.1f} s of the {use['budget_s']:.1f} s budget{off}. Each one trained its "
        "configured epochs times a factor fitted at its start to what the stages before it left (docs/recipe.md); "
        "a stage slower than predicted ends at an epoch boundary once the budget is spent (ended by time_budget).",
        "",
        "| stage | epochs configured | sized to | trained | factor | left at its start s | predicted s | took s "
        "| ended by | predicted from |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for row in use["stages"]:
        cells = [row[k] for k in ("stage", "configured", "epochs", "trained", "factor", "left_s", "predicted_s")]
        cells += [row["took_s"], row["ended_by"] or "its epochs", row["basis"]]
        lines.append("| " + " | ".join("n/a" if cell is None else str(cell) for cell in cells) + " |")
    if not use["every_stage"]:
        lines += ["", "A stage without a timing.json is left out of the sum."]
    return "\n".join(lines) + "\n"
