"""Is the probe's choice faster than the defaults it replaces? The same short stage, side by side.

Workload: the built-in demo (256 train / 64 val images, generated in a temp dir), yolov5n from its yaml, one stage of
`--epochs` epochs at `--img` px, planned by `stagedyolo.stage_plan.build_plan` and run by `run_stage` (the real worker
process, as the pipeline runs it). First the probe runs (config/config.yaml's probe settings) at that image size;
then two plans of the same stage alternate, in rotating order (A B, B A, ...), so load from other processes on a
shared machine drifts over both. The stage is config/config.yaml's stage_defaults as they are: what the probe may
decide is only what the config leaves at `auto` (the demo config fixes batch 16, so both arms train at batch 16 and
the probe decides workers, torch threads and amp), i.e. what the probe changes in a real run of that config:
- probe: the config's `auto` keys filled in from tuning.json's choice;
- defaults: the same stage without a probe: cpu_budget's fallback workers = min(2, threads - 1), amp from device.
Figure of merit: steady-state training images/s from each stage's timing.json (epochs after the first).

Run:  python benchmarks/probe_choice.py [--rounds 3] [--epochs 2] [--img 128]
Writes benchmarks/results/probe_choice.json and .md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from stagedyolo.demo import write_demo  # noqa: E402
from stagedyolo.probe import probe_for_rule  # noqa: E402
from stagedyolo.recipe import probe_batches, stage_spec  # noqa: E402
from stagedyolo.stage import run_stage  # noqa: E402
from stagedyolo.stage_plan import available_cores, build_plan  # noqa: E402

OUT = ROOT / "benchmarks" / "results"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="pairs of runs (probe, defaults)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--img", type=int, default=128)
    parser.add_argument("--device", default="auto")
    args = parser.parse_args()
    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    threads = available_cores()

    with tempfile.TemporaryDirectory(prefix="probe_choice_") as tmp:
        tmp = Path(tmp)
        data = str(write_demo(tmp / "demo")["target"])
        cache_decision = tmp / "cache.json"
        cache_decision.write_text(json.dumps({"mode": "ram"}))  # the demo fits in RAM, as cache_dataset decides
        batches = probe_batches(config)  # the batch sizes the config's stages can take, as the probe rule times them
        started = time.time()
        tuning = probe_for_rule(
            data,
            cache_decision=str(cache_decision),
            weights=[],
            tuning_out=str(tmp / "run" / "probe" / "tuning.json"),
            settings=config["probe"],
            stage_defaults=config["stage_defaults"],
            cfg=config["model"]["cfg"],
            device=args.device,
            img=args.img,
            threads=threads,
            log_path=str(tmp / "probe.log"),
            batches=batches,
        )
        probe_s = time.time() - started
        print(f"probe: choice {tuning['choice']} in {probe_s:.1f} s", flush=True)

        # workers/batch/amp stay as the config sets them: the probe's choice applies only where they are auto
        spec = {
            **stage_spec({**config, "stage_order": ["bench"], "stages": {"bench": {}}}, "bench"),
            "epochs": args.epochs,
            "img": args.img,
            "device": args.device,
            "val_period": args.epochs,
            "plots": False,
            # config.yaml leaves optimizer to the schema's default, which only Snakemake's validation fills in
            "optimizer": config["stage_defaults"].get("optimizer") or "SGD",
        }
        arms = {"probe": tuning["choice"] or None, "defaults": None}
        runs = []
        for round_index in range(args.rounds):
            order = ["probe", "defaults"] if round_index % 2 == 0 else ["defaults", "probe"]
            for arm in order:
                runs.append(run_arm(arm, arms[arm], spec, data, threads, tmp / f"{arm}{round_index}", config))
                print(
                    f"round {round_index} {arm}: {runs[-1]['steady_images_per_s']} images/s "
                    f"(workers {runs[-1]['workers']}, batch {runs[-1]['batch']})",
                    flush=True,
                )

    result = summarise(runs, tuning, probe_s, args, threads, config)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "probe_choice.json").write_text(json.dumps(result, indent=2))
    (OUT / "probe_choice.md").write_text(markdown(result))
    print(markdown(result))


def run_arm(arm: str, choice: dict | None, spec: dict, data: str, threads: int, folder: Path, config: dict) -> dict:
    plan = build_plan(
        spec,
        stage=arm,
        data=data,
        weights=None,
        cfg=config["model"]["cfg"],
        cache_mode="ram",
        threads=threads,
        work_dir=folder / "work",
        probe_choice=choice,
    )
    load_before = os.getloadavg()[0]
    run_stage(
        plan,
        stage_dir=folder / "stage",
        attempt=1,
        log_path=folder / "stage.log",
        engine_home=folder.parent / "engine",
        telemetry_interval=config["telemetry"]["interval_s"],
    )
    timing = json.loads((folder / "stage" / "timing.json").read_text())
    return {
        "arm": arm,
        "workers": plan["workers"],
        "torch_threads": plan["torch_threads"],
        "batch": plan["batch"],
        "amp": timing["config"]["amp"],
        "steady_images_per_s": timing["throughput"]["steady_images_per_s"],
        "epoch_images_per_s": [e["images_per_s"] for e in timing["epochs"]],
        "data_wait_share": timing["data_wait"]["steady_share"],
        "wall_s": timing["wall_s"],
        "load_average_before": load_before,
    }


def summarise(runs: list[dict], tuning: dict, probe_s: float, args, threads: int, config: dict) -> dict:
    def rates(arm):
        return [r["steady_images_per_s"] for r in runs if r["arm"] == arm and r["steady_images_per_s"]]

    probe, defaults = rates("probe"), rates("defaults")
    pairs = [p / d for p, d in zip(probe, defaults) if d]  # runs of one round sit next to each other in time
    return {
        "workload": {
            "demo_train_images": 256,
            "epochs": args.epochs,
            "img": args.img,
            "model": "yolov5n.yaml",
            "device": args.device,
            "threads": threads,
            "rounds": args.rounds,
            "config_batch": config["stage_defaults"]["batch"],
            "config_workers": config["stage_defaults"]["workers"],
        },
        "probe": {
            "choice": tuning["choice"],
            "seconds": round(probe_s, 1),
            "budget_s": tuning["budget_s"],
            "candidates": tuning["candidates"],
        },
        "runs": runs,
        "median_images_per_s": {"probe": _median(probe), "defaults": _median(defaults)},
        "ratio_of_medians": round(_median(probe) / _median(defaults), 4) if probe and defaults else None,
        "paired_ratios": [round(x, 4) for x in pairs],
        "same_settings": len({(r["workers"], r["batch"]) for r in runs}) == 1,  # then the ratio is pure noise
        "load_average_end": os.getloadavg()[0],
    }


def markdown(result: dict) -> str:
    w, choice = result["workload"], result["probe"]["choice"]
    settings = {r["arm"]: r for r in result["runs"]}
    lines = [
        "# Probe choice vs defaults",
        "",
        f"Workload: demo ({w['demo_train_images']} train images), {w['model']}, {w['epochs']} epochs at "
        f"{w['img']} px, device {w['device']}, {w['threads']} cores, {w['rounds']} rounds in rotating order; "
        f"config/config.yaml's own batch ({w['config_batch']}) and workers ({w['config_workers']}): the probe's "
        "choice applies only to what the config leaves at auto.",
        f"Probe: choice {choice} in {result['probe']['seconds']} s.",
        "",
        "| arm | workers | torch threads | batch | median steady images/s |",
        "|---|---:|---:|---:|---:|",
    ]
    for arm in ("probe", "defaults"):
        run = settings[arm]
        lines.append(
            f"| {arm} | {run['workers']} | {run['torch_threads']} | {run['batch']} | "
            f"{result['median_images_per_s'][arm]} |"
        )
    lines += [
        "",
        f"Ratio probe/defaults (medians): **{result['ratio_of_medians']}**; per round: {result['paired_ratios']}.",
        "",
        "| run | arm | steady images/s | per-epoch images/s | data-wait share | wall s | load before |",
        "|---:|---|---:|---|---:|---:|---:|",
    ]
    for index, run in enumerate(result["runs"]):
        lines.append(
            f"| {index} | {run['arm']} | {run['steady_images_per_s']} | {run['epoch_images_per_s']} | "
            f"{run['data_wait_share']} | {run['wall_s']:.1f} | {run['load_average_before']:.2f} |"
        )
    lines += [
        "",
        f"1-min load average at the end: {result['load_average_end']:.2f} (other processes share "
        "the cores: compare runs of the same round).",
        "",
    ]
    return "\n".join(lines)


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 3) if values else None


if __name__ == "__main__":
    main()
