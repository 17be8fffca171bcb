"""decide_cache_mode and prebuild_disk_cache; the last test asks real YOLOv5 to use the prebuilt .npy files."""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import cv2
import numpy as np
import pytest
from dataset_testing import make_dataset, tree_sha256, write_image

from stagedyolo.dataset.cache import decide_cache_mode, prebuild_disk_cache
from stagedyolo.dataset.staging import stage_dataset
from stagedyolo.dataset.validate import DatasetError, validate_dataset

GIB = 1 << 30


@pytest.fixture
def staged(tmp_path):
    """(source data.yaml, staged data.yaml) for 6 train + 2 val images of 64x64."""
    src = make_dataset(tmp_path / "src")
    stage_dataset(str(src), validate_dataset(str(src)), str(tmp_path / "cache"), exclude=set())
    return src, tmp_path / "cache" / "data.yaml"


def test_auto_estimates_like_yolov5_and_picks_ram_when_it_fits(staged):
    d = decide_cache_mode("auto", str(staged[1]), max_imgsz=128, available_ram=64 * GIB, free_disk=GIB)
    assert d["mode"] == "ram" and d["images"] == {"train": 6, "val": 2}
    assert d["ram_needed_bytes"] == 8 * 128 * 128 * 3  # 64 px images are UPscaled to the long side 128, like yolov5
    assert d["disk_needed_bytes"] == 8 * (64 * 64 * 3 + 128)  # full resolution .npy with header


def test_non_square_images_resize_by_the_long_side(tmp_path):
    src = make_dataset(tmp_path / "src", n_train=2, n_val=1)
    for p in (tmp_path / "src" / "images").rglob("*.jpg"):
        write_image(p, w=100, h=50)
    stage_dataset(str(src), validate_dataset(str(src)), str(tmp_path / "cache"), exclude=set())
    d = decide_cache_mode("auto", str(tmp_path / "cache" / "data.yaml"), 64, available_ram=GIB, free_disk=GIB)
    assert d["ram_needed_bytes"] == 3 * 64 * 32 * 3


def test_small_memory_budget_picks_disk(staged):
    d = decide_cache_mode("auto", str(staged[1]), 128, available_ram=400_000, safety_margin=0.3, free_disk=GIB)
    assert d["mode"] == "disk" and d["ram_budget_bytes"] == 280_000 and "RAM needed" in d["reason"]


def test_neither_fits_picks_none(staged):
    d = decide_cache_mode("auto", str(staged[1]), 128, available_ram=1000, free_disk=1000)
    assert d["mode"] == "none" and "neither fits" in d["reason"]


def test_explicit_mode_passes_through_with_a_warning_when_it_will_not_fit(staged):
    d = decide_cache_mode("ram", str(staged[1]), 128, available_ram=1000, free_disk=GIB)
    assert d["mode"] == "ram" and "silently" in d["warning"]
    assert decide_cache_mode("none", str(staged[1]), 128, available_ram=GIB)["mode"] == "none"
    with pytest.raises(ValueError):
        decide_cache_mode("fast", str(staged[1]), 128)


def test_prebuild_writes_what_cv2_reads_and_skips_fresh_files(staged):
    src, data = staged
    before = tree_sha256(src.parent)
    first = prebuild_disk_cache(str(data))
    assert first["written"] == 8 and first["up_to_date"] == 0
    for img in (data.parent / "train" / "images").glob("*.jpg"):
        np.testing.assert_array_equal(np.load(img.with_suffix(".npy")), cv2.imread(str(img)))
    assert prebuild_disk_cache(str(data))["up_to_date"] == 8
    assert tree_sha256(src.parent) == before
    assert not list(src.parent.rglob("*.npy"))


def test_prebuild_replaces_stale_and_removes_orphans(staged):
    _, data = staged
    prebuild_disk_cache(str(data))
    img = data.parent / "train" / "images" / "train_002.jpg"
    npy = img.with_suffix(".npy")
    old = os.stat(npy).st_mtime_ns
    os.utime(img, ns=(old + 10**9, old + 10**9))  # the image is newer than its .npy
    np.save(data.parent / "train" / "images" / "gone.npy", np.zeros(1))
    counts = prebuild_disk_cache(str(data))
    assert (counts["written"], counts["stale_replaced"], counts["orphans_removed"]) == (1, 1, 1)


def test_prebuild_rewrites_a_cache_file_truncated_by_a_kill(staged):
    _, data = staged
    prebuild_disk_cache(str(data))
    img = data.parent / "train" / "images" / "train_003.jpg"
    npy = img.with_suffix(".npy")
    npy.write_bytes(npy.read_bytes()[: npy.stat().st_size // 2])  # what a kill mid-np.save leaves behind
    counts = prebuild_disk_cache(str(data))
    assert (counts["written"], counts["stale_replaced"]) == (1, 1)
    np.testing.assert_array_equal(np.load(npy), cv2.imread(str(img)))


def test_prebuild_refuses_the_users_dataset(staged):
    src, _ = staged
    with pytest.raises(DatasetError, match="not a staged working copy"):
        prebuild_disk_cache(str(src))
    assert not list(src.parent.rglob("*.npy"))


YOLOV5_PROBE = textwrap.dedent("""
    import json, sys, numpy as np
    from yolov5.utils.dataloaders import LoadImagesAndLabels
    ds = LoadImagesAndLabels(sys.argv[1], img_size=64, cache_images="disk", workers=0)
    im, _, _ = ds.load_image(0)
    print(json.dumps({"npy": [str(p) for p in ds.npy_files], "first_is_marker": bool((im == 7).all())}))
""")


def test_yolov5_uses_the_prebuilt_npy_without_rewriting(staged, tmp_path):
    pytest.importorskip("yolov5")
    src, data = staged
    before = tree_sha256(src.parent)
    prebuild_disk_cache(str(data))
    images = data.parent / "train" / "images"
    npys = sorted(images.glob("*.npy"))
    # Mark the first one: if YOLOv5 loads our file (not a re-decode of the jpg), it returns the marker.
    np.save(npys[0], np.full_like(np.load(npys[0]), 7))
    mtimes = {p: os.stat(p).st_mtime_ns for p in npys}

    font_dir = tmp_path / "yolov5_config"
    font_dir.mkdir()
    import matplotlib

    shutil.copy(os.path.join(matplotlib.get_data_path(), "fonts", "ttf", "DejaVuSans.ttf"), font_dir / "Arial.ttf")
    env = dict(
        os.environ,
        YOLO_OFFLINE="1",
        YOLOV5_CONFIG_DIR=str(font_dir),
        YOLO_CONFIG_DIR=str(font_dir),
        TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD="1",
        ULTRALYTICS_SKIP_REQUIREMENTS_CHECKS="1",
        YOLO_AUTOINSTALL="false",
    )
    out = subprocess.run(
        [sys.executable, "-c", YOLOV5_PROBE, str(images)], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert sorted(result["npy"]) == [str(p) for p in npys]
    assert result["first_is_marker"]
    assert {p: os.stat(p).st_mtime_ns for p in npys} == mtimes
    assert tree_sha256(src.parent) == before
