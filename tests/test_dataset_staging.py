"""stage_dataset: a private, incremental working copy that never touches the source."""

import errno
import os
import re
import stat
import subprocess

import pytest
import yaml
from dataset_testing import jpeg_without_eoi, make_dataset, tree_sha256, write_image
from PIL import Image, ImageOps

from stagedyolo.dataset.cache import prebuild_disk_cache
from stagedyolo.dataset.fingerprint import source_fingerprint
from stagedyolo.dataset.staging import stage_dataset
from stagedyolo.dataset.validate import DatasetError, apply_policy, img2label_path, validate_dataset


@pytest.fixture
def ds(tmp_path):
    return make_dataset(tmp_path / "src")


def stage(ds, cache, policy="skip", **kw):
    report = validate_dataset(str(ds))
    return stage_dataset(str(ds), report, str(cache), apply_policy(report, policy, 0.5), **kw)


def test_layout_yaml_and_labels_follow_yolov5(ds, tmp_path):
    cache = tmp_path / "cache"
    s = stage(ds, cache)
    data = yaml.safe_load((cache / "data.yaml").read_text())
    assert data["train"] == str(cache / "train" / "images") and data["val"] == str(cache / "val" / "images")
    assert data["nc"] == 2 and data["names"] == {0: "cat", 1: "dog"}
    staged = sorted((cache / "train" / "images").glob("*.jpg"))
    assert len(staged) == 6 and s["images"] == {"train": 6, "val": 2}
    # YOLOv5 derives each label path from the staged image path; the background image has none
    assert sum(os.path.isfile(img2label_path(str(p))) for p in staged) == 5
    assert (s["linked"], s["copied"]) == (8, 7)  # same filesystem: images linked, labels always copied


def test_restaging_after_one_image_changed_copies_one_file(ds, tmp_path):
    cache = tmp_path / "cache"
    stage(ds, cache, hardlinks=False)
    prebuild_disk_cache(str(cache / "data.yaml"))
    (cache / "train" / "labels.cache").write_bytes(b"yolov5 label cache")  # as YOLOv5 would leave it
    changed = ds.parent / "images" / "train" / "train_003.jpg"
    write_image(changed, seed=99)
    st = os.stat(changed)
    os.utime(changed, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # coarse-mtime filesystems

    s = stage(ds, cache, hardlinks=False)
    assert (s["copied"], s["linked"], s["unchanged"], s["removed"]) == (1, 0, 14, 0)
    assert (cache / "train" / "images" / "train_003.jpg").read_bytes() == changed.read_bytes()
    assert not (cache / "train" / "images" / "train_003.npy").exists()  # its disk cache is stale: gone
    assert (cache / "train" / "images" / "train_004.npy").exists()  # the others are kept
    assert not (cache / "train" / "labels.cache").exists() and s["label_caches_invalidated"] == 1


def test_relinking_a_changed_image_does_not_write_into_the_source(ds, tmp_path):
    cache = tmp_path / "cache"
    stage(ds, cache)
    src = ds.parent / "images" / "train" / "train_003.jpg"
    src.unlink()
    write_image(src, seed=42)  # a new file (new inode) in place of the old one
    before = tree_sha256(ds.parent)
    s = stage(ds, cache)
    assert (s["linked"], s["copied"]) == (1, 0)
    assert tree_sha256(ds.parent) == before
    assert os.stat(cache / "train" / "images" / "train_003.jpg").st_ino == os.stat(src).st_ino


def test_removed_source_files_are_dropped(ds, tmp_path):
    cache = tmp_path / "cache"
    stage(ds, cache)
    prebuild_disk_cache(str(cache / "data.yaml"))
    (ds.parent / "images" / "train" / "train_000.jpg").unlink()
    (ds.parent / "labels" / "train" / "train_000.txt").unlink()
    s = stage(ds, cache)
    assert s["removed"] == 2 and s["npy_invalidated"] == 1
    assert not list((cache / "train").rglob("train_000.*"))


def test_source_unchanged_after_validate_stage_prebuild_and_yolov5_restore(ds, tmp_path):
    jpeg_without_eoi(ds.parent / "images" / "train" / "train_001.jpg")
    before = tree_sha256(ds.parent)
    cache = tmp_path / "cache"
    report = validate_dataset(str(ds))
    s = stage_dataset(str(ds), report, str(cache), exclude=set())  # not even excluded: must be copied, not linked
    prebuild_disk_cache(str(cache / "data.yaml"))
    staged = cache / "train" / "images" / "train_001.jpg"
    assert os.stat(staged).st_ino != os.stat(ds.parent / "images" / "train" / "train_001.jpg").st_ino
    assert s["copied"] == 7 + 1
    # what YOLOv5's verify_image_label does to such a file, in place, on the staged copy
    ImageOps.exif_transpose(Image.open(staged)).save(staged, "JPEG", subsampling=0, quality=100)
    assert tree_sha256(ds.parent) == before


def test_read_only_source_stages_fine(ds, tmp_path):
    before = tree_sha256(ds.parent)
    subprocess.run(["chmod", "-R", "a-w", str(ds.parent)], check=True)
    try:
        assert not os.stat(ds).st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)
        s = stage(ds, tmp_path / "cache")
        prebuild_disk_cache(str(tmp_path / "cache" / "data.yaml"))
        assert s["images"] == {"train": 6, "val": 2}
    finally:
        subprocess.run(["chmod", "-R", "u+w", str(ds.parent)], check=True)
    assert tree_sha256(ds.parent) == before


