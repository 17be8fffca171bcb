"""Decode the dataset once per run; every stage's RAM cache is then served from it, not rebuilt.

yolov5's ``--cache ram`` decodes and resizes every image in every stage process (on an H200 run each stage spent
4-18 s in set-up). The cache_dataset rule instead writes, per split and image size a stage loads it at (train at
its img, val at its val_img), the images exactly as yolov5's ``load_image`` returns them (long side = img,
INTER_LINEAR for the augmented train loader, INTER_AREA when the val loader shrinks) into one flat ``images.u8`` file
plus an index. A stage memory-maps that file copy-on-write: set-up opens it instead of decoding, the pages are shared
through the page cache by every stage, loader worker and DDP rank, and no write can reach the file. The store lives
in the working copy (the pipeline's own folder in cache.dir), never in the user's dataset. An image whose file
changed since the store was built is decoded in the stage, as yolov5 would. Stores no stage loads any more are
deleted (GBs each), as is a failed build's temporary blob.

Layout: ``<working copy>/.imgstore/<img>-<interp>/images.u8`` and ``index.json``:
``{"images": {path: [offset, h, w, h0, w0, mtime_ns, size]}, ...}``.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from pathlib import Path

import cv2
import numpy as np

from stagedyolo.ownership import TMP_PREFIX, is_owned, locked, temp_path

STORE_DIR = ".imgstore"
INDEX = "index.json"
BLOB = "images.u8"


def store_path(root: str | Path, img: int, augment: bool) -> Path:
    """The store a loader reads, one per image size and loader kind: the augmented (train) loader's images are
    resized with INTER_LINEAR, the val loader's with INTER_AREA (yolov5 enlarges with INTER_LINEAR in both)."""
    return Path(root) / STORE_DIR / f"{img}-{'train' if augment else 'val'}"


def resize_like_yolov5(im: np.ndarray, img: int, augment: bool) -> np.ndarray:
    h0, w0 = im.shape[:2]
    r = img / max(h0, w0)
    if r == 1:
        return im
    # yolov5 load_image's choice: INTER_LINEAR when augmenting or enlarging, INTER_AREA when shrinking for val
    interp = cv2.INTER_LINEAR if (augment or r > 1) else cv2.INTER_AREA
    return cv2.resize(im, (math.ceil(w0 * r), math.ceil(h0 * r)), interpolation=interp)


def build_store(root: str | Path, images_by_split: dict[str, list[str]], sizes: dict[str, list[int]]) -> dict:
    """Write one store per split and size in ``sizes`` (split -> the sizes its loaders load it at) in the working
    copy ``root`` (a folder the pipeline owns; its lock is held). Each image is decoded once and resized to every size
    it needs. A store already up to date is kept; other stores are deleted. Returns {"dir", "sizes", "stores",
    "images", "decoded", "removed", "bytes", "seconds"}."""
    t0 = time.monotonic()
    with locked(root):
        for tmp in (Path(root) / STORE_DIR).glob(f"*/{TMP_PREFIX}*"):  # a killed build's blobs: no build writes them
            tmp.unlink(missing_ok=True)
        stores, todo = {}, []
        for split, files in images_by_split.items():
            augment = split == "train"
            for img in sorted(set(sizes.get(split, ()))):
                path = store_path(root, img, augment)
                if not _up_to_date(path, files):
                    todo.append((path, img, augment, files))
                stores[str(path)] = len(files)
        decoded = _write_stores(todo)
        removed = _drop_stores_but(Path(root), {Path(p).name for p in stores})
    return {
        "dir": str(Path(root) / STORE_DIR),
        "sizes": {split: sorted(set(split_sizes)) for split, split_sizes in sizes.items()},
        "stores": stores,
        "images": len({f for files in images_by_split.values() for f in files}),
        "decoded": decoded,
        "removed": removed,
        "bytes": sum(_size(Path(p) / BLOB) for p in stores),
        "seconds": round(time.monotonic() - t0, 3),
    }


def drop_stores(root: str | Path) -> list[str]:
    """Delete every store of the working copy ``root`` (no stage reads one: another cache mode, prebuild off). A
    folder the pipeline does not own is left alone."""
    if not is_owned(root):
        return []
    with locked(root):
        return _drop_stores_but(Path(root), set())


def _drop_stores_but(root: Path, keep: set[str]) -> list[str]:
    """Inside the owned working copy only (the caller holds its lock): stores not in ``keep``."""
    removed = []
    for store in sorted((root / STORE_DIR).glob("*")):
        if store.name not in keep and store.is_dir() and not store.is_symlink():
            shutil.rmtree(store)
            removed.append(store.name)
    return removed


def _write_stores(todo) -> int:
    """Decode each image once for all stores that need it; stream every resized copy into its store's blob. A failed
    build removes its temporary blobs (GBs) before it raises."""
    if not todo:
        return 0
    writers = {}
    try:
        for path, img, augment, files in todo:
            path.mkdir(parents=True, exist_ok=True)
            tmp = temp_path(path / BLOB)
            writers[path] = {
                "tmp": tmp,
                "fh": open(tmp, "wb"),
                "index": {},
                "img": img,
                "augment": augment,
                "files": set(files),
            }
        unique = sorted({f for *_, files in todo for f in files})
        for f in unique:
            _append_image(f, writers.values())
        for path, w in writers.items():
            w["fh"].close()
            _publish(path, w)
    finally:
        for w in writers.values():
            w["fh"].close()
            w["tmp"].unlink(missing_ok=True)  # already renamed when the build succeeded
    return len(unique)


