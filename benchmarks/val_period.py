"""val_period: the same stage with validation every epoch (val_period 1) vs every 5th (val_period 5, plus the final
epoch), interleaved, through stagedyolo.stage_plan.build_plan/run_stage (as the train_stage rule runs it).

Stage: the default config's `frozen` settings (freeze 10, AdamW, img 128, batch 16, stage_defaults hyp) for 10
epochs from the demo's pretrained.pt, on a staged copy of the demo target set, 2 cores (1 worker + 1 torch thread).
Reads each stage's timing.json: per-epoch train/val/checkpoint/logging seconds and the supervisor's wall.

Run:  python benchmarks/val_period.py [--rounds 2] [--epochs 10] [--stage frozen] [--period 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    WORK,
    LoadSampler,
    find_demo_source,
    machine_info,
    run_one_stage,
    save,  # noqa: E402
    stage_dataset_copy,
)


def summarise(run: dict) -> dict:
    t = run["timing"]
    eps = [e for e in t["epochs"] if e.get("complete", True)]
    tv = [e["train_s"] + e["val_s"] for e in eps]
    loop = [e["train_s"] + e["val_s"] + e["checkpoint_s"] + e["logging_s"] for e in eps]
    return {
        "wall_s": t["wall_s"],
        "epochs": len(eps),
        "epoch_train_val_mean_s": statistics.mean(tv),
        "epoch_loop_mean_s": statistics.mean(loop),
        "val_s_total": sum(e["val_s"] for e in eps),
        "train_s_mean": statistics.mean(e["train_s"] for e in eps),
        "validated": run["stage_json"].get("validated_epochs"),
        "final_val_s": t["phases"]["val"]["s"] - sum(e["val_s"] for e in eps),
        "setup_s": t["phases"]["setup"]["s"],
        "map50_last": None,
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--stage", default="frozen")
    ap.add_argument("--period", type=int, default=5)
    ap.add_argument("--source", type=Path)
    ap.add_argument("--workdir", type=Path, default=WORK / "val_period")
    a = ap.parse_args(argv)
    source = find_demo_source(a.source)
    data = stage_dataset_copy(source / "results/demo/demo/target/data.yaml", a.workdir / "data")
    weights = str((source / "results/demo/demo/pretrained.pt").resolve())
    runs = {1: [], a.period: []}
    with LoadSampler() as load:
        for rnd in range(a.rounds):
            for period in (1, a.period) if rnd % 2 == 0 else (a.period, 1):
                r = run_one_stage(
                    a.stage,
                    {"epochs": a.epochs, "val_period": period, "start_from": "model", "cache": "none", "plots": False},
                    data=data,
                    weights=weights,
                    workdir=a.workdir,
                    name=f"vp{period}_r{rnd}",
                )
                runs[period].append(summarise(r))
                print(f"round {rnd} val_period {period}: wall {r['timing']['wall_s']:.1f} s", flush=True)
    med = {
        p: {
            k: statistics.median(x[k] for x in rs)
            for k in (
                "wall_s",
                "epoch_train_val_mean_s",
                "epoch_loop_mean_s",
                "val_s_total",
                "train_s_mean",
                "final_val_s",
                "setup_s",
            )
        }
        for p, rs in runs.items()
    }
    P = a.period
    ratio_epoch = med[P]["epoch_train_val_mean_s"] / med[1]["epoch_train_val_mean_s"]
    ratio_wall = med[P]["wall_s"] / med[1]["wall_s"]
    res = {
        "stage": a.stage,
        "epochs": a.epochs,
        "period": P,
        "runs": {str(k): v for k, v in runs.items()},
        "median": {str(k): v for k, v in med.items()},
        "ratio_epoch_train_val": ratio_epoch,
        "ratio_stage_wall": ratio_wall,
        "machine": machine_info(),
        "load": load.summary(),
    }
    L = res["load"]
    md = [
        f"# val_period {P} vs 1: `{a.stage}` settings, {a.epochs} epochs",
        "",
        f"{a.rounds} interleaved rounds (order alternates); medians. Machine: {res['machine']['cores']} cores, "
        f"{res['machine']['cpu_model']}; 1-min load {L['load1_min']:.2f}–{L['load1_max']:.2f} "
        f"(mean {L['load1_mean']:.2f}). Validated epochs (0-based): "
        f"val_period 1 → {runs[1][0]['validated']}, val_period {P} → {runs[P][0]['validated']}.",
        "",
        f"| measure | val_period 1 | val_period {P} | ratio {P}/1 |",
        "|---|---:|---:|---:|",
        *[
            f"| {label} | {med[1][k]:.2f} s | {med[P][k]:.2f} s | {med[P][k] / med[1][k]:.3f} |"
            for label, k in (
                ("mean epoch, train + val", "epoch_train_val_mean_s"),
                ("mean epoch loop (train + val + checkpoint + logging)", "epoch_loop_mean_s"),
                ("mean epoch, train only", "train_s_mean"),
                ("in-loop validation, total", "val_s_total"),
                ("final validation of best.pt (always runs)", "final_val_s"),
                ("setup (imports, dataset scan, model build)", "setup_s"),
                ("**stage wall (supervisor)**", "wall_s"),
            )
        ],
        "",
        "| run | stage wall | mean epoch train+val |",
        "|---|---:|---:|",
        *[
            f"| val_period {p} #{i} | {x['wall_s']:.1f} s | {x['epoch_train_val_mean_s']:.2f} s |"
            for p, rs in runs.items()
            for i, x in enumerate(rs)
        ],
        "",
    ]
    save("val_period", res, md)


if __name__ == "__main__":
    main()
