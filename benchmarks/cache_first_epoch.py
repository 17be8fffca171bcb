"""Pre-built disk cache vs no cache on a decode-heavy dataset: the same stage, first-epoch time and images/s.

Dataset: the demo target images upscaled with PIL (bicubic) to 1280x960, JPEG quality 95 (labels are normalised, so
unchanged): --train train images, --val val images, staged with prepare_dataset (as the pipeline does). Two staged
copies: `none` trains uncached; `disk` gets stagedyolo.dataset.prebuild_disk_cache first (its time is reported
separately: it is paid once, in the cache_dataset rule). Stage: the default config's smoke settings at img 160,
--epochs epochs, cache none vs cache disk, from the demo's pretrained.pt, 2 cores (1 worker + 1 torch thread),
interleaved rounds. Reads timing.json per epoch: train seconds and images/s.

Run:  python benchmarks/cache_first_epoch.py [--rounds 2] [--epochs 2] [--train 128] [--val 16]
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


def make_big_dataset(src_yaml: Path, dest: Path, n_train: int, n_val: int, size=(1280, 960), quality=95) -> Path:
    import shutil

    import yaml
    from PIL import Image

    spec = yaml.safe_load(src_yaml.read_text())
    root = Path(spec.get("path") or src_yaml.parent)
    if dest.exists():
        shutil.rmtree(dest)
    for split, n in (("train", n_train), ("val", n_val)):
        (dest / "images" / split).mkdir(parents=True)
        (dest / "labels" / split).mkdir(parents=True)
        images = sorted((root / spec[split]).glob("*.jpg"))
        for i in range(n):
            im = images[i % len(images)]
            stem = f"{im.stem}_{i:04d}"
            Image.open(im).convert("RGB").resize(size, Image.BICUBIC).save(
                dest / "images" / split / f"{stem}.jpg", quality=quality
            )
            label = root / "labels" / split / f"{im.stem}.txt"
            shutil.copy(label, dest / "labels" / split / f"{stem}.txt")
    spec = {"path": str(dest), "train": "images/train", "val": "images/val", "nc": spec["nc"], "names": spec["names"]}
    (dest / "data.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return dest / "data.yaml"


def summarise(run: dict) -> dict:
    eps = run["timing"]["epochs"]
    return {
        "wall_s": run["timing"]["wall_s"],
        "first_epoch_train_s": eps[0]["train_s"],
        "first_epoch_images_per_s": eps[0]["images_per_s"],
        "later_epoch_train_s": statistics.mean(e["train_s"] for e in eps[1:]) if len(eps) > 1 else None,
        "mean_images_per_s": sum(e["images"] for e in eps) / sum(e["train_s"] for e in eps),
        "first_epoch_data_wait_s": eps[0]["data_wait_s"],
        "setup_s": run["timing"]["phases"]["setup"]["s"],
        "val_s_total": sum(e["val_s"] for e in eps),
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--train", type=int, default=128)
    ap.add_argument("--val", type=int, default=16)
    ap.add_argument("--img", type=int, default=160)
    ap.add_argument("--source", type=Path)
    ap.add_argument("--workdir", type=Path, default=WORK / "cache_first_epoch")
    a = ap.parse_args(argv)
    from stagedyolo.dataset.cache import prebuild_disk_cache

    source = find_demo_source(a.source)
    weights = str((source / "results/demo/demo/pretrained.pt").resolve())
    big = make_big_dataset(source / "results/demo/demo/target/data.yaml", a.workdir / "big", a.train, a.val)
    data = {
        "none": stage_dataset_copy(big, a.workdir / "staged_none"),
        "disk": stage_dataset_copy(big, a.workdir / "staged_disk"),
    }
    runs = {"none": [], "disk": []}
    with LoadSampler() as load:
        prebuild = prebuild_disk_cache(str(data["disk"]), workers=2)
        print(f"prebuild_disk_cache: {prebuild['seconds']} s, {prebuild['written']} files", flush=True)
        for rnd in range(a.rounds):
            for mode in ("none", "disk") if rnd % 2 == 0 else ("disk", "none"):
                r = run_one_stage(
                    "smoke",
                    {
                        "epochs": a.epochs,
                        "img": a.img,
                        "cache": mode,
                        "start_from": "model",
                        "val_period": 1,
                        "plots": False,
                    },
                    data=data[mode],
                    weights=weights,
                    workdir=a.workdir,
                    name=f"{mode}_r{rnd}",
                )
                assert (r["stage_json"]["cache"] or "none") == mode, r["stage_json"]["cache"]
                runs[mode].append(summarise(r))
                print(
                    f"round {rnd} cache {mode}: wall {r['timing']['wall_s']:.1f} s, first epoch "
                    f"{runs[mode][-1]['first_epoch_train_s']:.1f} s",
                    flush=True,
                )
    keys = (
        "first_epoch_train_s",
        "first_epoch_images_per_s",
        "later_epoch_train_s",
        "mean_images_per_s",
        "first_epoch_data_wait_s",
        "setup_s",
        "val_s_total",
        "wall_s",
    )
    med = {m: {k: statistics.median(x[k] for x in rs if x[k] is not None) for k in keys} for m, rs in runs.items()}
    res = {
        "dataset": {"train": a.train, "val": a.val, "size": "1280x960", "jpeg_quality": 95},
        "img": a.img,
        "epochs": a.epochs,
        "prebuild": prebuild,
        "runs": runs,
        "median": med,
        "ratio_first_epoch_time_disk_over_none": med["disk"]["first_epoch_train_s"]
        / med["none"]["first_epoch_train_s"],
        "ratio_images_per_s_disk_over_none": med["disk"]["mean_images_per_s"] / med["none"]["mean_images_per_s"],
        "machine": machine_info(),
        "load": load.summary(),
    }
    L = res["load"]
    md = [
        f"# Pre-built disk cache vs no cache: {a.train} train + {a.val} val JPEGs of 1280x960 (q95), img {a.img}, "
        f"{a.epochs} epochs",
        "",
        f"{a.rounds} interleaved rounds, medians. prebuild_disk_cache (once, before training; the cache_dataset rule): "
        f"{prebuild['seconds']:.1f} s for {prebuild['written']} images ({prebuild['bytes'] / 1e6:.0f} MB of .npy). "
        f"Machine: {res['machine']['cores']} cores, {res['machine']['cpu_model']}; 1-min load "
        f"{L['load1_min']:.2f}–{L['load1_max']:.2f} (mean {L['load1_mean']:.2f}).",
        "",
        "| measure | cache none | cache disk (pre-built) | ratio disk/none |",
        "|---|---:|---:|---:|",
        *[
            f"| {label} | {med['none'][k]:.2f} | {med['disk'][k]:.2f} | {med['disk'][k] / med['none'][k]:.3f} |"
            for label, k in (
                ("first epoch train time (s)", "first_epoch_train_s"),
                ("first epoch images/s", "first_epoch_images_per_s"),
                ("later epochs train time, mean (s)", "later_epoch_train_s"),
                ("images/s over all epochs", "mean_images_per_s"),
                ("first epoch data wait (s)", "first_epoch_data_wait_s"),
                ("setup: imports, scan, model (s)", "setup_s"),
                ("in-loop validation, total (s)", "val_s_total"),
                ("stage wall (s)", "wall_s"),
            )
        ],
        "",
    ]
    save("cache_first_epoch", res, md)


if __name__ == "__main__":
    main()
