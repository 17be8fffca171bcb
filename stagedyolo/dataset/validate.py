"""Validate a YOLOv5 dataset before training, so bad data is found up front and never touched by YOLOv5.

YOLOv5's own scan silently drops corrupt images and malformed labels (the run still exits 0), fails on a class id
>= nc, and rewrites a JPEG that lacks its end marker IN PLACE. This module finds all of that first, read-only, and
reports it per file and line, so the pipeline can skip or stop (``apply_policy``) before YOLOv5 ever sees the data.

Path rules follow YOLOv5 7.0 (utils/general.py:check_dataset, utils/dataloaders.py:LoadImagesAndLabels) with one
deliberate difference: a relative ``path:`` (or a relative split without ``path:``) is resolved against the yaml's own
folder. YOLOv5 resolves it against its package folder (site-packages/yolov5), which is never what a user means; the
pipeline hands YOLOv5 only the staged data.yaml, whose paths are absolute, so the user's yaml is read only here.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml
from PIL import Image, ImageFile

from stagedyolo.yolov5_facts import MIN_STRIDE, trained_img

# Copied from yolov5/utils/dataloaders.py (7.0.14) rather than imported: importing yolov5 takes ~10 s and reaches out.
IMG_FORMATS = ("bmp", "dng", "jpeg", "jpg", "mpo", "png", "tif", "tiff", "webp", "pfm")
SPLITS = ("train", "val", "test")
MAX_PROBLEMS_PER_FILE = 20  # a label file with 10k bad lines should not drown the report
PARALLEL_THRESHOLD = 64  # below this, a thread pool is not worth it


class DatasetError(Exception):
    """The dataset cannot be used as configured. The message names the file (and line) and the fix."""


# ---------------------------------------------------------------------------------------------------------------------
# data.yaml and path resolution


def load_data_yaml(data_yaml: str) -> dict:
    """Parse a YOLOv5 data.yaml and resolve its splits to absolute paths. Raises DatasetError with the fix."""
    yaml_path = Path(data_yaml).expanduser().absolute()
    if not yaml_path.is_file():
        raise DatasetError(
            f"data.yaml not found: {yaml_path}. Fix: set `dataset:` in the config to the path of your YOLOv5 "
            f"data.yaml (or `demo` for the built-in demo set)."
        )
    try:
        data = yaml.safe_load(yaml_path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise DatasetError(f"could not parse {yaml_path}{where}: {e}. Fix: correct the YAML syntax there.") from e
    if not isinstance(data, dict):
        raise DatasetError(f"{yaml_path} is not a YAML mapping. Fix: it needs `train:`, `val:` and `names:` keys.")
    for key in ("train", "val", "names"):
        if not data.get(key):
            raise DatasetError(f"{yaml_path} has no `{key}:` key. Fix: add it (YOLOv5 requires train, val and names).")

    names = _parse_names(data["names"], yaml_path)
    if "nc" in data and data["nc"] != len(names):
        raise DatasetError(
            f"{yaml_path}: `nc: {data['nc']}` but `names:` lists {len(names)} classes. YOLOv5 would silently use "
            f"{len(names)}. Fix: make nc equal the number of names (or drop nc)."
        )

    base = Path(data.get("path") or "")
    base = base if base.is_absolute() else (yaml_path.parent / base)
    splits = {key: _resolve_split(key, data[key], base, yaml_path) for key in SPLITS if data.get(key)}
    return {"yaml": str(yaml_path), "names": names, "nc": len(names), "splits": splits}


def _parse_names(names, yaml_path: Path) -> list[str]:
    if isinstance(names, (list, tuple)):
        return [str(n) for n in names]
    if isinstance(names, dict):
        if not all(isinstance(k, int) for k in names):
            raise DatasetError(f"{yaml_path}: `names:` keys must be integers (0: person). Fix: renumber them.")
        if sorted(names) != list(range(len(names))):
            raise DatasetError(f"{yaml_path}: `names:` keys must be 0..{len(names) - 1} without gaps. Fix: renumber.")
        return [str(names[i]) for i in range(len(names))]
    raise DatasetError(f"{yaml_path}: `names:` must be a list or a mapping 0: name. Fix: rewrite it.")


def _resolve_split(key: str, value, base: Path, yaml_path: Path) -> list[str]:
    entries = value if isinstance(value, (list, tuple)) else [value]
    resolved = []
    for entry in entries:
        p = (base / str(entry)).resolve()
        # YOLOv5 retries a missing '../x' as 'x' (check_dataset); keep that so valid YOLOv5 yamls stay valid.
        if not p.exists() and isinstance(value, str) and value.startswith("../"):
            p = (base / value[3:]).resolve()
        if not p.exists():
            raise DatasetError(_missing_path_message(key, entry, p, base, yaml_path))
        resolved.append(str(p))
    return resolved


def _missing_path_message(key: str, entry, p: Path, base: Path, yaml_path: Path) -> str:
    parent = p
    while not parent.exists():
        parent = parent.parent
    missing = p.relative_to(parent).parts[0]
    labels_twin = _labels_twin(p)
    if labels_twin and labels_twin.exists():
        what = f"images directory missing (its labels folder {labels_twin} exists)"
    elif missing == "images":
        what = "images directory missing"
    else:
        what = "path does not exist"
    return (
        f"data.yaml key `{key}: {entry}` resolves to {p}: {what} (first missing part: '{missing}' in {parent}). "
        f"Paths are relative to `path:` or else to the yaml's folder ({base}); yaml: {yaml_path}. "
        f"Fix: correct `{key}:` (or `path:`) in {yaml_path.name}."
    )


def _labels_twin(p: Path) -> Path | None:
    """.../images/val -> .../labels/val (the last 'images' part), or None when there is no 'images' part."""
    parts = list(p.parts)
    if "images" not in parts:
        return None
    i = len(parts) - 1 - parts[::-1].index("images")
    return Path(*parts[:i], "labels", *parts[i + 1 :])


def list_split_images(sources: list[str]) -> tuple[list[str], int]:
    """Images of one split, as YOLOv5's LoadImagesAndLabels lists them. Returns (sorted image paths, ignored count)."""
    found: list[str] = []
    for src in sources:
        p = Path(src)
        if p.is_dir():
            # Same as YOLOv5's glob('**/*.*', recursive=True): hidden files and names without a dot are not seen.
            found += [str(f) for f in p.rglob("*.*") if f.is_file() and not _hidden(f, p)]
        else:
            parent = str(p.parent) + os.sep
            lines = p.read_text(encoding="utf-8").strip().splitlines()
            for line in (x.strip() for x in lines):
                if line.startswith("./"):
                    line = line.replace("./", parent, 1)
                elif not os.path.isabs(line):
                    # YOLOv5 leaves these relative to the current directory; a pipeline's cwd is arbitrary, so
                    # resolve against the list file's folder.
                    line = str(p.parent / line)
                found.append(os.path.abspath(line))
    images = sorted({f for f in found if f.rsplit(".", 1)[-1].lower() in IMG_FORMATS})
    return images, len(found) - len(images)


