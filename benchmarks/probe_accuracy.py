"""How well the probe predicts each stage, and what it costs: the CPU demo, several repeats, several probe budgets.

    python benchmarks/probe_accuracy.py [--repeats 3] [--budgets 30 15]

Each repeat runs the demo pipeline up to the last stage's timing.json with the probe measuring afresh
(`probe.reuse: false`, `--forcerun probe`, so every stage reruns after it) at the first of `--budgets` (its
`probe.budget_s`); the first repeat also builds the demo data and weights. Then the probe alone runs again at each
other budget (15 s: the probe's target and the default), and its predictions are compared with the same stages'
measurements, if it made the same choice (otherwise the stages would have run with other settings). Per stage:
each probe's prediction, the stage's measured steady images/s (epochs after the first) and their ratio; per probe
run its rule seconds (imports included), its import seconds, its runs cut by the budget, and the load average.

Targets, fixed before the first run (the probe's acceptance): every stage with a steady epoch within +-25 % of its
prediction; the probe rule at most 15 s. Both are reported for both budgets, whether met or not.
"""

from __future__ import annotations

import argparse
import statistics

import yaml
from common import ROOT, WORK, LoadSampler, machine_info, make_snakemake_workdir, run_snakemake, save

from stagedyolo.jsonio import read_json

STAGES = ("smoke", "frozen", "finetune", "highres")
TARGETS = {"ratio_within": 0.25, "probe_s_max": 15.0}


def one_repeat(workdir, index: int, budgets: list[float]) -> dict:
    """The pipeline with the probe at budgets[0], then the probe alone at each other budget; each probe's
    predictions against the same stage measurements. Keyed by arm_name(budget)."""
    run = workdir / "results" / "demo"
    rerun = ("--forcerun", "probe") if index else ()  # the first repeat runs everything anyway
    with LoadSampler() as load:  # the workdir's config.yaml holds budgets[0]
        run_snakemake(
            workdir, *rerun, log=workdir / f"repeat{index}.log", targets=("results/demo/stages/highres/timing.json",)
        )
    pipeline = read_json(run / "probe" / "tuning.json")
    measured = {stage: read_json(run / "stages" / stage / "timing.json")["prediction"] for stage in STAGES}
    arms = {arm_name(budgets[0]): arm(pipeline, measured, load.summary())}
    for budget in budgets[1:]:
        overlay = workdir / f"budget{budget:g}.yaml"
        overlay.write_text(yaml.safe_dump({"probe": {"budget_s": budget}}))
        with LoadSampler() as probe_load:
            run_snakemake(
                workdir,
                "--forcerun",
                "probe",
                "--configfile",
                str(workdir / "config" / "config.yaml"),
                str(overlay),
                log=workdir / f"repeat{index}_budget{budget:g}.log",
                targets=("results/demo/probe/tuning.json",),
            )
        alone = read_json(run / "probe" / "tuning.json")
        same_choice = alone["choice"] == pipeline["choice"]
        arms[arm_name(budget)] = arm(alone, measured, probe_load.summary(), comparable=same_choice)
    return {"repeat": index, **arms}


def arm_name(budget: float) -> str:
    return f"budget_{budget:g}s"


def arm(tuning: dict, measured: dict, load: dict, comparable: bool = True) -> dict:
    """One probe run: its cost, and each stage's measured steady rate over its prediction."""
    runs = [r for kind in ("loader", "model", "stages") for r in tuning["measurements"][kind]]
    stages = {}
    for stage in STAGES:
        predicted = tuning["stages"][stage]["predicted_images_per_s"]
        steady = measured[stage]["measured_steady_images_per_s"] if measured[stage]["ratio"] is not None else None
        ratio = round(steady / predicted, 3) if comparable and steady and predicted else None
        stages[stage] = {
            "predicted_images_per_s": predicted,
            "predicted_from_steps": tuning["stages"][stage]["steps"],
            "measured_steady_images_per_s": steady,
            "ratio": ratio,
        }
    return {
        "budget_s": tuning["budget_s"]["budget_s"],
        "probe_rule_s": tuning["budget_s"]["rule_s"],
        "probe_import_s": tuning["budget_s"]["import_s"],
        "choice": tuning["choice"],
        "comparable": comparable,
        "runs_cut_by_budget": sum(bool(r.get("cut_by_budget")) for r in runs),
        "runs": len(runs),
        "stages": stages,
        "load": load,
    }


