"""The image store: decoded once per run by cache_dataset, every stage's RAM cache served from it.

The yolov5 parts run in a subprocess (yolov5 keeps global state); the last test runs a real stage and reads its
timing.json: its set-up decoded no image."""

import json
import os
import subprocess
import sys
import textwrap

import cv2
import pytest
from dataset_testing import make_dataset
from stage_specs import small_stage_spec

from stagedyolo.dataset.cache import cache_dataset, staged_images
from stagedyolo.dataset.image_store import INDEX, STORE_DIR, build_store, open_store, store_path
from stagedyolo.dataset.staging import stage_dataset
from stagedyolo.dataset.validate import validate_dataset
from stagedyolo.demo import TARGET_CLASSES, DemoSpec, write_demo_dataset
from stagedyolo.stage import run_stage
from stagedyolo.stage_plan import build_plan


@pytest.fixture
def staged(tmp_path):
    """A staged copy of a 12 + 4 image demo set of 160 px images (a stage at 128 px shrinks them)."""
    src = write_demo_dataset(tmp_path / "src", DemoSpec(TARGET_CLASSES, 12, 4))
    stage_dataset(str(src), validate_dataset(str(src)), str(tmp_path / "cache"), exclude=set())
    return tmp_path / "cache" / "data.yaml"


def decide(staged, tmp_path, sizes, val_sizes=None):
    """cache_dataset in ram mode with stores for ``sizes`` (train and val, unless ``val_sizes`` are given)."""
    store_sizes = {"train": sizes, "val": sizes if val_sizes is None else val_sizes} if sizes else {}
    return cache_dataset(
        str(staged),
        str(tmp_path / "cache.json"),
        "ram",
        0.3,
        max(sizes or [128]),
        log=lambda *_: None,
        store_sizes=store_sizes,
    )


def test_cache_dataset_decodes_once_into_the_working_copy_and_keeps_an_up_to_date_store(staged, tmp_path):
    src_before = sorted(p.name for p in (tmp_path / "src").rglob("*"))
    d = decide(staged, tmp_path, [128, 160, 100])
    store = d["store"]
    assert d["mode"] == "ram" and store["root"] == str(tmp_path / "cache")
    assert store["sizes"] == {"train": [128, 160], "val": [128, 160]}  # 100 is trained at 128 (stride 32)
    assert store["decoded"] == 16
    assert store_path(store["root"], 128, True).is_dir() and store_path(store["root"], 160, False).is_dir()
    assert sorted(p.name for p in (tmp_path / "src").rglob("*")) == src_before  # the user's dataset untouched
    assert decide(staged, tmp_path, [128, 160])["store"]["decoded"] == 0  # a second run reuses it
    assert decide(staged, tmp_path, [])["store"]["root"] is None  # cache.prebuild_ram: false


def test_each_split_is_stored_only_at_the_sizes_its_loaders_load_it_at(staged, tmp_path):
    """Stages train at 128 and 160 and all validate at the 160-px target: no val store at 128."""
    store = decide(staged, tmp_path, [128, 160], val_sizes=[160])["store"]
    assert sorted(p.name for p in (tmp_path / "cache" / STORE_DIR).iterdir()) == ["128-train", "160-train", "160-val"]
    assert store["sizes"] == {"train": [128, 160], "val": [160]}


def test_store_too_big_for_the_disk_is_not_built(staged, tmp_path, monkeypatch):
    import stagedyolo.dataset.cache as cache

    real = cache.decide_cache_mode
    monkeypatch.setattr(cache, "decide_cache_mode", lambda *a, **k: {**real(*a, **k), "disk_budget_bytes": 10})
    store = decide(staged, tmp_path, [128])["store"]
    assert store["root"] is None and "free-disk budget" in store["reason"]


def test_stores_of_sizes_no_stage_uses_are_deleted(staged, tmp_path):
    store = decide(staged, tmp_path, [128, 160])["store"]
    assert store_path(store["root"], 160, True).is_dir()
    again = decide(staged, tmp_path, [128])["store"]  # the 160 px stage was dropped from the config
    assert sorted(again["removed"]) == ["160-train", "160-val"] and again["decoded"] == 0
    assert sorted(p.name for p in (tmp_path / "cache" / STORE_DIR).iterdir()) == ["128-train", "128-val"]
    d = cache_dataset(str(staged), str(tmp_path / "cache.json"), "none", 0.3, 128, log=lambda *_: None)
    assert sorted(d["stores_removed"]) == ["128-train", "128-val"]  # no stage reads a store without the ram mode
    assert not list((tmp_path / "cache" / STORE_DIR).iterdir())


def test_a_failed_build_leaves_no_temporary_blob(staged, tmp_path, monkeypatch):
    import stagedyolo.dataset.image_store as image_store

    calls, real_imread = [], cv2.imread

    def imread_failing_late(path):
        calls.append(path)
        if len(calls) == 5:
            raise MemoryError("failed half way")
        return real_imread(path)

    monkeypatch.setattr(image_store.cv2, "imread", imread_failing_late)
    with pytest.raises(MemoryError):
        decide(staged, tmp_path, [128])
    assert len(calls) == 5
    assert [p.name for p in (tmp_path / "cache" / STORE_DIR).rglob("*") if p.is_file()] == []


