"""Stage a private working copy of the dataset under the cache dir, incrementally.

Why a working copy: YOLOv5 writes next to the data it trains on (``labels.cache``, ``<image>.npy`` for ``--cache
disk``) and rewrites a JPEG lacking its end marker in place. Training on a copy keeps the user's dataset byte-for-byte
untouched, works with a read-only source, and puts the data on fast local scratch when ``cache.dir`` points there.

Layout: the copy lives in a folder of its own, ``<cache_dir>/stagedyolo-<run>-<key>/`` (``working_copy_dir``: one
per source dataset and run, so two runs sharing ``cache.dir`` never replace each other's files), created with mode
0700 and marked as the pipeline's (stagedyolo.ownership): nothing else in ``cache.dir`` is ever written or deleted.
In it: ``<split>/images/<relative path>`` and the label YOLOv5 derives from it (its img2label_paths: the last
``/images/`` becomes ``/labels/``), plus ``data.yaml`` with absolute paths and ``manifest.json``.

Hardlink or copy? A hardlink shares the inode with the user's file, so anything that WRITES INTO a staged image
would write into the user's dataset. What YOLOv5 writes:
  - ``labels.cache`` and ``<image>.npy``: new files beside the staged ones (new inodes): safe with links.
  - the in-place "restore" of a JPEG that does not end with FF D9: opens the existing path for writing and would go
    straight through a hardlink. So such JPEGs are never linked (re-checked here, at link time, not trusted from the
    report), anything the report lists as bad is never linked, and labels (tiny) are always copied.
  - we never write into an existing staged file either: every placement goes to a temporary name and is renamed over
    the old one, which replaces the directory entry instead of writing through it.
With those rules a hardlink is safe, and it costs no space or time, so it is the default when source and cache share
a filesystem; any link failure (another filesystem, protected_hardlinks) falls back to a copy.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import time
from pathlib import Path

import yaml

from stagedyolo.dataset.validate import (
    IMG_FORMATS,
    DatasetError,
    apply_policy,
    ends_with_eoi,
    img2label_path,
    list_split_images,
    load_data_yaml,
    validate_dataset,
    write_dataset_report,
)
from stagedyolo.envcheck import tee_log
from stagedyolo.ownership import NotOwnedError, claim, drop, locked, sweep_temps, temp_path

MANIFEST_VERSION = 1


def working_copy_dir(cache_dir: str | os.PathLike, data_yaml: str, run_dir: str | os.PathLike) -> Path:
    """The run's own folder under ``cache.dir``: named after the run, keyed by the source data.yaml and the run's
    results folder (two runs of one name in different results dirs, or of two datasets, get two copies)."""
    key = hashlib.sha256(f"{Path(data_yaml).resolve()}\n{Path(run_dir).resolve()}".encode()).hexdigest()[:10]
    return Path(cache_dir).absolute() / f"stagedyolo-{Path(run_dir).name}-{key}"


def stage_dataset(data_yaml: str, report: dict, copy_dir: str, exclude: set, hardlinks: bool = True) -> dict:
    """Create or update the working copy in ``copy_dir``, a folder the pipeline creates (mode 0700) and marks as its
    own; an existing folder without that marker is refused. ``report`` is validate_dataset's, ``exclude``
    apply_policy's. Holds the folder's lock while staging. Returns stats {copied, linked, unchanged, removed, ...}
    and the staged data.yaml path."""
    data = load_data_yaml(data_yaml)
    if report.get("data_yaml") != data["yaml"]:
        raise DatasetError(
            f"the dataset report is for {report.get('data_yaml')}, not {data['yaml']}. Fix: re-validate."
        )
    cache = Path(copy_dir).absolute()
    _refuse_overlap(cache, data)
    try:
        claim(cache, "dataset working copy", private=True, source=data["yaml"])
    except NotOwnedError as e:
        raise DatasetError(str(e)) from None
    with locked(cache):
        return _stage(data, report, cache, exclude, hardlinks)


def _stage(data: dict, report: dict, cache: Path, exclude: set, hardlinks: bool) -> dict:
    t0 = time.monotonic()
    leftovers = sweep_temps(cache)  # a killed staging's temporary files: ours, and no writer is active (the lock)
    suspect = {b["image"] for b in report["bad"]}  # not excluded (e.g. a hand-made exclude set): copy, never link
    plan, split_dirs = _plan(data, cache, exclude)
    manifest_path = cache / "manifest.json"
    old = _load_manifest(manifest_path)
    counters = ("copied", "linked", "unchanged", "removed", "npy_invalidated", "bytes_copied")
    stats = {**dict.fromkeys(counters, 0), "temps_removed": leftovers}
    new_entries = {}

    for rel, (src, kind, _split) in plan.items():
        dst = cache / rel
        st = os.stat(src)
        entry = {"src": src, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "kind": kind}
        link_ok = hardlinks and kind == "image" and src not in suspect and _safe_to_link(src)
        prev = old.get(rel)
        if prev and _still_valid(prev, entry, dst, st, link_ok):
            new_entries[rel] = prev
            stats["unchanged"] += 1
            continue
        if kind == "image" and (prev or dst.exists()):  # a replacement: what YOLOv5 derived from it is stale now
            stats["npy_invalidated"] += drop(dst.with_suffix(".npy"))
        entry["placed"] = _place(src, dst, link_ok)
        stats["linked" if entry["placed"] == "link" else "copied"] += 1
        stats["bytes_copied"] += st.st_size if entry["placed"] == "copy" else 0
        new_entries[rel] = entry

    for rel, prev in old.items():
        if rel not in plan:
            dst = cache / rel
            stats["removed"] += drop(dst)
            if prev.get("kind") == "image":
                stats["npy_invalidated"] += drop(dst.with_suffix(".npy"))
            _prune_empty_dirs(dst.parent, cache)

    stats["label_caches_invalidated"] = _drop_label_caches(cache)
    _write_atomic(manifest_path, json.dumps({"version": MANIFEST_VERSION, "files": new_entries}, indent=1))
    staged_yaml = cache / "data.yaml"
    _write_atomic(staged_yaml, yaml.safe_dump(_staged_data(data, cache, split_dirs), sort_keys=False))
    stats.update(
        data_yaml=str(staged_yaml),
        manifest=str(manifest_path),
        excluded=len(exclude),
        images={s: sum(1 for v in plan.values() if v[2] == d and v[1] == "image") for s, d in split_dirs.items()},
        seconds=round(time.monotonic() - t0, 3),
    )
    return stats


def _refuse_overlap(cache: Path, data: dict) -> None:
    real_cache = cache.resolve()
    for split, sources in data["splits"].items():
        for src in sources:
            src_dir = Path(src).resolve()
            src_dir = src_dir if src_dir.is_dir() else src_dir.parent
            if real_cache == src_dir or src_dir in real_cache.parents or real_cache in src_dir.parents:
                raise DatasetError(
                    f"cache dir {cache} overlaps the `{split}:` source {src}: YOLOv5 would list staged copies as "
                    "data, or staging would touch the source. Fix: set cache.dir outside the dataset."
                )


def _plan(data: dict, cache: Path, exclude: set) -> tuple[dict, dict]:
    """relative staged path -> (source path, 'image'|'label', split dir name); and split -> staged split dir name.
    A split whose sources equal an earlier split's (e.g. val: = train:) reuses its copy instead of a second one."""
    plan: dict[str, tuple[str, str, str]] = {}
    split_dirs: dict[str, str] = {}
    for split, sources in data["splits"].items():
        twin = next((s for s in split_dirs if data["splits"][s] == sources), None)
        if twin:
            split_dirs[split] = split_dirs[twin]
            continue
        split_dirs[split] = split
        seen: set[str] = set()
        for k, src in enumerate(sources):
            images = [
                im
                for im in list_split_images([src])[0]
                if im not in seen and im not in exclude and os.path.isfile(im)  # a .txt list may name missing files
            ]
            seen.update(images)
            if Path(src).is_dir():
                root = Path(src)
            else:  # an image list file: staged paths are relative to its images' common folder
                root = Path(os.path.commonpath([os.path.dirname(i) for i in images] or [src]))
            prefix = f"{k}/" if len(sources) > 1 else ""  # several sources may hold the same relative names
            for im in images:
                rel_img = f"{split}/images/{prefix}{Path(im).relative_to(root).as_posix()}"
                plan[rel_img] = (im, "image", split)
                label = img2label_path(im)
                if os.path.isfile(label):
                    staged_label = img2label_path(str(cache / rel_img))
                    plan[Path(staged_label).relative_to(cache).as_posix()] = (label, "label", split)
    return plan, split_dirs