def _hidden(f: Path, root: Path) -> bool:
    return any(part.startswith(".") for part in f.relative_to(root).parts)


def img2label_path(image: str) -> str:
    """YOLOv5's img2label_paths for one path: the last /images/ becomes /labels/, the suffix becomes .txt."""
    sa, sb = f"{os.sep}images{os.sep}", f"{os.sep}labels{os.sep}"
    return sb.join(image.rsplit(sa, 1)).rsplit(".", 1)[0] + ".txt"


# ---------------------------------------------------------------------------------------------------------------------
# per-file checks


def check_image(path: str) -> dict:
    """Decode one image the way YOLOv5 will. Returns {'w','h','format','problem'} (problem None when fine).
    Call it inside strict_pil(), or a process-wide LOAD_TRUNCATED_IMAGES=True would hide truncated files."""
    out = {"w": None, "h": None, "format": None, "problem": None}
    if not os.path.isfile(path):
        out["problem"] = "image file does not exist (listed, but missing). Fix: remove it from the list or restore it"
        return out
    try:
        with Image.open(path) as im:
            im.verify()
        with Image.open(path) as im:
            out["format"] = (im.format or "").lower()
            w, h = im.size
            out["w"], out["h"] = (h, w) if _has_rotation(im) else (w, h)  # the shape YOLOv5 records (exif_size)
            im.load()
    except Exception as e:  # PIL raises many types for bad files
        kind = "truncated image" if "truncat" in str(e).lower() else "undecodable image"
        if path.rsplit(".", 1)[-1].lower() in ("jpg", "jpeg") and not ends_with_eoi(path):
            kind = "corrupt JPEG (truncated): no end-of-image marker, and it does not decode"
        out["problem"] = f"{kind}: {e}. Fix: re-export or remove the file"
        return out
    if out["format"] not in IMG_FORMATS:
        out["problem"] = (
            f"format {out['format'].upper()} is not one YOLOv5 reads ({', '.join(IMG_FORMATS)}). Fix: convert it"
        )
    elif min(out["w"], out["h"]) < 10:
        out["problem"] = f"image is {out['w']}x{out['h']}; YOLOv5 drops images under 10 px. Fix: remove it"
    elif out["format"] in ("jpeg", "jpg") and not ends_with_eoi(path):
        out["problem"] = (
            "corrupt JPEG (truncated): the file does not end with the JPEG end-of-image marker; YOLOv5 would rewrite "
            "it in place. Fix: re-save it (e.g. PIL Image.open(f).save(f)) in your dataset, or let it be skipped"
        )
    return out