def _append_image(f: str, writers) -> None:
    im = cv2.imread(f)  # BGR, as yolov5
    if im is None:
        return  # unreadable: the stage's yolov5 reports it as it would without the store
    st = os.stat(f)
    for w in writers:
        if f not in w["files"]:
            continue
        out = np.ascontiguousarray(resize_like_yolov5(im, w["img"], w["augment"]))
        w["index"][f] = [w["fh"].tell(), *out.shape[:2], *im.shape[:2], st.st_mtime_ns, st.st_size]
        w["fh"].write(out.tobytes())


def _publish(path: Path, w: dict) -> None:
    """The old index goes first, the new one comes last: a kill in between leaves a blob without an index (not used,
    rebuilt), never a new blob under the old index, which would be accepted whenever the sizes add up."""
    (path / INDEX).unlink(missing_ok=True)
    os.replace(w["tmp"], path / BLOB)
    tmp = temp_path(path / INDEX)
    tmp.write_text(json.dumps({"img": w["img"], "augment": w["augment"], "images": w["index"]}))
    os.replace(tmp, path / INDEX)


def _up_to_date(path: Path, files: list[str]) -> bool:
    index = _read_index(path)
    if index is None or set(index["images"]) != set(files):
        return False
    return all(_unchanged(f, e) for f, e in index["images"].items())


def _unchanged(image: str, entry: list) -> bool:
    try:
        st = os.stat(image)
    except OSError:
        return False
    return st.st_mtime_ns == entry[5] and st.st_size == entry[6]


def _read_index(path: Path) -> dict | None:
    try:
        index = json.loads((path / INDEX).read_text())
    except (OSError, ValueError):
        return None
    expected = sum(e[1] * e[2] * 3 for e in index["images"].values())
    return index if _size(path / BLOB) == expected else None


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def open_store(root: str | Path, img: int, augment: bool):
    """(memory map, index) of the store for this loader, or (None, None) when there is none."""
    path = store_path(root, img, augment)
    index = _read_index(path)
    if index is None or not index["images"]:
        return None, None
    # copy-on-write: an augmentation that writes into an image changes a private page, never the file
    return np.memmap(path / BLOB, dtype=np.uint8, mode="c"), index["images"]


def fill_from_store(dataset, root: str | Path, img: int, augment: bool) -> dict:
    """Give a yolov5 LoadImagesAndLabels its RAM cache from the store: ims[i] is a view of the mapped file.
    Images the store lacks (or that changed since it was built) are decoded here, as yolov5 would."""
    t0 = time.monotonic()
    blob, index = open_store(root, img, augment)
    n = len(dataset.im_files)
    dataset.ims, dataset.im_hw0, dataset.im_hw = [None] * n, [None] * n, [None] * n
    decoded = 0
    for i, f in enumerate(dataset.im_files):
        e = index.get(f) if index else None
        if e is not None and _unchanged(f, e):
            off, h, w, h0, w0 = e[:5]
            dataset.ims[i] = blob[off : off + h * w * 3].reshape(h, w, 3)
            dataset.im_hw0[i], dataset.im_hw[i] = (h0, w0), (h, w)
        else:
            dataset.ims[i], dataset.im_hw0[i], dataset.im_hw[i] = dataset.load_image(i)
            decoded += 1
    return {
        "split": "train" if augment else "val",
        "images": n,
        "from_store": n - decoded,
        "decoded": decoded,
        "seconds": round(time.monotonic() - t0, 4),
    }


def serve_ram_cache(root: str | Path | None, records: list) -> None:
    """Patch yolov5's dataset so that ``--cache ram`` is served from the store under ``root`` (None: yolov5 caches
    as usual). Either way each loader's set-up is timed and appended to ``records`` (timing.json's setup_detail)."""
    from yolov5.utils.dataloaders import LoadImagesAndLabels

    original = LoadImagesAndLabels.__init__

    def __init__(self, *args, **kwargs):
        if kwargs.get("cache_images") != "ram":
            return original(self, *args, **kwargs)
        t0 = time.monotonic()
        if root is None:
            original(self, *args, **kwargs)
            cached = self.ims[0] is not None if self.ims else False  # yolov5's own RAM check may have said no
            record = {
                "source": "engine" if cached else "none",
                "images": len(self.im_files),
                "decoded": len(self.im_files) if cached else 0,
            }
        else:
            original(self, *args, **{**kwargs, "cache_images": False})
            record = fill_from_store(self, root, self.img_size, self.augment)
            record["source"] = "prebuilt"
        record.update(split="train" if self.augment else "val", seconds=round(time.monotonic() - t0, 4))
        records.append(record)

    LoadImagesAndLabels.__init__ = __init__