def test_link_failure_falls_back_to_copy(ds, tmp_path, monkeypatch):
    def no_link(*a, **k):
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", no_link)
    s = stage(ds, tmp_path / "cache")
    assert (s["linked"], s["copied"]) == (0, 15)


def test_excluded_files_are_not_staged(ds, tmp_path):
    jpeg_without_eoi(ds.parent / "images" / "train" / "train_001.jpg")
    s = stage(ds, tmp_path / "cache")
    assert s["excluded"] == 1 and s["images"]["train"] == 5
    assert not (tmp_path / "cache" / "train" / "images" / "train_001.jpg").exists()


def test_val_equal_to_train_reuses_the_copy(ds, tmp_path):
    ds.write_text(ds.read_text().replace("val: images/val", "val: images/train"))
    s = stage(ds, tmp_path / "cache")
    data = yaml.safe_load((tmp_path / "cache" / "data.yaml").read_text())
    assert data["val"] == data["train"] and not (tmp_path / "cache" / "val").exists()
    assert s["linked"] == 6


def test_cache_dir_inside_the_dataset_is_refused(ds):
    with pytest.raises(DatasetError, match="overlaps"):
        stage(ds, ds.parent / "images" / "train" / "cache")


def test_jpeg_that_lost_its_end_marker_after_validation_is_copied_not_linked(ds, tmp_path):
    report = validate_dataset(str(ds))  # clean at validation time ...
    victim = ds.parent / "images" / "train" / "train_002.jpg"
    jpeg_without_eoi(victim)  # ... changed before staging: the stale report must not be trusted for linking
    stage_dataset(str(ds), report, str(tmp_path / "cache"), exclude=set())
    assert os.stat(tmp_path / "cache" / "train" / "images" / "train_002.jpg").st_ino != os.stat(victim).st_ino
    assert (
        os.stat(tmp_path / "cache" / "train" / "images" / "train_003.jpg").st_ino
        == os.stat(ds.parent / "images" / "train" / "train_003.jpg").st_ino
    )


def test_prepare_and_cache_rules_end_to_end(ds, tmp_path):
    from stagedyolo.dataset import cache_dataset, prepare_dataset

    jpeg_without_eoi(ds.parent / "images" / "train" / "train_001.jpg")
    before = tree_sha256(ds.parent)
    run = tmp_path / "run"
    stats = prepare_dataset(
        str(ds),
        str(run / "cache"),
        str(run / "data" / "data.yaml"),
        str(run / "data" / "r.json"),
        str(run / "data" / "r.md"),
        "skip",
        0.2,
        log_path=str(run / "log.txt"),
        log=lambda m: None,
    )
    assert stats["images"] == {"train": 5, "val": 2}
    assert "skipped: " in (run / "log.txt").read_text() and "train_001.jpg" in (run / "log.txt").read_text()
    decision = cache_dataset(
        str(run / "data" / "data.yaml"), str(run / "data" / "cache.json"), "disk", 0.3, 128, log=lambda m: None
    )
    assert decision["mode"] == "disk" and decision["prebuild"]["written"] == 7
    assert len(list((run / "cache").rglob("*.npy"))) == 7
    assert tree_sha256(ds.parent) == before


