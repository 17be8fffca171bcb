"""The built-in demo: small, deterministic detection sets drawn with PIL. Nothing is downloaded.

Two separate sets, so the demo behaves like real transfer learning:
- `target`: the user's task (circles, squares, triangles on textured backgrounds).
- `pretrain`: a generic set with other shapes and textures, used only to make the demo's "pretrained"
  weights, as an official yolov5s.pt would be for a real user. Freezing the backbone then means what it
  means in real use: features learned elsewhere, kept while the head adapts.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml
from PIL import Image, ImageDraw

TARGET_CLASSES = ("circle", "square", "triangle")
PRETRAIN_CLASSES = ("ring", "cross", "diamond", "bar", "star")


@dataclass(frozen=True)
class DemoSpec:
    classes: tuple[str, ...]
    train_images: int
    val_images: int
    test_images: int = 0  # held out: scored once, by the evaluate_test rule, after the last stage
    image_size: int = 160
    max_objects: int = 6
    seed: int = 0


def write_demo_dataset(root: str | Path, spec: DemoSpec) -> Path:
    """Write `root/{images,labels}/{train,val[,test]}` and `root/data.yaml`; returns the data.yaml path. The test
    images are drawn after the others, so adding them leaves the train and val images as they were."""
    root = Path(root)
    rng = random.Random(spec.seed)
    splits = {"train": spec.train_images, "val": spec.val_images, "test": spec.test_images}
    for split, count in splits.items():
        if not count:
            continue
        (root / "images" / split).mkdir(parents=True, exist_ok=True)
        (root / "labels" / split).mkdir(parents=True, exist_ok=True)
        for i in range(count):
            image, boxes = _draw_image(rng, spec)
            stem = f"{split}_{i:04d}"
            image.save(root / "images" / split / f"{stem}.jpg", quality=90)
            lines = [f"{c} {x:.6f} {y:.6f} {w:.6f} {h:.6f}" for c, x, y, w, h in boxes]
            (root / "labels" / split / f"{stem}.txt").write_text("\n".join(lines) + "\n")
    data = {
        "path": str(root.resolve()),
        "train": "images/train",
        "val": "images/val",
        **({"test": "images/test"} if spec.test_images else {}),
        "nc": len(spec.classes),
        "names": list(spec.classes),
    }
    data_yaml = root / "data.yaml"
    data_yaml.write_text(yaml.safe_dump(data, sort_keys=False))
    return data_yaml


def _demo_specs(train_images: int, val_images: int, seed: int, test_images: int = 0) -> dict[str, DemoSpec]:
    """The two demo sets, {"target": spec, "pretrain": spec}; only the target set has a test split."""
    return {
        "target": DemoSpec(TARGET_CLASSES, train_images, val_images, test_images, seed=seed),
        "pretrain": DemoSpec(PRETRAIN_CLASSES, train_images, val_images, seed=seed + 1000),
    }


def write_demo(
    root: str | Path, train_images: int = 256, val_images: int = 64, seed: int = 0, test_images: int = 0
) -> dict:
    """Both demo sets under `root`; returns {"target": data.yaml, "pretrain": data.yaml}."""
    specs = _demo_specs(train_images, val_images, seed, test_images)
    return {name: write_demo_dataset(Path(root) / name, spec) for name, spec in specs.items()}


def _background(rng: random.Random, size: int) -> Image.Image:
    # Muted, smooth texture plus a few thin lines: clutter to tell shapes from, without drowning them.
    nrng = np.random.default_rng(rng.randrange(2**32))
    base = nrng.integers(90, 170, size=3)
    coarse = base + nrng.integers(-35, 36, size=(5, 5, 3))
    image = Image.fromarray(np.clip(coarse, 0, 255).astype(np.uint8)).resize((size, size), Image.BICUBIC)
    fine = nrng.normal(0, 8, size=(size, size, 3))
    image = Image.fromarray(np.clip(np.asarray(image, dtype=np.float32) + fine, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(image)
    for _ in range(rng.randint(0, 3)):
        xy = [rng.randrange(size) for _ in range(4)]
        draw.line(xy, fill=tuple(int(c) for c in base + nrng.integers(-60, 61, size=3)), width=1)
    return image


def _colour(rng: random.Random) -> tuple[int, int, int]:
    return tuple(rng.randint(0, 255) for _ in range(3))


def _draw_image(rng: random.Random, spec: DemoSpec):
    size = spec.image_size
    image = _background(rng, size)
    draw = ImageDraw.Draw(image)
    boxes, placed = [], []
    for _ in range(rng.randint(1, spec.max_objects)):
        side = rng.randint(size // 8, size // 3)
        for _attempt in range(20):  # keep objects apart, so every label is visible
            x0, y0 = rng.randint(0, size - side), rng.randint(0, size - side)
            box = (x0, y0, x0 + side, y0 + side)
            if all(_overlap(box, other) < 0.1 for other in placed):
                break
        else:
            continue
        cls = rng.randrange(len(spec.classes))
        bx0, by0, bx1, by1 = _draw_shape(draw, spec.classes[cls], box, _colour(rng))
        placed.append(box)
        boxes.append((cls, (bx0 + bx1) / 2 / size, (by0 + by1) / 2 / size, (bx1 - bx0) / size, (by1 - by0) / size))
    return image, boxes


def _overlap(a, b) -> float:
    w = max(0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0, min(a[3], b[3]) - max(a[1], b[1]))
    return w * h / min((a[2] - a[0]) * (a[3] - a[1]), (b[2] - b[0]) * (b[3] - b[1]))


def _draw_shape(draw: ImageDraw.ImageDraw, name: str, box, fill) -> tuple[float, float, float, float]:
    """Draw one shape inside `box`; returns the box it really covers (a bar is flatter than its square)."""
    x0, y0, x1, y1 = box
    cx, cy, r = (x0 + x1) / 2, (y0 + y1) / 2, (x1 - x0) / 2
    outline = (0, 0, 0) if sum(fill) > 380 else (255, 255, 255)
    if name == "circle":
        draw.ellipse(box, fill=fill, outline=outline, width=2)
    elif name == "square":
        draw.rectangle(box, fill=fill, outline=outline, width=2)
    elif name == "triangle":
        draw.polygon([(cx, y0), (x1, y1), (x0, y1)], fill=fill, outline=outline, width=2)
    elif name == "ring":
        draw.ellipse(box, outline=fill, width=max(3, int(r / 3)))
    elif name == "cross":
        t = r / 3
        draw.rectangle((cx - t, y0, cx + t, y1), fill=fill)
        draw.rectangle((x0, cy - t, x1, cy + t), fill=fill)
    elif name == "diamond":
        draw.polygon([(cx, y0), (x1, cy), (cx, y1), (x0, cy)], fill=fill, outline=outline, width=2)
    elif name == "bar":
        draw.rectangle((x0, cy - r / 4, x1, cy + r / 4), fill=fill, outline=outline, width=2)
        return x0, cy - r / 4, x1, cy + r / 4
    elif name == "star":
        points = []
        for k in range(10):
            radius = r if k % 2 == 0 else r * 0.45
            angle = -math.pi / 2 + k * math.pi / 5
            points.append((cx + radius * math.cos(angle), cy + radius * math.sin(angle)))
        draw.polygon(points, fill=fill, outline=outline)
    else:
        raise ValueError(f"unknown demo shape {name!r}")
    return box


def write_demo_for_rule(target_yaml: str, pretrain_yaml: str, settings: dict, log_path: str) -> None:
    """The demo_dataset rule: both sets, each where the rule's outputs say."""
    specs = _demo_specs(settings["train_images"], settings["val_images"], settings["seed"], settings["test_images"])
    written = [
        write_demo_dataset(Path(data_yaml).parent, spec)
        for data_yaml, spec in zip((target_yaml, pretrain_yaml), specs.values())
    ]
    Path(log_path).write_text("".join(f"wrote {path}\n" for path in written))


