"""The GPU check: the 640-px load through the pipeline, and bare yolov5 at the same settings, in one command.

    python benchmarks/gpu_check.py                         # on a GPU machine: writes benchmarks/results/gpu_check.json
    python benchmarks/gpu_check.py --summarise RUN_DIR     # only summarise a finished run folder (no training)

It makes the untuned 640x480 detection set (benchmarks/make_det640.py, 3000/300 JPEGs unless told), runs bare
`python -m yolov5.train` with yolov5's defaults at the config's image size and batch, then the pipeline with
benchmarks/configs/gpu640.yaml, sampling the GPUs (NVML) over each whole run. The JSON holds, per the issue's goals:
whole-run GPU busy share, each stage's predicted and measured steady images/s, the probe's seconds, each stage's
set-up seconds and the AMP decision, each goal with its verdict. Without a GPU it trains nothing (the load would
take hours on a CPU) and writes `"gpu": null` with the reason: no figure is invented.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from common import PYTHON, RESULTS, ROOT, SNAKEMAKE, WORK, machine_info, make_snakemake_workdir, yolov5_env

from stagedyolo.jsonio import read_json
from stagedyolo.telemetry import Sampler
from stagedyolo.telemetry.summary import gpu_ids, read_telemetry

CONFIG = ROOT / "benchmarks" / "configs" / "gpu640.yaml"
# The goals on this load, fixed before any run.
GOALS = {
    "gpu_busy_share_min": 0.60,
    "probe_s_max": 10.0,
    "stage_setup_s_max": 3.0,
    "amp": True,
    "prediction_tolerance": 0.25,
}


def gpu_busy_share(telemetry_csv: Path) -> tuple[float | None, str | None]:
    """Mean SM-busy share of the GPUs over every sample of a run, or (None, why)."""
    columns, rows = read_telemetry(telemetry_csv)
    ids = gpu_ids(columns)
    if not ids:
        status = rows[0].get("gpu_status") if rows else "no samples"
        return None, f"no GPU sampled ({status})"
    values = [float(r[f"gpu{i}_util_pct"]) for r in rows for i in ids if r.get(f"gpu{i}_util_pct") not in ("", None)]
    if not values:
        return None, "NVML reported no utilisation"
    return round(sum(values) / len(values) / 100, 4), None


def summarise_run(run_dir: Path) -> dict:
    """The figures of a finished pipeline run folder (stages in the order they ran)."""
    tuning = read_json(run_dir / "probe" / "tuning.json") or {}
    stages = []
    for timing_path in sorted((run_dir / "stages").glob("*/timing.json"), key=lambda p: p.stat().st_mtime):
        timing = read_json(timing_path)
        prediction = timing.get("prediction") or {}
        stages.append(
            {
                "stage": timing["stage"],
                "predicted_images_per_s": prediction.get("predicted_images_per_s"),
                "measured_steady_images_per_s": timing["throughput"]["steady_images_per_s"],
                "ratio": prediction.get("ratio"),
                "setup_s": timing["phases"]["setup"]["s"],
                "amp": timing["config"].get("amp"),
                "amp_reason": timing["config"].get("amp_reason"),
                "gpu_util_mean_pct": (timing["gpu"].get("util_pct") or {}).get("mean"),
                "data_wait_share": timing["data_wait"].get("steady_share"),
            }
        )
    budget = tuning.get("budget_s") or {}
    return {
        "probe_s": budget.get("rule_s"),
        "probe_reused": "reused" in tuning,
        "amp_verdict": tuning.get("amp_verdict"),
        "choice": tuning.get("choice"),
        "stages": stages,
    }


def goals(summary: dict, busy: float | None) -> dict:
    stages = summary["stages"]
    ratios = [s["ratio"] for s in stages]
    return {
        "gpu_busy_share": {
            "goal": f">= {GOALS['gpu_busy_share_min']}",
            "value": busy,
            "met": None if busy is None else busy >= GOALS["gpu_busy_share_min"],
        },
        "probe_s": {
            "goal": f"<= {GOALS['probe_s_max']}",
            "value": summary["probe_s"],
            "met": None if summary["probe_s"] is None else summary["probe_s"] <= GOALS["probe_s_max"],
        },
        "stage_setup_s": {
            "goal": f"<= {GOALS['stage_setup_s_max']} each",
            "value": [s["setup_s"] for s in stages],
            "met": bool(stages) and all(s["setup_s"] <= GOALS["stage_setup_s_max"] for s in stages),
        },
        "amp_on": {
            "goal": "on",
            "value": [s["amp"] for s in stages],
            "met": bool(stages) and all(s["amp"] is True for s in stages),
        },
        "predictions": {
            "goal": f"within +-{GOALS['prediction_tolerance']:.0%}",
            "value": ratios,
            "met": None
            if not ratios or None in ratios
            else all(abs(r - 1) <= GOALS["prediction_tolerance"] for r in ratios),
        },
    }


def sampled(argv: list[str], *, cwd: Path, log: Path, csv: Path, env: dict | None = None) -> dict:
    """Run a command while the sampler records its whole process tree and the GPUs; wall seconds and rc."""
    started = time.time()
    with open(log, "w") as handle:
        process = subprocess.Popen(argv, cwd=cwd, stdout=handle, stderr=subprocess.STDOUT, env=env)
        with Sampler(csv, interval_s=1.0, root_pid=process.pid):
            rc = process.wait()
    return {"rc": rc, "wall_s": round(time.time() - started, 2), "log": str(log)}


def run_check(args) -> dict:
    import yaml

    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    data_root = Path(args.data_dir)
    if not (data_root / "data.yaml").exists():
        subprocess.run(
            [PYTHON, str(ROOT / "benchmarks" / "make_det640.py"), str(data_root), str(args.ntrain), str(args.nval)],
            check=True,
        )
    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    for key, value in yaml.safe_load(CONFIG.read_text()).items():  # the check's overrides, one level deep
        config[key] = {**config[key], **value} if isinstance(value, dict) and key != "stages" else value
    config.update(dataset=str(data_root / "data.yaml"), results_dir=str(work / "results"))
    make_snakemake_workdir(work / "pipeline", yaml.safe_dump(config, sort_keys=False))
    defaults = config["stage_defaults"]
    bare = None
    if not args.skip_bare:
        epochs = sum(int(s.get("epochs", 1)) for s in config["stages"].values())
        bare_argv = [
            PYTHON,
            "-m",
            "yolov5.train",
            "--data",
            str(data_root / "data.yaml"),
            "--cfg",
            config["model"]["cfg"],
            "--weights",
            "",
            "--img",
            str(defaults["img"]),
            "--batch",
            str(defaults["batch"]),
            "--epochs",
            str(epochs),
            "--project",
            str(work / "bare"),
            "--exist-ok",
        ]
        bare = sampled(
            bare_argv,
            cwd=work,
            log=work / "bare.log",
            csv=work / "bare_telemetry.csv",
            env=yolov5_env(work, args.cores),
        )
        bare["gpu_busy_share"], bare["gpu_reason"] = gpu_busy_share(work / "bare_telemetry.csv")
    pipeline = sampled(
        [
            SNAKEMAKE,
            "-s",
            str(ROOT / "Snakefile"),
            "-d",
            str(work / "pipeline"),
            "--cores",
            str(args.cores),
            "--resources",
            "gpu=1",
        ],
        cwd=ROOT,
        log=work / "pipeline.log",
        csv=work / "pipeline_telemetry.csv",
    )
    busy, reason = gpu_busy_share(work / "pipeline_telemetry.csv")
    summary = summarise_run(work / "results" / config["run"])
    return {
        "pipeline": {**pipeline, "gpu_busy_share": busy, "gpu_reason": reason, **summary},
        "bare_yolov5": bare,
        "goals": goals(summary, busy),
    }


def cuda_device() -> tuple[str | None, str | None]:
    import torch

    if not torch.cuda.is_available():
        return None, "no GPU: torch.cuda.is_available() is False; nothing was trained or measured"
    return torch.cuda.get_device_name(0), None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--summarise", type=Path, help="only summarise this finished run folder")
    parser.add_argument("--data-dir", default="/tmp/det640")
    parser.add_argument("--ntrain", type=int, default=3000)
    parser.add_argument("--nval", type=int, default=300)
    parser.add_argument("--cores", type=int, default=16)
    parser.add_argument("--workdir", default=str(WORK / "gpu_check"))
    parser.add_argument("--skip-bare", action="store_true")
    parser.add_argument("--out", type=Path, default=RESULTS / "gpu_check.json")
    args = parser.parse_args()
    if args.summarise:
        summary = summarise_run(args.summarise)
        print(json.dumps({**summary, "goals": goals(summary, None)}, indent=2))
        return 0
    gpu, reason = cuda_device()
    result = {
        "machine": machine_info(),
        "gpu": gpu,
        "gpu_reason": reason,
        "goals_fixed": GOALS,
        "written_unix": round(time.time(), 3),
    }
    if gpu is not None:
        result.update(run_check(args))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0 if gpu is not None else 3


if __name__ == "__main__":
    sys.exit(main())