def _has_rotation(im) -> bool:
    try:
        return im.getexif().get(0x0112, 1) in (5, 6, 7, 8)  # orientations that swap width and height
    except Exception:
        return False


def ends_with_eoi(path: str) -> bool:
    """True when the file ends with the JPEG end-of-image marker FF D9 (YOLOv5 rewrites JPEGs that do not)."""
    try:
        with open(path, "rb") as f:
            f.seek(-2, os.SEEK_END)
            return f.read() == b"\xff\xd9"
    except OSError:  # shorter than 2 bytes, or unreadable
        return False


def check_label(path: str, nc: int) -> dict:
    """Parse one YOLO label file. Returns {'boxes', 'classes': {id: n}, 'problems': [(line, reason)], 'warnings',
    'wh': [(width, height) of each box, normalised]}."""
    out = {"boxes": 0, "classes": {}, "problems": [], "warnings": [], "wh": []}
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        out["problems"].append((None, f"cannot read label file as UTF-8 text: {e}. Fix: rewrite it as plain text"))
        return out
    lines = text.splitlines()
    content = [i for i, line in enumerate(lines) if line.strip()]
    seen: dict[tuple, int] = {}
    for i in range(content[0], content[-1] + 1) if content else ():
        n, line = i + 1, lines[i]
        if len(out["problems"]) >= MAX_PROBLEMS_PER_FILE:
            break
        if not line:
            continue  # YOLOv5 skips empty lines ...
        if not line.strip():  # ... but a whitespace-only line inside the file makes it reject the whole file
            out["problems"].append((n, "line has only whitespace; YOLOv5 rejects the whole file. Fix: delete it"))
            continue
        reason, row = _check_label_row(line.split(), nc)
        if reason:
            out["problems"].append((n, reason))
        elif row in seen:
            out["warnings"].append((n, f"duplicate of line {seen[row]}; YOLOv5 drops it. Fix: delete the line"))
        else:
            seen[row] = n
            out["boxes"] += 1
            out["classes"][int(row[0])] = out["classes"].get(int(row[0]), 0) + 1
            out["wh"].append(row[3:])
    return out


