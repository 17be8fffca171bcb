"""What a stage process pays to import its engine: this tree against a baseline commit, side by side in one run.

    python benchmarks/engine_imports.py --baseline <commit> [--repeats 5]

Each repeat starts two fresh processes, alternating (baseline, this tree, baseline, ...) so a drift in the shared
machine's speed reaches both arms alike. Each does what the stage worker does before training, under the engine's
offline environment: imports torch, then `stagedyolo.engine.worker.load_engine` on the same demo stage plan (the
process rows, then yolov5's Callbacks, then the patched train module), then yolov5's val.py, which the stage's
validation runs. The baseline runs from a `git worktree` of the commit, its package first on PYTHONPATH. Per
process: the seconds from its first statement to the end of those imports, and which of the modules the tree defers
(stagedyolo.engine.compat.DEFERRED_IMPORTS) are still unexecuted then.

Targets, fixed before the first run (a pilot of 3 processes per arm, importing train.py and val.py after
compat.install(), measured 7.1-8.5 s at 011af91 and 5.6-6.9 s with matplotlib.pyplot, requests and boto3 deferred):
the tree's median import seconds at most 0.92 of the baseline's; in every tree process seaborn, matplotlib.pyplot and
boto3 unexecuted (requests is executed in a stage all the same: train.py imports roboflow, which imports it).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

from common import WORK, LoadSampler, baseline_tree, commit_of, machine_info, save

from stagedyolo.engine.offline import engine_environment
from stagedyolo.jsonio import write_json
from stagedyolo.stage_plan import build_plan

CHILD = """
import json, sys, time
started = time.perf_counter()
import torch
from stagedyolo.engine.worker import load_engine
load_engine(json.load(open(sys.argv[1])), torch)
import yolov5.val
import_s = time.perf_counter() - started
deferred = ("seaborn", "matplotlib.pyplot", "requests", "boto3")
unexecuted = [name for name in deferred if type(sys.modules.get(name)).__name__ in ("DeferredModule", "_LazyModule")]
print(json.dumps({"import_s": import_s, "unexecuted": unexecuted}), flush=True)
"""
STAGE = {
    "epochs": 1,
    "img": 128,
    "batch": 16,
    "workers": 0,
    "freeze": 0,
    "lr0": 0.002,
    "optimizer": "AdamW",
    "hyp": {},
    "cache": "none",
    "amp": "auto",
    "device": "cpu",
    "val_period": 1,
    "gpus": 1,
    "sync_bn": False,
    "plots": False,
    "nosave": True,
    "lr_scaling": "none",
    "nominal_batch": 16,
    "min_warmup_iters": 100,
}
ARMS = ("baseline", "tree")
MUST_STAY_DEFERRED = ("seaborn", "matplotlib.pyplot", "boto3")


def one_process(arm: str, index: int, work, env: dict) -> dict:
    with LoadSampler(interval_s=1.0) as load:
        child = subprocess.run(
            [sys.executable, "-W", "ignore", str(work / "child.py"), str(work / "plan.json")],
            env=env,
            capture_output=True,
            text=True,
            check=True,
            cwd=work,
        )
    report = json.loads(child.stdout.strip().splitlines()[-1])
    return {
        "arm": arm,
        "repeat": index,
        "import_s": round(report["import_s"], 3),
        "unexecuted": report["unexecuted"],
        "load": load.summary(),
    }


def summarise(processes: list[dict]) -> dict:
    seconds = {arm: [p["import_s"] for p in processes if p["arm"] == arm] for arm in ARMS}
    median = {arm: statistics.median(values) for arm, values in seconds.items()}
    ratio = round(median["tree"] / median["baseline"], 3)
    tree = [p for p in processes if p["arm"] == "tree"]
    return {
        "import_s": seconds,
        "median": median,
        "spread": {arm: [min(v), max(v)] for arm, v in seconds.items()},
        "median_ratio_tree_over_baseline": ratio,
        "target_ratio_at_most_0_92": ratio <= 0.92,
        "target_deferred_in_every_tree_process": all(set(MUST_STAY_DEFERRED) <= set(p["unexecuted"]) for p in tree),
    }


def markdown(result: dict) -> list[str]:
    s = result["summary"]
    lines = [
        "# A stage process's engine imports: this tree against a baseline",
        "",
        f"Baseline {result['baseline']}, tree {result['tree']}; {result['repeats']} processes per arm, alternating; "
        "each imports torch, runs the stage worker's load_engine on the same plan and imports yolov5's val.py. "
        "Targets fixed in advance: the tree's median at most 0.92 of the baseline's; seaborn, matplotlib.pyplot and "
        "boto3 unexecuted in every tree process.",
        "",
        "| arm | import s (each) | median | unexecuted after the imports |",
        "|---|---|---:|---|",
    ]
    for arm in ARMS:
        runs = [p for p in result["processes"] if p["arm"] == arm]
        unexecuted = sorted({", ".join(p["unexecuted"]) or "none" for p in runs})
        lines.append(
            f"| {arm} | "
            + ", ".join(f"{x:.2f}" for x in s["import_s"][arm])
            + f" | {s['median'][arm]:.2f} | {' / '.join(unexecuted)} |"
        )
    lines += [
        "",
        f"Median ratio tree / baseline: {s['median_ratio_tree_over_baseline']}. At most 0.92: "
        f"{s['target_ratio_at_most_0_92']}. Deferred in every tree process: "
        f"{s['target_deferred_in_every_tree_process']}.",
    ]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", required=True, help="the commit to compare with")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    baseline, tree = commit_of(args.baseline), commit_of("HEAD")
    work = WORK / "engine_imports"
    work.mkdir(parents=True, exist_ok=True)
    (work / "child.py").write_text(CHILD)
    plan = build_plan(
        STAGE,
        stage="smoke",
        data=work / "data.yaml",
        weights=None,
        cfg="yolov5n.yaml",
        cache_mode="none",
        threads=2,
        work_dir=work / "stage",
    )
    write_json(work / "plan.json", plan)
    env = engine_environment(work / "engine")
    old_tree, old_path = baseline_tree(baseline)
    arm_env = {"baseline": {**env, **old_path}, "tree": env}
    processes = [one_process(arm, index, work, arm_env[arm]) for index in range(args.repeats) for arm in ARMS]
    result = {
        "machine": machine_info(),
        "baseline": baseline,
        "tree": tree,
        "repeats": args.repeats,
        "processes": processes,
        "summary": summarise(processes),
    }
    save("engine_imports", result, markdown(result))


if __name__ == "__main__":
    main()
