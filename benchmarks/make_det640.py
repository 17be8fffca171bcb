"""A synthetic detection set at a realistic size, that nothing in stagedyolo was tuned for.

640x480 JPEGs (q90) of smooth random textures with sensor-like noise, 2-8 objects each from 3 shape classes
(box, disc, tri), 24-140 px across, random colours. Used by benchmarks/naive_vs_staged.py as the untuned dataset
(the demo's recipe, hyp and pretraining were all tuned on the demo's own 160-px PIL images, not on these).
The same generator (same seeds, same images) is the GPU kit's 640-px load.

Run:  python benchmarks/make_det640.py ROOT N_TRAIN N_VAL    (writes ROOT/{images,labels}/{train,val}, ROOT/data.yaml)
"""

from __future__ import annotations

import os
import sys
from multiprocessing import Pool

import cv2
import numpy as np

WIDTH, HEIGHT = 640, 480
CLASSES = ("box", "disc", "tri")


def draw_one(job: tuple[str, str, int]) -> None:
    root, split, index = job
    rng = np.random.default_rng(index * 7 + (0 if split == "train" else 10**6))
    img = rng.integers(0, 255, (HEIGHT // 8, WIDTH // 8, 3), dtype=np.uint8)
    img = cv2.resize(img, (WIDTH, HEIGHT), interpolation=cv2.INTER_CUBIC)
    img = cv2.GaussianBlur(img, (0, 0), 3)
    noise = rng.normal(0, 12, (HEIGHT, WIDTH, 3))
    img = np.clip(img.astype(np.float32) + noise, 0, 255).astype(np.uint8)
    lines = []
    for _ in range(rng.integers(2, 9)):
        cls, size = int(rng.integers(0, 3)), int(rng.integers(24, 140))
        x, y = int(rng.integers(size // 2, WIDTH - size // 2)), int(rng.integers(size // 2, HEIGHT - size // 2))
        colour = tuple(int(v) for v in rng.integers(0, 255, 3))
        if cls == 0:
            cv2.rectangle(img, (x - size // 2, y - size // 3), (x + size // 2, y + size // 3), colour, -1)
            box_w, box_h = size, 2 * (size // 3)
        elif cls == 1:
            cv2.circle(img, (x, y), size // 2, colour, -1)
            box_w, box_h = size, size
        else:
            points = np.array(
                [[x, y - size // 2], [x - size // 2, y + size // 2], [x + size // 2, y + size // 2]], np.int32
            )
            cv2.fillPoly(img, [points], colour)
            box_w, box_h = size, size
        lines.append(f"{cls} {x / WIDTH:.6f} {y / HEIGHT:.6f} {box_w / WIDTH:.6f} {box_h / HEIGHT:.6f}")
    cv2.imwrite(f"{root}/images/{split}/{index:05d}.jpg", img, [cv2.IMWRITE_JPEG_QUALITY, 90])
    with open(f"{root}/labels/{split}/{index:05d}.txt", "w") as handle:
        handle.write("\n".join(lines) + "\n")


def make_det640(root: str, n_train: int, n_val: int, processes: int | None = None) -> str:
    """Write the set under `root`; returns its data.yaml path. Deterministic: image i of a split is always the same."""
    return write_set(root, n_train, n_val, draw_one, CLASSES, processes)


def write_set(root: str, n_train: int, n_val: int, draw, classes: tuple, processes: int | None = None) -> str:
    """A generated YOLO set: ``draw((root, split, index))`` writes image and label i of a split, in a pool of
    processes; then data.yaml. Returns the data.yaml path."""
    root = os.path.abspath(root)
    for split in ("train", "val"):
        os.makedirs(f"{root}/images/{split}", exist_ok=True)
        os.makedirs(f"{root}/labels/{split}", exist_ok=True)
    jobs = [(root, "train", i) for i in range(n_train)] + [(root, "val", i) for i in range(n_val)]
    with Pool(processes or os.cpu_count()) as pool:
        pool.map(draw, jobs, chunksize=16)
    data_yaml = f"{root}/data.yaml"
    with open(data_yaml, "w") as handle:
        names = ", ".join(classes)
        handle.write(f"path: {root}\ntrain: images/train\nval: images/val\nnc: {len(classes)}\nnames: [{names}]\n")
    return data_yaml


if __name__ == "__main__":
    print("dataset", make_det640(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
