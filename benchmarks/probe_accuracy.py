"""How well the probe predicts each stage, and what it costs: the CPU demo, several repeats.

    python benchmarks/probe_accuracy.py [--repeats 3]

Each repeat runs the demo pipeline up to the last stage's timing.json with the probe measuring afresh
(`probe.reuse: false`, `--forcerun probe`, so every stage reruns after it); the first repeat also builds the demo
data and weights. Per stage it records the probe's prediction, the stage's measured steady images/s (epochs after
the first) and their ratio; per repeat the probe rule's seconds (imports included) and the load average.

Targets, fixed before the first run (issue 12's acceptance): every stage with a steady epoch within +-25 % of its
prediction; the probe rule at most 15 s. Both are reported whether met or not.
"""

from __future__ import annotations

import argparse
import statistics

import yaml
from common import ROOT, WORK, LoadSampler, machine_info, make_snakemake_workdir, run_snakemake, save

from stagedyolo.jsonio import read_json

STAGES = ("smoke", "frozen", "finetune", "highres")
TARGETS = {"ratio_within": 0.25, "probe_s_max": 15.0}


def one_repeat(workdir, index: int) -> dict:
    run = workdir / "results" / "demo"
    rerun = ("--forcerun", "probe") if index else ()  # the first repeat runs everything anyway
    with LoadSampler() as load:
        run_snakemake(workdir, *rerun, log=workdir / f"repeat{index}.log",
                      targets=("results/demo/stages/highres/timing.json",))
    tuning = read_json(run / "probe" / "tuning.json")
    stages = {}
    for stage in STAGES:
        prediction = read_json(run / "stages" / stage / "timing.json")["prediction"]
        stages[stage] = {k: prediction[k] for k in ("predicted_images_per_s", "measured_steady_images_per_s", "ratio")}
    return {"repeat": index, "probe_rule_s": tuning["budget_s"]["rule_s"], "probe_import_s": tuning["budget_s"]["import_s"],
            "choice": tuning["choice"], "stages": stages, "load": load.summary()}  # fmt: skip


def summarise(repeats: list[dict]) -> dict:
    per_stage = {}
    for stage in STAGES:
        ratios = [r["stages"][stage]["ratio"] for r in repeats if r["stages"][stage]["ratio"] is not None]
        per_stage[stage] = {
            "ratios": ratios,
            "median": round(statistics.median(ratios), 3) if ratios else None,
            "spread": [min(ratios), max(ratios)] if ratios else None,
            "all_within": all(abs(x - 1) <= TARGETS["ratio_within"] for x in ratios) if ratios else None,
        }
    probe_s = [r["probe_rule_s"] for r in repeats]
    return {
        "stages": per_stage,
        "probe_rule_s": {"values": probe_s, "median": round(statistics.median(probe_s), 2),
                         "all_within": all(s <= TARGETS["probe_s_max"] for s in probe_s)},  # fmt: skip
    }


def markdown(result: dict) -> list[str]:
    lines = ["# Probe accuracy on the CPU demo", "",
             f"{len(result['repeats'])} repeats; targets fixed in advance: each stage within "
             f"±{TARGETS['ratio_within']:.0%} of its prediction, probe ≤ {TARGETS['probe_s_max']:.0f} s.", "",
             "| stage | ratios (measured / predicted) | median | within ±25 % |", "|---|---|---:|---|"]  # fmt: skip
    for stage, s in result["summary"]["stages"].items():
        lines.append(f"| {stage} | {', '.join(f'{x:.2f}' for x in s['ratios']) or 'no steady epoch'} | "
                     f"{s['median'] if s['median'] is not None else '—'} | {s['all_within']} |")  # fmt: skip
    p = result["summary"]["probe_rule_s"]
    lines += ["", f"Probe rule: {', '.join(f'{x:.1f}' for x in p['values'])} s (median {p['median']} s); "
                  f"≤ {TARGETS['probe_s_max']:.0f} s: {p['all_within']}."]  # fmt: skip
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    config["probe"]["reuse"] = False
    workdir = make_snakemake_workdir(WORK / "probe_accuracy", yaml.safe_dump(config, sort_keys=False))
    repeats = [one_repeat(workdir, index) for index in range(args.repeats)]
    result = {"machine": machine_info(), "targets": TARGETS, "repeats": repeats, "summary": summarise(repeats)}
    save("probe_accuracy", result, markdown(result))


if __name__ == "__main__":
    main()
