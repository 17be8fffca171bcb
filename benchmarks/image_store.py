"""Stage set-up with the RAM cache served from the run's image store vs rebuilt by yolov5 in the stage.

Same stage, interleaved (order alternates each round), through stagedyolo.stage_plan.build_plan/run_stage as the
train_stage rule runs it: the demo target set (256 train + 64 val images of 160 px), staged; img 128, batch 16,
1 epoch from yolov5n.yaml, cache ram, 1 loader worker + 1 torch thread (2 cores).

- prebuilt: the image store built once by cache_dataset (its one-off cost is reported), served to the stage.
- engine:   no store; yolov5 decodes and resizes every image in the stage, as every stage did before.

Read from each stage's timing.json: setup_detail.cache_s (the loaders' dataset set-up: label scan + image cache,
train and val), cache_images_decoded, build_s (on_pretrain_routine_start -> on_train_start) and the set-up phase.

One stage runs first, not counted: it scans the labels and writes yolov5's labels.cache, which every later stage
loads.

Targets, fixed before the first run:
1. prebuilt decodes 0 images in the stage, in every run;
2. median cache_s, prebuilt <= 0.5 x engine.

Run:  python benchmarks/image_store.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import WORK, LoadSampler, machine_info, save, stage_dataset_copy  # noqa: E402

SPEC = {
    "epochs": 1,
    "img": 128,
    "batch": 16,
    "workers": 1,
    "freeze": 0,
    "lr0": 0.002,
    "optimizer": "AdamW",
    "hyp": {"mosaic": 0.0},
    "cache": "ram",
    "amp": "auto",
    "device": "cpu",
    "val_period": 1,
    "gpus": 1,
    "sync_bn": False,
    "plots": False,
    "nosave": True,
    "lr_scaling": "none",
}
METRICS = ("cache_s", "build_s", "setup_s")


def run(kind: str, data: Path, store: str | None, workdir: Path, name: str) -> dict:
    from stagedyolo.stage import run_stage
    from stagedyolo.stage_plan import build_plan

    stage_dir = workdir / "stages" / name
    shutil.rmtree(stage_dir, ignore_errors=True)
    plan = build_plan(
        SPEC,
        stage=name,
        data=str(data),
        weights=None,
        cfg="yolov5n.yaml",
        cache_mode="ram",
        threads=2,
        work_dir=workdir / "work" / name,
        image_store=store,
    )
    run_stage(plan, stage_dir=stage_dir, attempt=1, log_path=workdir / f"{name}.log", engine_home=workdir / "engine")
    t = json.loads((stage_dir / "timing.json").read_text())
    sd = t["setup_detail"]
    return {
        "kind": kind,
        "cache_source": sd["cache_source"],
        "decoded": sd["cache_images_decoded"],
        "cache_s": sd["cache_s"],
        "build_s": sd["build_s"],
        "setup_s": t["phases"]["setup"]["s"],
        "wall_s": t["wall_s"],
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workdir", type=Path, default=WORK / "image_store")
    a = ap.parse_args(argv)
    from stagedyolo.dataset.cache import cache_dataset
    from stagedyolo.demo import TARGET_CLASSES, DemoSpec, write_demo_dataset

    src = write_demo_dataset(a.workdir / "src", DemoSpec(TARGET_CLASSES, 256, 64))
    data = stage_dataset_copy(src, a.workdir / "data")
    t0 = time.monotonic()
    decision = cache_dataset(
        str(data),
        str(a.workdir / "cache.json"),
        "ram",
        0.3,
        160,
        log=lambda *_: None,
        store_sizes={"train": [128, 160], "val": [160]},  # the default demo's stage and validation sizes
    )
    build = {"seconds": round(time.monotonic() - t0, 3), **{k: decision["store"][k] for k in ("decoded", "bytes")}}
    store = decision["store"]["root"]
    runs = {"prebuilt": [], "engine": []}
    # Not counted: the first stage on a fresh working copy also scans the labels and writes yolov5's labels.cache.
    run("warm-up", data, None, a.workdir, "warmup")
    with LoadSampler() as load:
        for rnd in range(a.rounds):
            for kind in ("prebuilt", "engine") if rnd % 2 == 0 else ("engine", "prebuilt"):
                r = run(kind, data, store if kind == "prebuilt" else None, a.workdir, f"{kind}_r{rnd}")
                runs[kind].append(r)
                print(f"round {rnd} {kind}: {r}", flush=True)
    med = {k: {m: statistics.median(x[m] for x in rs) for m in METRICS} for k, rs in runs.items()}
    spread = {k: {m: [min(x[m] for x in rs), max(x[m] for x in rs)] for m in METRICS} for k, rs in runs.items()}
    ratio = med["prebuilt"]["cache_s"] / med["engine"]["cache_s"]
    targets = {
        "prebuilt decodes 0 images, every run": all(x["decoded"] == 0 for x in runs["prebuilt"]),
        "median cache_s prebuilt <= 0.5 x engine": ratio <= 0.5,
    }
    res = {
        "runs": runs,
        "median": med,
        "spread": spread,
        "ratio_cache_s": ratio,
        "store_build": build,
        "targets": targets,
        "machine": machine_info(),
        "load": load.summary(),
    }
    L = res["load"]
    md = [
        "# Image store: stage set-up with the RAM cache prebuilt once vs rebuilt in the stage",
        "",
        f"{a.rounds} interleaved rounds (order alternates); medians [min–max]. Demo target set (256 + 64 images, "
        f"160 px), img 128, 1 epoch, cache ram, 1 worker + 1 torch thread. Machine: {res['machine']['cores']} cores, "
        f"{res['machine']['cpu_model']}, shared with other jobs: 1-min load {L['load1_min']:.2f}–{L['load1_max']:.2f}"
        f" (mean {L['load1_mean']:.2f}).",
        "",
        f"One-off store build (cache_dataset, sizes 128 and 160, {build['decoded']} images decoded once): "
        f"{build['seconds']:.2f} s, {build['bytes'] / 2**20:.1f} MiB.",
        "",
        "| measure | prebuilt | engine (yolov5 decodes) | ratio |",
        "|---|---:|---:|---:|",
        *[
            f"| {label} | {med['prebuilt'][m]:.3f} s [{spread['prebuilt'][m][0]:.3f}–{spread['prebuilt'][m][1]:.3f}] "
            f"| {med['engine'][m]:.3f} s [{spread['engine'][m][0]:.3f}–{spread['engine'][m][1]:.3f}] "
            f"| {med['prebuilt'][m] / med['engine'][m]:.3f} |"
            for label, m in (
                ("loaders' dataset set-up (cache_s)", "cache_s"),
                ("build_s (dataset + model)", "build_s"),
                ("set-up phase (process start -> first batch)", "setup_s"),
            )
        ],
        "",
        f"Images decoded in the stage: prebuilt {[x['decoded'] for x in runs['prebuilt']]}, "
        f"engine {[x['decoded'] for x in runs['engine']]}.",
        "",
        "Targets (fixed before running): " + "; ".join(f"{k}: {'met' if v else 'NOT met'}" for k, v in targets.items()),
        "",
    ]
    save("image_store", res, md)


if __name__ == "__main__":
    main()