def _safe_to_link(src: str) -> bool:
    """Only files YOLOv5 will never rewrite. It rewrites exactly the JPEGs that do not end with FF D9."""
    suffix = src.rsplit(".", 1)[-1].lower()
    if suffix in ("jpg", "jpeg"):
        return ends_with_eoi(src)
    return suffix in IMG_FORMATS


def _still_valid(prev: dict, entry: dict, dst: Path, st: os.stat_result, link_ok: bool) -> bool:
    if any(prev.get(k) != entry[k] for k in ("src", "size", "mtime_ns")):
        return False
    try:
        dst_st = os.stat(dst)
    except OSError:
        return False
    if prev.get("placed") == "link":
        # same inode still (the user may have replaced the file with cp -p), and linking still allowed
        return link_ok and (dst_st.st_ino, dst_st.st_dev) == (st.st_ino, st.st_dev)
    return dst_st.st_size == st.st_size and dst_st.st_mtime_ns == st.st_mtime_ns


def _place(src: str, dst: Path, link_ok: bool) -> str:
    """Put src at dst through a temporary name, so an existing dst (maybe a hardlink) is replaced, not written into."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(dst)
    placed = "copy"
    if link_ok:
        with contextlib.suppress(OSError):  # another filesystem, fs.protected_hardlinks, no link support: copy instead
            os.link(src, tmp)
            placed = "link"
    if placed == "copy":
        shutil.copyfile(src, tmp)
        st = os.stat(src)
        os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))  # keeps the unchanged-check and .npy staleness honest
    os.replace(tmp, dst)
    return placed


def _drop_label_caches(copy: Path) -> int:
    """Every YOLOv5 labels .cache in the copy, at every staging. Its hash covers only paths and total size, so a
    same-size edit would keep stale labels/shapes; and it is a pickle yolov5 loads before any check, so one that
    outlived a staging is never trusted, whoever wrote it."""
    return sum(drop(p) for p in copy.rglob("*.cache"))


def _prune_empty_dirs(d: Path, stop: Path) -> None:
    while d != stop and stop in d.parents:
        try:
            d.rmdir()
        except OSError:
            return
        d = d.parent


def _load_manifest(path: Path) -> dict:
    try:
        m = json.loads(path.read_text())
        return m["files"] if m.get("version") == MANIFEST_VERSION else {}
    except (OSError, ValueError, KeyError, AttributeError):
        return {}  # no or unreadable manifest: everything is re-placed, which is always correct


def _staged_data(data: dict, cache: Path, split_dirs: dict) -> dict:
    return {
        "path": str(cache),
        **{split: str(cache / d / "images") for split, d in split_dirs.items()},
        "nc": data["nc"],
        "names": dict(enumerate(data["names"])),
        "source_data_yaml": data["yaml"],  # provenance; YOLOv5 ignores unknown keys
    }


def _write_atomic(path: Path, text: str) -> None:
    tmp = temp_path(path)
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def prepare_dataset(
    source: str,
    cache_dir: str | None,
    data_out: str,
    report_json: str,
    report_md: str,
    on_bad_data: str = "skip",
    max_bad_fraction: float = 0.05,
    log_path: str | None = None,
    log=print,
    hardlinks: bool = True,
) -> dict:
    """The prepare_dataset rule: validate, write the report, apply the policy, stage, write ``data_out`` (a copy of
    the staged data.yaml; its absolute paths work from anywhere). Raises DatasetError after logging the report, since
    Snakemake deletes a failed job's outputs but keeps its log. The working copy goes to the run's own folder in
    ``cache_dir`` (working_copy_dir), or in ``<run>/cache`` with no ``cache_dir``; the run is found from ``data_out``
    (``<run>/data/data.yaml``) so that a Snakemake module's prefix applies."""
    log = tee_log(log, log_path)
    run_dir = Path(data_out).parent.parent
    copy_dir = working_copy_dir(cache_dir or run_dir / "cache", source, run_dir)
    report = validate_dataset(source)
    write_dataset_report(report, report_json, report_md)
    t = report["totals"]
    log(f"validated {source}: {t['images']} images, {t['bad_images']} bad, {len(report['warnings'])} warnings")
    try:
        exclude = apply_policy(report, on_bad_data, max_bad_fraction)
    except DatasetError:
        log(Path(report_md).read_text(encoding="utf-8"))
        raise
    for b in report["bad"]:
        log(f"skipped: {b['file']}" + (f":{b['line']}" if b["line"] else "") + f": {b['reason']}")
    stats = stage_dataset(source, report, str(copy_dir), exclude, hardlinks=hardlinks)
    log(
        f"staged into {copy_dir}: {stats['linked']} linked, {stats['copied']} copied, {stats['unchanged']} "
        f"unchanged, {stats['removed']} removed ({stats['seconds']} s)"
    )
    report["excluded"] = sorted(exclude)
    report["staging"] = stats
    write_dataset_report(report, report_json, report_md)
    Path(data_out).parent.mkdir(parents=True, exist_ok=True)
    Path(data_out).write_text(Path(stats["data_yaml"]).read_text(encoding="utf-8"), encoding="utf-8")
    return stats
