"""What every yolov5 process pays before and after its work: imports and interpreter teardown, with and without
the two process shims of stagedyolo.engine.compat, side by side in one run.

    python benchmarks/process_overhead.py [--repeats 5]

Each repeat starts two fresh processes, alternating (plain, shims, plain, ...) so a drift in the shared machine's
speed reaches both arms alike. Both apply the other process-phase shims (numpy, Pillow, atomic save, deferred
seaborn) and import what the stage worker imports (torch and yolov5's train.py) under the engine's offline
environment; they differ only in:
- `sourceless_inspect`: yolov5.utils.general's inspect reads no source lines (its import-time stack() and
  print_args, which train.main calls first);
- `skip_exit_collection`: called as the process's last step.
Per process: import seconds (from the first statement to the imports' end), the seconds of one print_args call
(train.main's first log line) and teardown seconds (from the child's last statement to its exit as the parent sees
it).

Targets, fixed before the first run (two pilot processes per arm, 2.5-2.9 s teardown plain, 0.9 s with the shim,
informed the first): the shims' median teardown at most half the plain median; their median imports below the plain
median. Added with print_args, fixed before its first run (python -X importtime showed a stage's print_args
executing seaborn, 1.2 s): the shims' median print_args at most a tenth of the plain median.
print_args is called from a module imported after yolov5, as train.main's is in a stage.
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
compat.numpy_trapz(); compat.pillow_getsize(); compat.atomic_torch_save(); compat.defer_imports()
shims = sys.argv[1] == "shims"
if shims:
    compat.sourceless_inspect()
import torch, yolov5.train
import_s = time.perf_counter() - started
import process_overhead_caller  # imported late, as train.main's module is in a stage
process_overhead_caller.first_log_line(yolov5.train.print_args)
print_args_s = time.perf_counter() - started - import_s
print(json.dumps({"import_s": import_s, "print_args_s": print_args_s, "done_unix": time.time()}), flush=True)
if shims:
    compat.skip_exit_collection()
"""
# print_args's caller, in a module imported after yolov5 as train.main's is: inspect has not yet mapped its file to a
# module, so reading the caller's source searches sys.modules (the script's own __main__ is mapped by then).
CALLER = "def first_log_line(print_args):\n    print_args({'epochs': 1})\n"
ARMS = ("plain", "shims")
CHILD_FILE = WORK / "process_overhead_child.py"


def one_process(arm: str, index: int, env: dict) -> dict:
    with LoadSampler(interval_s=1.0) as load:
        child = subprocess.run(
            [sys.executable, "-W", "ignore", str(CHILD_FILE), arm], env=env, capture_output=True, text=True, check=True
        )
        exited = time.time()
    report = json.loads(child.stdout.strip().splitlines()[-1])
    return {
        "arm": arm,
        "repeat": index,
        "import_s": round(report["import_s"], 3),
        "print_args_s": round(report["print_args_s"], 3),
        "teardown_s": round(exited - report["done_unix"], 3),
        "load": load.summary(),
    }


def summarise(processes: list[dict]) -> dict:
    figures = {
        key: {arm: [p[key] for p in processes if p["arm"] == arm] for arm in ARMS}
        for key in ("import_s", "print_args_s", "teardown_s")
    }
    median = {
        key: {arm: statistics.median(values) for arm, values in by_arm.items()} for key, by_arm in figures.items()
    }
    return {
        **figures,
        "median": median,
        "spread": {key: {arm: [min(v), max(v)] for arm, v in by_arm.items()} for key, by_arm in figures.items()},
        "median_ratio_shims_over_plain": {key: round(m["shims"] / m["plain"], 3) for key, m in median.items()},
        "target_teardown_at_most_half": median["teardown_s"]["shims"] <= 0.5 * median["teardown_s"]["plain"],
        "target_imports_below_plain": median["import_s"]["shims"] < median["import_s"]["plain"],
        "target_print_args_at_most_a_tenth": median["print_args_s"]["shims"] <= 0.1 * median["print_args_s"]["plain"],
    }


def markdown(result: dict) -> list[str]:
    s = result["summary"]
    lines = [
        "# Process overhead of a yolov5 process: imports, print_args and teardown, plain and with the process shims",
        "",
        f"{result['repeats']} processes per arm, alternating; each imports torch and yolov5's train.py under the "
        "engine's offline environment and calls print_args once, as train.main does. Targets fixed in advance: the "
        "shims' median teardown at most half the plain median; their median imports below the plain median; their "
        "median print_args at most a tenth of the plain median.",
        "",
        "| arm | imports s (each) | median | print_args s (each) | median | teardown s (each) | median |",
        "|---|---|---:|---|---:|---|---:|",
    ]
    for arm in ARMS:
        cells = []
        for key in ("import_s", "print_args_s", "teardown_s"):
            cells += [", ".join(f"{x:.2f}" for x in s[key][arm]), f"{s['median'][key][arm]:.2f}"]
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    ratio = s["median_ratio_shims_over_plain"]
    lines += [
        "",
        f"Median ratio shims / plain: imports {ratio['import_s']}, print_args {ratio['print_args_s']}, teardown "
        f"{ratio['teardown_s']}. Teardown at most half: {s['target_teardown_at_most_half']}. Imports below plain: "
        f"{s['target_imports_below_plain']}. print_args at most a tenth: {s['target_print_args_at_most_a_tenth']}.",
    ]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    CHILD_FILE.parent.mkdir(parents=True, exist_ok=True)
    CHILD_FILE.write_text(CHILD)
    (CHILD_FILE.parent / "process_overhead_caller.py").write_text(CALLER)
    env = engine_environment(WORK / "process_overhead_engine")
    processes = [one_process(arm, index, env) for index in range(args.repeats) for arm in ARMS]
    result = {
        "machine": machine_info(),
        "repeats": args.repeats,
        "processes": processes,
        "summary": summarise(processes),
    }
    save("process_overhead", result, markdown(result))


if __name__ == "__main__":
    main()
