"""Choose YOLOv5's image cache mode from measured sizes, and prebuild its disk cache in the staged copy.

Why decide here: YOLOv5's ``--cache ram`` estimates from 30 random images with a 10 % margin and, when that does not
fit, SILENTLY trains uncached; ``--cache disk`` writes full-resolution ``<image>.npy`` next to every image and only
checks that the file exists (stale after an image changes). We decide once, with the numbers recorded, and build the
``.npy`` files ourselves (atomically, staleness-checked) so training never decodes or half-writes them.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import cv2
import numpy as np
import psutil
import yaml
from PIL import Image

from stagedyolo.dataset.image_store import build_store, drop_stores
from stagedyolo.dataset.validate import DatasetError, list_split_images
from stagedyolo.envcheck import tee_log
from stagedyolo.ownership import is_owned, locked, temp_path
from stagedyolo.yolov5_facts import trained_img

NPY_HEADER_BYTES = 128  # np.save's header for a plain uint8 array
CACHE_SPLITS = ("train", "val")  # the loaders train.py builds, both with the --cache setting


def staged_root(staged_data_yaml: str) -> Path:
    """The working copy's folder: the staged yaml's ``path:`` (so a copy of that yaml elsewhere still works)."""
    data = yaml.safe_load(Path(staged_data_yaml).read_text(encoding="utf-8"))
    return Path(data.get("path") or Path(staged_data_yaml).absolute().parent)


def staged_images(staged_data_yaml: str) -> dict[str, list[str]]:
    """split -> image paths of a staged data.yaml (absolute paths, as stage_dataset writes them)."""
    data = yaml.safe_load(Path(staged_data_yaml).read_text(encoding="utf-8"))
    out = {}
    for split in CACHE_SPLITS:
        if data.get(split):
            sources = data[split] if isinstance(data[split], list) else [data[split]]
            out[split] = list_split_images([str(s) for s in sources])[0]
    return out


def decide_cache_mode(
    mode: str,
    staged_data_yaml: str,
    max_imgsz: int,
    available_ram: int | None = None,
    safety_margin: float = 0.3,
    sample: int = 30,
    free_disk: int | None = None,
) -> dict:
    """Pick ram | disk | none. ``auto``: ram if the resized images fit in available RAM x (1 - margin), else disk if
    the cache dir's filesystem holds the full-resolution .npy files (+ margin), else none. Explicit modes pass through,
    with a warning when they will not fit."""
    if mode not in ("auto", "ram", "disk", "none"):
        raise ValueError(f"cache mode '{mode}': use auto, ram, disk or none")
    images = staged_images(staged_data_yaml)
    ram_need, sampled = 0.0, 0
    for files in images.values():
        per_ram, _, n = _sampled_bytes_per_image(files, max_imgsz, sample)
        ram_need += per_ram * len(files)  # every loader holds its own copy, even of shared files
        sampled += n
    unique = sorted({f for files in images.values() for f in files})
    per_ram, per_disk, _ = _sampled_bytes_per_image(unique, max_imgsz, sample)
    existing = sum(_npy_bytes(f) for f in unique)  # up-to-date .npy files already there need no new space
    disk_need = max(per_disk * len(unique) - existing, 0)

    cache_dir = staged_root(staged_data_yaml)
    ram_avail = psutil.virtual_memory().available if available_ram is None else available_ram
    disk_free = shutil.disk_usage(cache_dir).free if free_disk is None else free_disk
    ram_budget = ram_avail * (1 - safety_margin)
    disk_budget = disk_free * (1 - safety_margin)
    fits_ram, fits_disk = ram_need <= ram_budget, disk_need <= disk_budget

    gib = 1 << 30
    if mode != "auto":
        decision, reason = mode, f"cache mode {mode} requested explicitly"
    elif fits_ram:
        decision = "ram"
        reason = f"images at {max_imgsz}px need {ram_need / gib:.2f} GiB RAM <= budget {ram_budget / gib:.2f} GiB"
    elif fits_disk:
        decision = "disk"
        reason = (
            f"RAM needed {ram_need / gib:.2f} GiB > budget {ram_budget / gib:.2f} GiB; full-resolution .npy need "
            f"{disk_need / gib:.2f} GiB <= free disk budget {disk_budget / gib:.2f} GiB at {cache_dir}"
        )
    else:
        decision = "none"
        reason = (
            f"neither fits: RAM {ram_need / gib:.2f} GiB > {ram_budget / gib:.2f} GiB and disk "
            f"{disk_need / gib:.2f} GiB > {disk_budget / gib:.2f} GiB; images are decoded every epoch"
        )
    warning = None
    if decision == "ram" and not fits_ram:
        warning = "ram cache requested but the estimate exceeds the budget: YOLOv5 may silently train uncached"
    elif decision == "disk" and not fits_disk:
        warning = "disk cache requested but the .npy files may not fit on the cache dir's filesystem"
    return {
        "requested": mode,
        "mode": decision,
        "reason": reason,
        "warning": warning,
        "imgsz": max_imgsz,
        "images": {s: len(f) for s, f in images.items()},
        "unique_images": len(unique),
        "sampled": sampled,
        "ram_needed_bytes": int(ram_need),
        "ram_available_bytes": int(ram_avail),
        "ram_budget_bytes": int(ram_budget),
        "disk_needed_bytes": int(disk_need),
        "disk_existing_npy_bytes": int(existing),
        "disk_free_bytes": int(disk_free),
        "disk_budget_bytes": int(disk_budget),
        "safety_margin": safety_margin,
        "cache_dir": str(cache_dir),
    }


def _sampled_bytes_per_image(files: list[str], imgsz: int, sample: int) -> tuple[float, float, int]:
    """Mean bytes per image in RAM (resized as YOLOv5's load_image: long side = imgsz, also upscaling) and on disk
    (full resolution .npy). Reads headers only; evenly spaced samples keep the estimate reproducible."""
    if not files:
        return 0.0, 0.0, 0
    n = min(sample, len(files))
    picks = [files[int(i * len(files) / n)] for i in range(n)]
    ram = disk = 0.0
    for f in picks:
        with Image.open(f) as im:
            w, h = im.size  # cv2.imread ignores EXIF rotation too, and h*w is the same either way
        r = imgsz / max(h, w)
        ram += math.ceil(w * r) * math.ceil(h * r) * 3  # cv2.imread gives 3-channel uint8
        disk += h * w * 3 + NPY_HEADER_BYTES
    return ram / n, disk / n, n


def _npy_bytes(image: str) -> int:
    npy = Path(image).with_suffix(".npy")
    try:
        st_npy, st_img = os.stat(npy), os.stat(image)
    except OSError:
        return 0
    return st_npy.st_size if st_npy.st_mtime_ns >= st_img.st_mtime_ns else 0


def prebuild_disk_cache(staged_data_yaml: str, workers: int | None = None) -> dict:
    """Write YOLOv5's disk cache (``<image>.npy`` = cv2.imread(image), as its cache_images_to_disk does) for every
    staged train/val image, skipping up-to-date files and replacing stale ones (older than the image); drop orphans.
    Refuses to run on anything but a staged copy (a folder the pipeline created and marked), so it can never write
    into the user's dataset, and its orphan sweep never reaches a user's .npy beside the copy in ``cache.dir``."""
    t0 = time.monotonic()
    root = owned_copy(staged_data_yaml, "the disk cache")
    images = sorted({f for files in staged_images(staged_data_yaml).values() for f in files})
    outside = [f for f in images if root not in Path(f).parents]
    if outside:
        raise DatasetError(f"{staged_data_yaml} lists images outside {root}, e.g. {outside[0]}. Fix: re-stage.")
    with locked(root):
        counts = _write_missing_npy(images, workers)
        wanted = {str(Path(f).with_suffix(".npy")) for f in images}
        for npy in root.rglob("*.npy"):  # inside the pipeline's own folder: every .npy there is a disk cache
            if str(npy) not in wanted:
                npy.unlink()
                counts["orphans_removed"] += 1
    counts["bytes"] = sum(os.path.getsize(p) for p in wanted if os.path.exists(p))
    counts["seconds"] = round(time.monotonic() - t0, 3)
    return counts


def owned_copy(staged_data_yaml: str, what: str) -> Path:
    """The working copy of a staged data.yaml, checked to be one: stage_dataset's manifest in a marked folder."""
    root = staged_root(staged_data_yaml)
    if not ((root / "manifest.json").is_file() and is_owned(root)):
        raise DatasetError(
            f"{staged_data_yaml} is not a staged working copy (no manifest.json in a folder stagedyolo created: "
            f"{root}); {what} is only built in the copy, never in the user's dataset or anywhere else. Fix: pass "
            "the data.yaml that stage_dataset wrote."
        )
    return root


def _write_missing_npy(images: list[str], workers: int | None) -> dict:
    counts = {"written": 0, "up_to_date": 0, "stale_replaced": 0, "orphans_removed": 0, "unreadable": []}
    todo = []
    for f in images:
        state = _npy_state(f)
        if state == "fresh":
            counts["up_to_date"] += 1
        else:
            counts["stale_replaced"] += state == "stale"
            todo.append(f)
    workers = workers or min(4, len(os.sched_getaffinity(0)))
    with ThreadPoolExecutor(max_workers=workers) as pool:  # cv2 releases the GIL while decoding
        for f, ok in zip(todo, pool.map(_write_npy, todo)):
            if ok:
                counts["written"] += 1
            else:
                counts["unreadable"].append(f)
    return counts


def _npy_state(image: str) -> str:
    npy = Path(image).with_suffix(".npy")
    try:
        st_npy = os.stat(npy)
    except FileNotFoundError:
        return "missing"
    fresh = st_npy.st_mtime_ns >= os.stat(image).st_mtime_ns and _npy_complete(npy, st_npy.st_size)
    return "fresh" if fresh else "stale"


def _npy_complete(npy: Path, size: int) -> bool:
    """Whether the file holds as many bytes as its header promises. A .npy cut short by a kill (yolov5 writes its
    own with a plain np.save) would otherwise be loaded by training and crash it, or worse, be trusted as fresh."""
    try:
        with open(npy, "rb") as fh:
            version = np.lib.format.read_magic(fh)
            read_header = (
                np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            )
            shape, _fortran, dtype = read_header(fh)
            return size == fh.tell() + int(np.prod(shape)) * dtype.itemsize
    except (OSError, ValueError):
        return False


def _write_npy(image: str) -> bool:
    im = cv2.imread(image)
    if im is None:
        return False
    npy = Path(image).with_suffix(".npy")
    # YOLOv5 loads any .npy that exists, so a half-written one must never appear under the final name.
    tmp = temp_path(npy)
    with open(tmp, "wb") as fh:
        np.save(fh, im)
    os.replace(tmp, npy)
    return True


def cache_dataset(
    data: str,
    decision_out: str,
    mode: str,
    safety_margin: float,
    max_img: int,
    log_path: str | None = None,
    log=print,
    store_sizes: dict[str, list[int]] | None = None,
) -> dict:
    """The cache_dataset rule: decide the mode, prebuild the .npy files when it is disk, and when it is ram decode
    the images once into the store every stage's RAM cache is served from (``store_sizes``: per split, the image
    sizes the stages load it at, recipe.image_store_sizes; None or empty builds none, and each stage's yolov5 caches
    by itself). Writes the decision JSON."""
    log = tee_log(log, log_path)
    decision = decide_cache_mode(mode, data, max_img, safety_margin=safety_margin)
    log(f"cache mode {decision['mode']} (requested {mode}): {decision['reason']}")
    if decision["warning"]:
        log(f"WARNING: {decision['warning']}")
    if decision["mode"] == "disk":
        p = decision["prebuild"] = prebuild_disk_cache(data)
        log(
            f"disk cache: {p['written']} written, {p['up_to_date']} up to date, {p['orphans_removed']} orphans "
            f"removed, {len(p['unreadable'])} unreadable, {p['seconds']} s"
        )
    if decision["mode"] == "ram":
        decision["store"] = prebuild_ram_store(data, decision, store_sizes or {})
        log(f"image store: {decision['store']['reason']}")
    else:
        decision["stores_removed"] = drop_stores(staged_root(data))  # no stage reads a store in this mode
    Path(decision_out).parent.mkdir(parents=True, exist_ok=True)
    Path(decision_out).write_text(json.dumps(decision, indent=2) + "\n", encoding="utf-8")
    return decision


def prebuild_ram_store(staged_data_yaml: str, decision: dict, sizes: dict[str, list[int]]) -> dict:
    """Build the image store (stagedyolo.dataset.image_store) in the working copy when its files fit on the cache
    dir's filesystem; returns {"root": working copy or None, "reason", ...build figures}. A store no stage will read
    (other sizes, or none built) is deleted: each holds every image at one size."""
    root = owned_copy(staged_data_yaml, "the image store")
    sizes = {split: sorted({trained_img(s) for s in split_sizes}) for split, split_sizes in sizes.items()}
    # The RAM estimate (train and val) is for the largest size; smaller sizes need less.
    need = decision["ram_needed_bytes"] * max((len(split_sizes) for split_sizes in sizes.values()), default=0)
    if not sizes:
        why = "cache.prebuild_ram is off (each stage's yolov5 caches itself)"
    elif need > decision["disk_budget_bytes"]:
        why = (
            f"{need / (1 << 30):.2f} GiB for sizes {sizes} exceed the cache dir's free-disk budget; each stage's "
            "yolov5 caches itself"
        )
    else:
        built = build_store(root, staged_images(staged_data_yaml), sizes)
        reason = (
            f"{built['images']} images decoded {'once' if built['decoded'] else '(already up to date)'} into "
            f"sizes {sizes}: {built['bytes'] / (1 << 20):.1f} MiB in {built['seconds']} s"
        )
        return {"root": str(root), "reason": reason, **built}
    return {"root": None, "reason": f"not built: {why}", "removed": drop_stores(root)}