def pretrain_demo_weights(
    data_yaml: str,
    weights_out: str,
    *,
    settings: dict,
    cfg: str,
    stage_defaults: dict,
    device: str,
    threads: int,
    log_path: str,
) -> None:
    """The demo_pretrain rule: train `cfg` from scratch on the generic set; its last.pt plays the part of the
    official pretrained checkpoint a real user would download. Settings are the stage defaults, with the
    pretraining's own epochs, size, batch and optimizer, validated once at the end."""
    import shutil

    from stagedyolo.stage import run_stage
    from stagedyolo.stage_plan import build_plan

    out = Path(weights_out)
    spec = {
        **stage_defaults,
        **settings,
        "device": device,
        "freeze": 0,
        "cache": "ram",
        "val_period": settings["epochs"],
        "gpus": 1,
        "nosave": False,
    }
    plan = build_plan(
        spec,
        stage="pretrain",
        data=data_yaml,
        weights=None,
        cfg=cfg,
        cache_mode="ram",
        threads=threads,
        work_dir=out.parent / "work" / "pretrain",
    )
    run_stage(
        plan, stage_dir=out.parent / "pretrain_run", attempt=1, log_path=log_path, engine_home=out.parent / "engine"
    )
    shutil.copy2(out.parent / "pretrain_run" / "weights" / "last.pt", out)