def _check_label_row(fields: list[str], nc: int) -> tuple[str | None, tuple | None]:
    if len(fields) != 5:
        hint = " (polygon/segment labels are not supported: convert them to boxes)" if len(fields) > 6 else ""
        return (
            f"{len(fields)} columns, expected 5: class x_center y_center width height{hint}. Fix: correct the line",
            None,
        )
    values = []
    for x in fields:
        try:
            values.append(float(x))
        except ValueError:
            return f"non-numeric field '{x}'. Fix: use numbers only (class x_center y_center width height)", None
    row = tuple(values)
    if not all(math.isfinite(v) for v in row):
        return "non-finite value (nan/inf). Fix: correct the line", None
    cls, x, y, w, h = row
    if cls != int(cls) or not 0 <= cls < nc:
        return f"class id {fields[0]} is not an integer in [0, {nc}) (nc={nc}). Fix: correct it or extend names:", None
    if not (0 <= x <= 1 and 0 <= y <= 1 and 0 < w <= 1 and 0 < h <= 1):
        return (
            f"box {fields[1]} {fields[2]} {fields[3]} {fields[4]} is not normalised (x,y in [0,1], w,h in (0,1]). "
            "Fix: divide pixel coordinates by the image width/height"
        ), None
    return None, row


def _check_pair(image: str, nc: int) -> dict:
    label = img2label_path(image)
    result = {"image": image, "label": label, "img": check_image(image), "lbl": None}
    if os.path.isfile(label):
        result["lbl"] = check_label(label, nc)
    return result


# ---------------------------------------------------------------------------------------------------------------------
# the report


def validate_dataset(data_yaml: str, workers: int | None = None) -> dict:
    """Check every image and label of every split. Raises DatasetError for dataset-level problems; per-file problems
    go into the returned report (``bad``, ``warnings``) for ``apply_policy`` to act on."""
    data = load_data_yaml(data_yaml)
    nc = data["nc"]
    listed = {}
    for split, sources in data["splits"].items():
        images, ignored = list_split_images(sources)
        if not images:
            raise DatasetError(
                f"no images found for `{split}:` in {', '.join(sources)} (from {data['yaml']}). YOLOv5 looks for "
                f"*.{{{','.join(IMG_FORMATS)}}} at any depth. Fix: point `{split}:` at the images folder."
            )
        listed[split] = (images, ignored)

    unique = sorted({im for images, _ in listed.values() for im in images})
    results = {r["image"]: r for r in _run_checks(unique, nc, workers)}

    report = {
        "data_yaml": data["yaml"],
        "names": data["names"],
        "nc": nc,
        "names_non_ascii": any(not n.isascii() for n in data["names"]),  # YOLOv5 then wants Arial.Unicode.ttf
        "splits": {
            split: _summarise_split(split, data["splits"][split], images, ignored, results, data)
            for split, (images, ignored) in listed.items()
        },
        "bad": [],
        "warnings": [],
    }
    seen = set()
    for split, summary in report["splits"].items():
        for kind, key_fields in (("bad", ("image", "file", "line", "reason")), ("warnings", ("file", "line"))):
            for item in summary.pop(f"_{kind}"):
                key = (kind, *(item[f] for f in key_fields))
                if key not in seen:  # an image shared by train and val is reported once
                    seen.add(key)
                    report[kind].append(dict(item, split=split))
    bad_images = {b["image"] for b in report["bad"]}
    report["totals"] = {
        "images": len(unique),
        "bad_images": len(bad_images),
        "bad_fraction": len(bad_images) / len(unique),
    }
    return report


@contextlib.contextmanager
def strict_pil():
    """Some code (a plugin, a notebook) relaxes ImageFile.LOAD_TRUNCATED_IMAGES process-wide; we must not."""
    saved = ImageFile.LOAD_TRUNCATED_IMAGES
    ImageFile.LOAD_TRUNCATED_IMAGES = False
    try:
        yield
    finally:
        ImageFile.LOAD_TRUNCATED_IMAGES = saved


def _run_checks(images: list[str], nc: int, workers: int | None) -> list[dict]:
    # Threads, not processes: Pillow decodes without the GIL, and a process pool would fork a process that has torch
    # loaded (or, with spawn, re-run the calling Snakemake script).
    workers = workers if workers is not None else min(len(os.sched_getaffinity(0)), 8)
    check = functools.partial(_check_pair, nc=nc)
    with strict_pil():
        if workers <= 1 or len(images) < PARALLEL_THRESHOLD:
            return list(map(check, images))
        with ThreadPoolExecutor(max_workers=workers) as pool:
            return list(pool.map(check, images))


