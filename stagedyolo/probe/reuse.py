"""Reusing a probe's measurements across runs while machine, dataset, model and settings are unchanged.

The probe costs seconds to a minute; a second run of the same pipeline (a new `run:` name, a changed epoch count
or learning rate, a cleaned results folder) would measure the same thing again. Its tuning.json is kept under
`<results_dir>/probe_cache/<key>.json`, where the key hashes everything a measurement depends on: the machine (host,
CPU model, cores this process may use, torch build, visible GPUs, each GPU's model and memory, whether CUDA is
usable), the measured images (names, sizes, labels), the model (the weights file's bytes, the cfg file's text), and
the request (candidates, stage settings, budgets). Anything else changed, and the key differs: the probe measures
again. `probe.reuse: false` always measures. A measurement taken while the machine was busy is not kept: its figures
are partly the other work's.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from pathlib import Path

from stagedyolo.dataset.validate import img2label_path
from stagedyolo.envcheck import nvml_facts, package_version
from stagedyolo.jsonio import read_json, write_json
from stagedyolo.probe.steady import unpaid
from stagedyolo.stage_plan import available_cores

# Bump when the probe measures differently: results of an older probe are not reused.
PROBE_VERSION = 6  # 6: the candidates timed at the size most of the training runs at (rule.candidate_img)
# Request keys that differ between runs of the same thing: this run's files (replaced by fingerprints), its deadline
# and the planned training that may lengthen it (the budget setting itself is in the key).
PER_RUN_KEYS = (
    "data_list",
    "image_store",
    "weights",
    "out",
    "deadline_unix",
    "planned_train_images",
    "planned_training_s",
)


def reuse_key(request: dict, weights: list[str]) -> str:
    parts = {
        "probe_version": PROBE_VERSION,
        "machine": machine_identity(),
        "request": {k: v for k, v in request.items() if k not in PER_RUN_KEYS},
        "store": bool(request.get("image_store")),
        "images": _images_fingerprint(Path(request["data_list"])),
        "weights": _file_digest(Path(weights[0])) if weights else None,
        "cfg": _cfg_fingerprint(request.get("cfg")),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:20]


def machine_identity() -> dict:
    """The machine, with its GPUs as the driver lists them (model, memory) and whether CUDA is usable now: a probe
    taken while it was not (a driver update waiting for a reboot, a GPU being reset) measured on the CPU, and its
    `amp: false` must not reach the GPU stages of a later run. torch is imported (seconds) only where the driver
    lists a GPU; without one CUDA cannot be usable (NVML is NVIDIA's: a ROCm build's GPUs are not told apart here)."""
    gpus = [
        {"name": gpu["name"], "total_memory_bytes": gpu["total_memory_bytes"]} for gpu in nvml_facts()["gpus"] or []
    ]
    return {
        "host": platform.node(),
        "cpu": _cpu_model(),
        "cores": available_cores(),
        "torch": package_version("torch"),
        "yolov5": package_version("yolov5"),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "gpus": gpus,
        "cuda_usable": _cuda_usable() if gpus else False,
    }


def _cuda_usable() -> bool:
    import torch

    return torch.cuda.is_available()


def read_reusable(reuse_dir: str | Path, key: str) -> dict | None:
    try:
        return read_json(Path(reuse_dir) / f"{key}.json")
    except (OSError, ValueError):
        return None


def keep_for_reuse(reuse_dir: str | Path, key: str, tuning: dict, *, load: tuple, log_path: str) -> dict:
    """Keep a fresh measurement for later runs, unless it was taken under load; best effort: the cache is a saving,
    so a failed write (a full disk, a read-only results folder) is logged and the probe goes on. ``load``: the
    os.getloadavg() at the measurement's start and end. Returns what happened, for tuning.json."""
    path = Path(reuse_dir) / f"{key}.json"
    reason = busy_machine(load) or unmeasured(tuning)
    if reason is None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_json(path, tuning)
            return {"kept": True, "file": str(path)}
        except OSError as error:
            reason = f"writing {path} failed ({type(error).__name__}: {error})"
    with open(log_path, "a") as log:
        log.write(f"probe: measurement not kept for reuse: {reason}\n")
    return {"kept": False, "reason": reason}


def unmeasured(tuning: dict) -> str | None:
    """Why a probe that left a part unmeasured (tuning.json payoff) is not kept: a later run whose training is longer
    (the reuse key leaves the planned training out) must measure it instead of reusing the gap."""
    parts = [part for part in ("candidates", "stage_loops") if unpaid(tuning.get("payoff"), part)]
    if parts:
        return f"not all measured ({', '.join(parts)} did not pay): a later, longer training measures again"
    return None


def busy_machine(load: tuple) -> str | None:
    """Why a measurement's figures may be partly other work's: the 1-minute load average above the machine's core
    count (the load average counts the whole machine) when it started or ended; None when it was not."""
    cores = os.cpu_count() or 1
    busy = [f"{when} {average[0]:.1f}" for when, average in zip(("start", "end"), load) if average[0] > cores]
    if not busy:
        return None
    return (
        f"measured under load (1-minute load average at {' and '.join(busy)}, above the machine's {cores} "
        "cores): a later run measures again"
    )


def _images_fingerprint(list_path: Path) -> str:
    """Each listed image's name and size, and its label file's text: the working copy's paths differ per run."""
    digest = hashlib.sha256()
    for line in filter(None, list_path.read_text().splitlines()):  # one path a line: a path may hold spaces
        image = Path(line)
        label = Path(img2label_path(line))
        digest.update(f"{image.name}:{image.stat().st_size}:".encode())
        digest.update(label.read_bytes() if label.is_file() else b"-")
    return digest.hexdigest()


def _cfg_fingerprint(cfg: str | None) -> str | None:
    """A model yaml of the user's by its text (edited under the same name, it is another model); one shipped with
    yolov5 by its name (the yolov5 version is in the machine's identity)."""
    return _file_digest(Path(cfg)) if cfg and Path(cfg).is_file() else cfg


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