def test_prepare_fails_by_policy_and_keeps_the_report_in_the_log(ds, tmp_path):
    from stagedyolo.dataset import prepare_dataset

    jpeg_without_eoi(ds.parent / "images" / "train" / "train_001.jpg")
    with pytest.raises(DatasetError, match="on_bad_data is fail"):
        prepare_dataset(
            str(ds),
            str(tmp_path / "cache"),
            str(tmp_path / "d.yaml"),
            str(tmp_path / "r.json"),
            str(tmp_path / "r.md"),
            "fail",
            0.5,
            log_path=str(tmp_path / "log.txt"),
            log=lambda m: None,
        )
    assert "corrupt JPEG (truncated)" in (tmp_path / "log.txt").read_text()
    assert not (tmp_path / "cache").exists()


def test_a_test_split_is_staged_and_named_in_the_working_data_yaml(tmp_path):
    from stagedyolo.demo import TARGET_CLASSES, DemoSpec, write_demo_dataset

    source = write_demo_dataset(tmp_path / "src", DemoSpec(TARGET_CLASSES, 6, 3, 4))
    before = tree_sha256(source.parent)
    cache = tmp_path / "cache"
    s = stage(source, cache)
    data = yaml.safe_load((cache / "data.yaml").read_text())
    assert data["test"] == str(cache / "test" / "images") and s["images"] == {"train": 6, "val": 3, "test": 4}
    staged = sorted((cache / "test" / "images").glob("*.jpg"))
    assert [p.name for p in staged] == [f"test_{i:04d}.jpg" for i in range(4)]
    assert all(os.path.isfile(img2label_path(str(p))) for p in staged)
    assert tree_sha256(source.parent) == before


def test_the_source_fingerprint_follows_every_image_and_label_edit(ds):
    """prepare_dataset's only input file is data.yaml; the fingerprint param is what makes Snakemake re-stage."""
    first = source_fingerprint(str(ds))
    assert source_fingerprint(str(ds)) == first  # an unchanged tree: the same value, so nothing is replanned
    label = ds.parent / "labels" / "train" / "train_002.txt"
    label.write_text(label.read_text().replace("0.5 0.5", "0.4 0.5"))  # a fixed box: same size, new mtime
    st = os.stat(label)
    os.utime(label, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # coarse-mtime filesystems
    second = source_fingerprint(str(ds))
    assert second != first
    (ds.parent / "labels" / "train" / "train_005.txt").write_text("1 0.5 0.5 0.2 0.2\n")  # the background image
    third = source_fingerprint(str(ds))
    assert third != second
    write_image(ds.parent / "images" / "val" / "val_002.jpg", seed=7)  # a new image
    assert source_fingerprint(str(ds)) not in (first, second, third)
    assert source_fingerprint(str(ds.parent / "missing.yaml")).startswith("unreadable")


def test_the_prepare_rule_reruns_on_the_fingerprint_and_the_demo_needs_no_data():
    from snakemake_runner import REPO

    rule = (REPO / "workflow" / "rules" / "dataset.smk").read_text()
    assert "source_fingerprint=get_source_fingerprint()," in rule.split("rule cache_dataset")[0]
    common = (REPO / "workflow" / "rules" / "common.smk").read_text()
    helper = re.search(r"^def get_source_fingerprint\(\):\n(?:(?:    .*)?\n)+", common, flags=re.M).group(0)
    for dataset, expected in (("demo", "demo"), (str(REPO / "missing" / "data.yaml"), "unreadable: DatasetError")):
        namespace = {"config": {"dataset": dataset}}
        exec(helper, namespace)  # the helper as the workflow runs it, on a config with no dataset on disk
        assert namespace["get_source_fingerprint"]() == expected