def _summarise_split(split, sources, images, ignored, results, data) -> dict:
    bad, warnings = [], []
    hist = {name: 0 for name in data["names"]}
    sizes, short_sides = [], []
    labelled = backgrounds = empty = boxes = 0
    for im in images:
        r = results[im]
        if r["img"]["problem"]:
            bad.append({"file": im, "image": im, "line": None, "reason": r["img"]["problem"]})
        else:
            sizes.append((r["img"]["w"], r["img"]["h"]))
        lbl = r["lbl"]
        if lbl is None:
            backgrounds += 1
            continue
        if not r["img"]["problem"]:
            short_sides += _short_sides(lbl["wh"], r["img"]["w"], r["img"]["h"])
        labelled += 1
        empty += lbl["boxes"] == 0 and not lbl["problems"]
        boxes += lbl["boxes"]
        for cls, n in lbl["classes"].items():
            hist[data["names"][cls]] += n
        for line, reason in lbl["problems"]:
            bad.append({"file": r["label"], "image": im, "line": line, "reason": reason})
        for line, reason in lbl["warnings"]:
            warnings.append({"file": r["label"], "image": im, "line": line, "reason": reason})
    if labelled == 0:
        example = img2label_path(images[0])
        raise DatasetError(
            f"no label files at all for split `{split}` ({len(images)} images in {', '.join(sources)}): the labels "
            f"folder {os.path.dirname(example)} is empty or missing. YOLOv5 expects one .txt per image in a labels/ "
            f"folder parallel to images/, e.g. {example}. Fix: put the labels there (yaml: {data['yaml']})."
        )
    bad_images = {b["image"] for b in bad}
    return {
        "sources": sources,
        "images": len(images),
        "ignored_files": ignored,
        "labelled": labelled,
        "backgrounds": backgrounds,
        "empty_label_files": int(empty),
        "boxes": boxes,
        "bad_images": len(bad_images),
        "class_histogram": hist,
        "image_size": _size_stats(sizes),
        "box_short_side": _short_side_stats(short_sides),
        "_bad": bad,
        "_warnings": warnings,
    }


def _short_sides(wh: list[tuple[float, float]], width: int, height: int) -> list[float]:
    """Each box's short side as a fraction of its image's long side: yolov5 letterboxes the long side to the
    training size, so at size S the box is fraction x S pixels across."""
    return [min(w * width, h * height) / max(width, height) for w, h in wh]