def summarise(repeats: list[dict], budgets: list[float]) -> dict:
    return {arm_name(b): summarise_arm([r[arm_name(b)] for r in repeats]) for b in budgets}


def summarise_arm(arms: list[dict]) -> dict:
    per_stage = {}
    for stage in STAGES:
        ratios = [a["stages"][stage]["ratio"] for a in arms if a["stages"][stage]["ratio"] is not None]
        per_stage[stage] = {
            "ratios": ratios,
            "median": round(statistics.median(ratios), 3) if ratios else None,
            "spread": [min(ratios), max(ratios)] if ratios else None,
            "all_within": all(abs(x - 1) <= TARGETS["ratio_within"] for x in ratios) if ratios else None,
        }
    probe_s = [a["probe_rule_s"] for a in arms]
    return {
        "budget_s": sorted({a["budget_s"] for a in arms}),
        "stages": per_stage,
        "probe_rule_s": {
            "values": probe_s,
            "median": round(statistics.median(probe_s), 2),
            "all_within": all(s <= TARGETS["probe_s_max"] for s in probe_s),
        },
        "import_s": [a["probe_import_s"] for a in arms],
        "runs_cut_by_budget": [f"{a['runs_cut_by_budget']}/{a['runs']}" for a in arms],
        "comparable_repeats": sum(a["comparable"] for a in arms),
    }


def markdown(result: dict) -> list[str]:
    lines = [
        "# Probe accuracy on the CPU demo",
        "",
        f"{len(result['repeats'])} repeats, each: the pipeline with the probe at the first budget below, then the "
        f"probe alone at the others, all compared with the same stages' measurements. Targets fixed in "
        f"advance: each stage within ±{TARGETS['ratio_within']:.0%} of its prediction, probe ≤ "
        f"{TARGETS['probe_s_max']:.0f} s.",
    ]
    for summary in result["summary"].values():
        p = summary["probe_rule_s"]
        lines += [
            "",
            f"## probe.budget_s = {', '.join(f'{b:g}' for b in summary['budget_s'])} s",
            "",
            "| stage | ratios (measured / predicted) | median | within ±25 % |",
            "|---|---|---:|---|",
        ]
        for stage, st in summary["stages"].items():
            lines.append(
                f"| {stage} | {', '.join(f'{x:.2f}' for x in st['ratios']) or 'no steady epoch'} | "
                f"{st['median'] if st['median'] is not None else '—'} | {st['all_within']} |"
            )
        lines += [
            "",
            f"Probe rule: {', '.join(f'{x:.1f}' for x in p['values'])} s (median {p['median']} s); "
            f"≤ {TARGETS['probe_s_max']:.0f} s: {p['all_within']}. Imports: "
            f"{', '.join(f'{x:.1f}' for x in summary['import_s'])} s. Runs cut by the budget: "
            f"{', '.join(summary['runs_cut_by_budget'])}. Same choice as the pipeline's probe (comparable): "
            f"{summary['comparable_repeats']} of {len(result['repeats'])}.",
        ]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--budgets", type=float, nargs="+", default=[30.0, 15.0])
    args = parser.parse_args()
    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    config["probe"]["reuse"] = False
    config["probe"]["stop_when_unpaid"] = False  # the predictions are what is compared: measure them
    config["probe"]["budget_s"] = args.budgets[0]
    workdir = make_snakemake_workdir(WORK / "probe_accuracy", yaml.safe_dump(config, sort_keys=False))
    repeats = [one_repeat(workdir, index, args.budgets) for index in range(args.repeats)]
    result = {
        "machine": machine_info(),
        "targets": TARGETS,
        "budgets": args.budgets,
        "repeats": repeats,
        "summary": summarise(repeats, args.budgets),
    }
    save("probe_accuracy", result, markdown(result))


if __name__ == "__main__":
    main()
