"""What every yolov5 process pays before and after its work: imports and interpreter teardown, with and without
the two process shims of stagedyolo.engine.compat, side by side in one run.

    python benchmarks/process_overhead.py [--repeats 5]

Each repeat starts two fresh processes, alternating (plain, shims, plain, ...) so a drift in the shared machine's
speed reaches both arms alike. Both apply the other process-phase shims (numpy, Pillow, atomic save, deferred
seaborn) and import what the stage worker imports (torch and yolov5's train.py) under the engine's offline
environment; they differ only in:
- `shallow_import_stack`: yolov5.utils.general's import-time inspect.stack() without source lines;
- `skip_exit_collection`: called as the process's last step.
Per process: import seconds (from the first statement to the imports' end) and teardown seconds (from the child's
last statement to its exit as the parent sees it).

Targets, fixed before the first run (two pilot processes per arm, 2.5-2.9 s teardown plain, 0.9 s with the shim,
informed the first): the shims' median teardown at most half the plain median; their median imports below the plain
median.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

from common import WORK, LoadSampler, machine_info, save

from stagedyolo.engine.offline import engine_environment

CHILD = """
import json, sys, time
started = time.perf_counter()
from stagedyolo.engine import compat
compat.numpy_trapz(); compat.pillow_getsize(); compat.atomic_torch_save(); compat.defer_plot_imports()
shims = sys.argv[1] == "shims"
if shims:
    compat.shallow_import_stack()
import torch, yolov5.train
print(json.dumps({"import_s": time.perf_counter() - started, "done_unix": time.time()}), flush=True)
if shims:
    compat.skip_exit_collection()
"""
ARMS = ("plain", "shims")


def one_process(arm: str, index: int, env: dict) -> dict:
    with LoadSampler(interval_s=1.0) as load:
        child = subprocess.run([sys.executable, "-W", "ignore", "-c", CHILD, arm], env=env, capture_output=True,
                               text=True, check=True)  # fmt: skip
        exited = time.time()
    report = json.loads(child.stdout.strip().splitlines()[-1])
    return {"arm": arm, "repeat": index, "import_s": round(report["import_s"], 3),
            "teardown_s": round(exited - report["done_unix"], 3), "load": load.summary()}  # fmt: skip


def summarise(processes: list[dict]) -> dict:
    figures = {key: {arm: [p[key] for p in processes if p["arm"] == arm] for arm in ARMS}
               for key in ("import_s", "teardown_s")}  # fmt: skip
    median = {key: {arm: statistics.median(values) for arm, values in by_arm.items()}
              for key, by_arm in figures.items()}  # fmt: skip
    return {
        **figures,
        "median": median,
        "spread": {key: {arm: [min(v), max(v)] for arm, v in by_arm.items()} for key, by_arm in figures.items()},
        "median_ratio_shims_over_plain": {key: round(m["shims"] / m["plain"], 3) for key, m in median.items()},
        "target_teardown_at_most_half": median["teardown_s"]["shims"] <= 0.5 * median["teardown_s"]["plain"],
        "target_imports_below_plain": median["import_s"]["shims"] < median["import_s"]["plain"],
    }


def markdown(result: dict) -> list[str]:
    s = result["summary"]
    lines = [
        "# Process overhead of a yolov5 process: imports and teardown, plain and with the process shims",
        "",
        f"{result['repeats']} processes per arm, alternating; each imports torch and yolov5's train.py under the "
        "engine's offline environment. Targets fixed in advance: the shims' median teardown at most half the plain "
        "median; their median imports below the plain median.",
        "",
        "| arm | imports s (each) | median | teardown s (each) | median |",
        "|---|---|---:|---|---:|",
    ]
    for arm in ARMS:
        imports = ", ".join(f"{x:.2f}" for x in s["import_s"][arm])
        teardowns = ", ".join(f"{x:.2f}" for x in s["teardown_s"][arm])
        lines.append(f"| {arm} | {imports} | {s['median']['import_s'][arm]:.2f} | {teardowns} | "
                     f"{s['median']['teardown_s'][arm]:.2f} |")  # fmt: skip
    ratio = s["median_ratio_shims_over_plain"]
    lines += [
        "",
        f"Median ratio shims / plain: imports {ratio['import_s']}, teardown {ratio['teardown_s']}. Teardown at most "
        f"half: {s['target_teardown_at_most_half']}. Imports below plain: {s['target_imports_below_plain']}.",
    ]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    env = engine_environment(WORK / "process_overhead_engine")
    processes = [one_process(arm, index, env) for index in range(args.repeats) for arm in ARMS]
    result = {"machine": machine_info(), "repeats": args.repeats, "processes": processes,
              "summary": summarise(processes)}  # fmt: skip
    save("process_overhead", result, markdown(result))


if __name__ == "__main__":
    main()
