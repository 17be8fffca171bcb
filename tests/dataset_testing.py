"""Tiny synthetic YOLOv5 datasets for tests (a helper module of the tests folder, imported by name: pyproject.toml
puts tests/ on pytest's pythonpath)."""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import numpy as np
from PIL import Image
from stage_specs import small_stage_spec


def write_image(path: Path, w: int = 64, h: int = 64, seed: int = 0, fmt: str | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(path, fmt)
    return path


def make_dataset(root: Path, n_train: int = 6, n_val: int = 2, size: int = 64, names=("cat", "dog")) -> Path:
    """root/images/{train,val}/*.jpg + root/labels/{train,val}/*.txt + root/data.yaml (relative paths).
    The last train image has no label file (a background image)."""
    for split, n in (("train", n_train), ("val", n_val)):
        for i in range(n):
            stem = f"{split}_{i:03d}"
            write_image(root / "images" / split / f"{stem}.jpg", size, size, seed=i + (1000 if split == "val" else 0))
            if split == "train" and i == n - 1:
                continue
            label = root / "labels" / split / f"{stem}.txt"
            label.parent.mkdir(parents=True, exist_ok=True)
            label.write_text(f"{i % len(names)} 0.5 0.5 0.25 0.25\n0 0.2 0.3 0.1 0.1\n")
    yaml_path = root / "data.yaml"
    yaml_path.write_text(
        "train: images/train\nval: images/val\nnames:\n" + "".join(f"  {i}: {n}\n" for i, n in enumerate(names))
    )
    return yaml_path


def jpeg_without_eoi(path: Path) -> Path:
    """A JPEG that decodes but does not end with FF D9 (trailing bytes after the image, as some cameras write):
    exactly the file YOLOv5 'restores' by rewriting it in place."""
    buf = io.BytesIO()
    Image.fromarray(np.full((64, 64, 3), 127, np.uint8)).save(buf, "JPEG")
    path.write_bytes(buf.getvalue() + b"\x00\x00garbage")
    return path


def truncate_file(path: Path, keep: float = 0.5) -> Path:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    return path


def tree_sha256(root: Path) -> dict[str, str]:
    """relative path -> sha256 for every file under root (to prove a source tree was not modified)."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


# A stage that is reliably data-loading bound on 2 shared cores when its images are large (e.g. 1024 px) and the
# model small (img 64): every batch decodes and heavily augments in the training process itself (workers 0, no cache).
HEAVY_AUGMENTATION = {"mosaic": 1.0, "mixup": 0.5, "degrees": 15.0, "scale": 0.9, "perspective": 0.0005}
LOADER_BOUND_SPEC = small_stage_spec(hyp=HEAVY_AUGMENTATION, nosave=True)