def _short_side_stats(fractions: list[float]) -> dict | None:
    """The boxes' short sides (fractions of the long image side): 5th percentile and median, and the smallest
    training size (a multiple of 32) at which 95 % of the boxes span at least MIN_STRIDE pixels, yolov5's finest
    grid. A phase trained below that size shrinks more than a twentieth of the boxes under one cell of it."""
    if not fractions:
        return None
    ordered = sorted(fractions)
    p5, median = ordered[int(0.05 * (len(ordered) - 1))], ordered[len(ordered) // 2]
    return {
        "p5_of_long_side": round(p5, 4),
        "median_of_long_side": round(median, 4),
        "min_img_for_95pct_at_stride": trained_img(math.ceil(MIN_STRIDE / p5)),
    }


def _size_stats(sizes: list[tuple[int, int]]) -> dict:
    if not sizes:
        return {k: None for k in ("min_w", "max_w", "mean_w", "min_h", "max_h", "mean_h")}
    ws, hs = [s[0] for s in sizes], [s[1] for s in sizes]
    return {
        "min_w": min(ws),
        "max_w": max(ws),
        "mean_w": round(sum(ws) / len(ws), 1),
        "min_h": min(hs),
        "max_h": max(hs),
        "mean_h": round(sum(hs) / len(hs), 1),
    }


def write_dataset_report(report: dict, json_path: str, md_path: str) -> None:
    """Write the report as JSON (for machines) and Markdown (for people)."""
    Path(json_path).parent.mkdir(parents=True, exist_ok=True)
    Path(md_path).parent.mkdir(parents=True, exist_ok=True)
    Path(json_path).write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    Path(md_path).write_text(_markdown(report), encoding="utf-8")


def _markdown(report: dict) -> str:
    t = report["totals"]
    out = [
        "# Dataset report",
        "",
        f"- data.yaml: `{report['data_yaml']}`",
        f"- classes ({report['nc']}): {', '.join(report['names'])}",
        f"- images: {t['images']}, bad: {t['bad_images']} ({t['bad_fraction']:.1%})",
        "",
        "| split | images | labelled | backgrounds | boxes | bad images "
        "| size w (min/mean/max) | size h (min/mean/max) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for split, s in report["splits"].items():
        z = s["image_size"]
        out.append(
            f"| {split} | {s['images']} | {s['labelled']} | {s['backgrounds']} | {s['boxes']} | {s['bad_images']} "
            f"| {z['min_w']}/{z['mean_w']}/{z['max_w']} | {z['min_h']}/{z['mean_h']}/{z['max_h']} |"
        )
    stats = report["splits"].get("train", {}).get("box_short_side")
    if stats:
        out += [
            "",
            f"Training boxes: short side {stats['p5_of_long_side']:.1%} (5th percentile) and "
            f"{stats['median_of_long_side']:.1%} (median) of the image's long side. From "
            f"**{stats['min_img_for_95pct_at_stride']} px** on, 95 % of them span at least {MIN_STRIDE} px, one cell "
            "of yolov5's finest grid: a stage trained below that size shrinks more of them under it (docs/recipe.md).",
        ]
    out += ["", "## Class histogram", "", "| class | " + " | ".join(report["splits"]) + " |"]
    out.append("|---|" + "---|" * len(report["splits"]))
    for name in report["names"]:
        out.append(
            f"| {name} | " + " | ".join(str(s["class_histogram"][name]) for s in report["splits"].values()) + " |"
        )
    for title, items in (("Bad files", report["bad"]), ("Warnings", report["warnings"])):
        out += ["", f"## {title} ({len(items)})", ""]
        out += [f"- `{b['file']}`" + (f" line {b['line']}" if b["line"] else "") + f": {b['reason']}" for b in items]
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------------------------------------
# policy


def apply_policy(report: dict, on_bad_data: str, max_bad_fraction: float) -> set[str]:
    """Decide what to do with bad files. Returns the absolute image paths to leave out of the working copy (skip);
    raises DatasetError when the policy is fail and anything is bad, or when too much is bad under any policy."""
    if on_bad_data not in ("skip", "fail"):
        raise DatasetError(f"dataset_checks.on_bad_data is '{on_bad_data}'. Fix: set it to skip or fail.")
    bad_images = {b["image"] for b in report["bad"]}
    t = report["totals"]
    if not bad_images:
        return set()
    first = "\n".join(
        f"  {b['file']}" + (f":{b['line']}" if b["line"] else "") + f": {b['reason']}" for b in report["bad"][:10]
    )
    more = f"\n  ... and {len(report['bad']) - 10} more (see the dataset report)" if len(report["bad"]) > 10 else ""
    if t["bad_fraction"] > max_bad_fraction:
        raise DatasetError(
            f"{t['bad_images']} of {t['images']} images ({t['bad_fraction']:.1%}) are bad, more than "
            f"dataset_checks.max_bad_fraction={max_bad_fraction}. First problems:\n{first}{more}\n"
            "Fix: repair those files in your dataset, or raise dataset_checks.max_bad_fraction."
        )
    if on_bad_data == "fail":
        raise DatasetError(
            f"{t['bad_images']} bad images and dataset_checks.on_bad_data is fail. First problems:\n{first}{more}\n"
            "Fix: repair those files, or set dataset_checks.on_bad_data: skip to train without them."
        )
    for split, s in report["splits"].items():
        if s["bad_images"] >= s["images"]:
            raise DatasetError(f"every image of split `{split}` is bad. Fix: repair the files listed in the report.")
    return bad_images
