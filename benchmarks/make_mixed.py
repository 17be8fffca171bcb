"""A second untuned detection set, unlike both the demo and det640: nothing in stagedyolo was tuned on it.

JPEGs (q85) of mixed sizes and aspect ratios (480-960 px wide, landscape and portrait), on cluttered backgrounds
(smooth noise plus distractor strokes and outlines that belong to no class), with 0-7 objects from 5 classes (ring,
cross, star, ellipse, bar), 12-160 px across, random colours, objects allowed to overlap; about one image in ten
has no object at all (a background image, as real data sets have). benchmarks/naive_vs_staged.py trains on it at
320 px, a larger size than det's 160.

Run:  python benchmarks/make_mixed.py ROOT N_TRAIN N_VAL    (writes ROOT/{images,labels}/{train,val}, ROOT/data.yaml)
"""

from __future__ import annotations

import sys

import cv2
import numpy as np
from make_det640 import write_set

CLASSES = ("ring", "cross", "star", "ellipse", "bar")
SIZES = ((640, 480), (960, 720), (480, 640), (800, 600), (720, 960), (512, 512))  # width, height


def background(rng: np.random.Generator, width: int, height: int) -> np.ndarray:
    img = rng.integers(0, 255, (height // 16, width // 16, 3), dtype=np.uint8)
    img = cv2.GaussianBlur(cv2.resize(img, (width, height), interpolation=cv2.INTER_CUBIC), (0, 0), 5)
    for _ in range(rng.integers(4, 14)):  # distractors: strokes and thin outlines of no class
        colour = tuple(int(v) for v in rng.integers(0, 255, 3))
        p1 = (int(rng.integers(0, width)), int(rng.integers(0, height)))
        p2 = (int(rng.integers(0, width)), int(rng.integers(0, height)))
        if rng.random() < 0.6:
            cv2.line(img, p1, p2, colour, int(rng.integers(1, 4)))
        else:
            cv2.rectangle(img, p1, p2, colour, 1)
    noise = rng.normal(0, 10, img.shape)
    return np.clip(img.astype(np.float32) + noise, 0, 255).astype(np.uint8)


def draw_object(img: np.ndarray, cls: int, x: int, y: int, size: int, colour: tuple) -> tuple[int, int]:
    """Draw one object centred at (x, y); returns its box's width and height in pixels."""
    half = size // 2
    if cls == 0:  # ring
        cv2.circle(img, (x, y), half, colour, max(2, size // 6))
        return size, size
    if cls == 1:  # cross
        arm = max(2, size // 5)
        cv2.rectangle(img, (x - half, y - arm // 2), (x + half, y + arm // 2), colour, -1)
        cv2.rectangle(img, (x - arm // 2, y - half), (x + arm // 2, y + half), colour, -1)
        return size, size
    if cls == 2:  # star
        angles = np.pi / 2 + np.arange(10) * np.pi / 5
        radii = np.where(np.arange(10) % 2 == 0, half, half * 0.45)
        points = np.stack([x + radii * np.cos(angles), y - radii * np.sin(angles)], 1).astype(np.int32)
        cv2.fillPoly(img, [points], colour)
        xs, ys = points[:, 0], points[:, 1]
        return int(xs.max() - xs.min()), int(ys.max() - ys.min())
    if cls == 3:  # ellipse, twice as wide as high
        cv2.ellipse(img, (x, y), (half, max(2, half // 2)), 0, 0, 360, colour, -1)
        return size, 2 * max(2, half // 2)
    thickness = max(3, size // 7)  # bar, upright
    cv2.rectangle(img, (x - thickness // 2, y - half), (x + thickness // 2, y + half), colour, -1)
    return thickness, size


def draw_one(job: tuple[str, str, int]) -> None:
    root, split, index = job
    rng = np.random.default_rng(index * 13 + (5 if split == "train" else 10**6 + 5))
    width, height = SIZES[int(rng.integers(0, len(SIZES)))]
    img = background(rng, width, height)
    count = 0 if rng.random() < 0.1 else int(rng.integers(1, 8))
    lines = []
    for _ in range(count):
        cls, size = int(rng.integers(0, len(CLASSES))), int(rng.integers(12, 161))
        x = int(rng.integers(size // 2 + 1, width - size // 2 - 1))
        y = int(rng.integers(size // 2 + 1, height - size // 2 - 1))
        box_w, box_h = draw_object(img, cls, x, y, size, tuple(int(v) for v in rng.integers(0, 255, 3)))
        lines.append(f"{cls} {x / width:.6f} {y / height:.6f} {box_w / width:.6f} {box_h / height:.6f}")
    cv2.imwrite(f"{root}/images/{split}/{index:05d}.jpg", img, [cv2.IMWRITE_JPEG_QUALITY, 85])
    with open(f"{root}/labels/{split}/{index:05d}.txt", "w") as handle:
        handle.write("".join(line + "\n" for line in lines))


def make_mixed(root: str, n_train: int, n_val: int, processes: int | None = None) -> str:
    """Write the set under `root`; returns its data.yaml path. Deterministic: image i of a split is always the same."""
    return write_set(root, n_train, n_val, draw_one, CLASSES, processes)


if __name__ == "__main__":
    print("dataset", make_mixed(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
