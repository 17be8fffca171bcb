"""Reusing a probe's measurements across runs while machine, dataset, model and settings are unchanged.

The probe costs seconds to a minute; a second run of the same pipeline (a new `run:` name, a changed epoch count
or learning rate, a cleaned results folder) would measure the same thing again. Its tuning.json is kept under
`<results_dir>/probe_cache/<key>.json`, where the key hashes everything a measurement depends on: the machine (host,
CPU model, cores this process may use, torch build, visible GPUs), the measured images (names, sizes, labels), the
model (the weights file's bytes or the cfg), and the request (candidates, stage settings, budgets). Anything else
changed, and the key differs: the probe measures again. `probe.reuse: false` always measures.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from pathlib import Path

from stagedyolo.dataset.validate import img2label_path
from stagedyolo.engine.plan import available_cores
from stagedyolo.envcheck import package_version
from stagedyolo.jsonio import read_json, write_json

# Bump when the probe measures differently: results of an older probe are not reused.
PROBE_VERSION = 5
# Request keys that differ between runs of the same thing: this run's files (replaced by fingerprints), its deadline
# and the planned training that may lengthen it (the budget setting itself is in the key).
PER_RUN_KEYS = ("data_list", "image_store", "weights", "out", "deadline_unix", "planned_train_images")


def reuse_key(request: dict, weights: list[str]) -> str:
    parts = {
        "probe_version": PROBE_VERSION,
        "machine": machine_identity(),
        "request": {k: v for k, v in request.items() if k not in PER_RUN_KEYS},
        "store": bool(request.get("image_store")),
        "images": _images_fingerprint(Path(request["data_list"])),
        "weights": _file_digest(Path(weights[0])) if weights else None,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:20]


def machine_identity() -> dict:
    return {
        "host": platform.node(),
        "cpu": _cpu_model(),
        "cores": available_cores(),
        "torch": package_version("torch"),
        "yolov5": package_version("yolov5"),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }


def read_reusable(reuse_dir: str | Path, key: str) -> dict | None:
    path = Path(reuse_dir) / f"{key}.json"
    try:
        return read_json(path)
    except (OSError, ValueError):
        return None


def write_reusable(reuse_dir: str | Path, key: str, tuning: dict) -> None:
    Path(reuse_dir).mkdir(parents=True, exist_ok=True)
    write_json(Path(reuse_dir) / f"{key}.json", tuning)


def _images_fingerprint(list_path: Path) -> str:
    """Each listed image's name and size, and its label file's text: the working copy's paths differ per run."""
    digest = hashlib.sha256()
    for line in list_path.read_text().split():
        image = Path(line)
        label = Path(img2label_path(line))
        digest.update(f"{image.name}:{image.stat().st_size}:".encode())
        digest.update(label.read_bytes() if label.is_file() else b"-")
    return digest.hexdigest()


def _file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()