def test_a_kill_between_blob_and_index_never_pairs_a_new_blob_with_the_old_index(tmp_path, monkeypatch):
    """The image set changes but the blob's size does not (one image swapped for another of the same size). A kill
    after the new blob is in place and before its index used to leave the old index, offsets and all, accepted."""
    import stagedyolo.dataset.image_store as image_store

    src = make_dataset(tmp_path / "src", n_train=3, n_val=1)
    stage_dataset(str(src), validate_dataset(str(src)), str(tmp_path / "cache"), exclude=set())
    train = staged_images(str(tmp_path / "cache" / "data.yaml"))["train"]
    build_store(tmp_path / "cache", {"train": train[:2]}, {"train": [64]})
    real_replace = os.replace

    def killed_before_the_index(src_path, dst_path):
        if str(dst_path).endswith(INDEX):
            raise KeyboardInterrupt  # the kill
        real_replace(src_path, dst_path)

    monkeypatch.setattr(image_store.os, "replace", killed_before_the_index)
    with pytest.raises(KeyboardInterrupt):
        build_store(tmp_path / "cache", {"train": train[1:]}, {"train": [64]})
    monkeypatch.undo()
    _, index = open_store(tmp_path / "cache", 64, True)
    assert index is None or sorted(index) == train[1:]


YOLOV5_LOADERS = textwrap.dedent("""
    import json, sys
    import numpy as np
    from stagedyolo.dataset.image_store import serve_ram_cache
    from yolov5.utils.dataloaders import LoadImagesAndLabels

    root, train, val = sys.argv[1], sys.argv[2], sys.argv[3]
    def load(path, augment):
        return LoadImagesAndLabels(path, 128, 4, augment=augment, rect=not augment, cache_images="ram", hyp=None)
    own = [load(train, True), load(val, False)]          # yolov5 decodes every image, as each stage used to
    records = []
    serve_ram_cache(root, records)
    served = [load(train, True), load(val, False)]
    same = all(np.array_equal(a, b) for o, s in zip(own, served) for a, b in zip(o.ims, s.ims))
    hw = all(o.im_hw == s.im_hw and o.im_hw0 == s.im_hw0 for o, s in zip(own, served))
    print(json.dumps({"same": same, "hw": hw, "records": records}))
""")


def run_loaders(staged):
    images = staged_images(str(staged))
    train, val = (os.path.dirname(images[s][0]) for s in ("train", "val"))
    out = subprocess.run(
        [sys.executable, "-c", YOLOV5_LOADERS, str(staged.parent), train, val],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_yolov5_ram_cache_served_from_the_store_is_pixel_identical_and_decodes_nothing(staged, tmp_path):
    decide(staged, tmp_path, [128])
    got = run_loaders(staged)
    assert got["same"] and got["hw"]  # INTER_LINEAR for train, INTER_AREA for the shrunk val images, as yolov5
    assert [(r["split"], r["source"], r["images"], r["decoded"]) for r in got["records"]] == [
        ("train", "prebuilt", 12, 0),
        ("val", "prebuilt", 4, 0),
    ]


def test_an_image_changed_after_the_store_was_built_is_decoded_in_the_stage(staged, tmp_path):
    decide(staged, tmp_path, [128])
    changed = staged_images(str(staged))["train"][3]
    os.utime(changed, ns=(1, 1))  # a different mtime: the stored copy may be stale
    got = run_loaders(staged)
    assert got["same"]
    assert [(r["split"], r["decoded"]) for r in got["records"]] == [("train", 1), ("val", 0)]


SPEC = small_stage_spec(hyp={"mosaic": 0.0}, cache="ram", nosave=True)


def test_a_stage_set_up_does_not_rebuild_the_cache(staged, tmp_path):
    """Real engine: timing.json's set-up detail says the RAM cache came from the store, with no image decoded."""
    decision = decide(staged, tmp_path, [64])
    plan = build_plan(
        SPEC,
        stage="s",
        data=str(staged),
        weights=None,
        cfg="yolov5n.yaml",
        cache_mode="ram",
        threads=1,
        work_dir=tmp_path / "work" / "s",
        image_store=decision["store"]["root"],
    )
    run_stage(plan, stage_dir=tmp_path / "s", attempt=1, log_path=tmp_path / "s.log", engine_home=tmp_path)
    sd = json.loads((tmp_path / "s" / "timing.json").read_text())["setup_detail"]
    assert sd["cache_source"] == "prebuilt" and sd["cache_images_decoded"] == 0, sd
    assert [(r["split"], r["from_store"]) for r in sd["cache_loaders"]] == [("train", 12), ("val", 4)]
    assert "RAM image cache: prebuilt" in (tmp_path / "s" / "timing.md").read_text()
