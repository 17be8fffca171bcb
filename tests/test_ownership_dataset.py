"""The dataset rules write and delete only in the run's own marked folder of cache.dir.

cache.dir is "fast local scratch": /scratch/$USER holds the user's own arrays and caches, and other runs' copies."""

import os
import stat
import threading

import pytest
import yaml
from dataset_testing import make_dataset, tree_sha256

from stagedyolo.dataset import cache_dataset, prepare_dataset
from stagedyolo.dataset.cache import prebuild_disk_cache, staged_images
from stagedyolo.dataset.staging import stage_dataset
from stagedyolo.dataset.validate import DatasetError, validate_dataset
from stagedyolo.ownership import MARKER, TMP_PREFIX, locked, temp_path


def prepare(source, scratch, run):
    """The prepare_dataset rule for the run folder `run`, with cache.dir = scratch; returns the run's data.yaml."""
    data = run / "data" / "data.yaml"
    prepare_dataset(
        str(source),
        str(scratch),
        str(data),
        str(run / "data" / "r.json"),
        str(run / "data" / "r.md"),
        log=lambda *_: None,
    )
    return data


def copy_of(data_yaml):
    return yaml.safe_load(data_yaml.read_text())["path"]


@pytest.fixture
def scratch(tmp_path):
    """A scratch folder that already holds the user's own files, among them the names the pipeline used to sweep."""
    root = tmp_path / "scratch"
    for rel in ("mine.npy", "train/images/features.npy", "train/labels.cache", "val/old.cache", "deep/x/y.npy"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(b"the user's " + rel.encode())
    return root


def test_the_users_files_in_cache_dir_survive_staging_and_the_disk_cache(tmp_path, scratch):
    before = tree_sha256(scratch)
    data = prepare(make_dataset(tmp_path / "src"), scratch, tmp_path / "run")
    decision = cache_dataset(str(data), str(tmp_path / "cache.json"), "disk", 0.3, 64, log=lambda *_: None)
    assert decision["prebuild"]["written"] == 8 and decision["prebuild"]["orphans_removed"] == 0
    prepare(make_dataset(tmp_path / "src"), scratch, tmp_path / "run")  # a re-staging sweeps label caches again
    after = tree_sha256(scratch)
    assert {k: v for k, v in after.items() if k in before} == before
    copy = copy_of(data)
    assert os.path.dirname(copy) == str(scratch) and os.path.basename(copy).startswith("stagedyolo-run-")
    assert all(k.startswith(os.path.basename(copy) + "/") for k in set(after) - set(before))  # all it wrote


def test_staging_into_a_folder_the_pipeline_did_not_create_is_refused(tmp_path, scratch):
    src = make_dataset(tmp_path / "src")
    before = tree_sha256(scratch)
    with pytest.raises(DatasetError, match="not created by stagedyolo"):
        stage_dataset(str(src), validate_dataset(str(src)), str(scratch), exclude=set())
    assert tree_sha256(scratch) == before


def test_the_disk_cache_refuses_a_copy_without_the_marker(tmp_path):
    """An old-layout copy, or a data.yaml someone wrote: its folder is not the pipeline's, so nothing is swept."""
    src = make_dataset(tmp_path / "src")
    stage_dataset(str(src), validate_dataset(str(src)), str(tmp_path / "copy"), exclude=set())
    (tmp_path / "copy" / MARKER).unlink()
    (tmp_path / "copy" / "keep.npy").write_bytes(b"x")
    with pytest.raises(DatasetError, match="not a staged working copy"):
        prebuild_disk_cache(str(tmp_path / "copy" / "data.yaml"))
    assert (tmp_path / "copy" / "keep.npy").exists()


def test_two_runs_sharing_cache_dir_keep_their_own_working_copies(tmp_path):
    scratch = tmp_path / "scratch"
    first = prepare(make_dataset(tmp_path / "a", n_train=6), scratch, tmp_path / "results" / "a")
    wanted = staged_images(str(first))
    second = prepare(make_dataset(tmp_path / "b", n_train=3), scratch, tmp_path / "results" / "b")
    assert copy_of(first) != copy_of(second)
    assert staged_images(str(first)) == wanted and len(wanted["train"]) == 6  # run b replaced none of a's files
    assert all(os.path.isfile(f) for files in wanted.values() for f in files)
    assert len(staged_images(str(second))["train"]) == 3


def test_staging_waits_for_the_lock_of_its_copy(tmp_path):
    src = make_dataset(tmp_path / "src")
    report = validate_dataset(str(src))
    copy = tmp_path / "copy"
    stage_dataset(str(src), report, str(copy), exclude=set())
    done = threading.Event()
    with locked(copy):  # another job is updating this copy
        worker = threading.Thread(target=lambda: (stage_dataset(str(src), report, str(copy), set()), done.set()))
        worker.start()
        assert not done.wait(1.0)
    worker.join(30)
    assert done.is_set()


def test_temporary_names_are_unique_and_a_killed_stagings_leftovers_are_swept(tmp_path):
    assert temp_path(tmp_path / "a.jpg") != temp_path(tmp_path / "a.jpg")
    assert temp_path(tmp_path / "a.jpg").name.startswith(TMP_PREFIX)
    src = make_dataset(tmp_path / "src")
    report = validate_dataset(str(src))
    stage_dataset(str(src), report, str(tmp_path / "copy"), exclude=set())
    leftover = temp_path(tmp_path / "copy" / "train" / "images" / "train_000.jpg")
    leftover.write_bytes(b"half a file")
    assert stage_dataset(str(src), report, str(tmp_path / "copy"), exclude=set())["temps_removed"] == 1
    assert not leftover.exists()


def test_the_working_copy_is_private_and_label_caches_never_outlive_a_staging(tmp_path):
    """labels.cache is a pickle yolov5 loads before any check: nobody else may write the copy (mode 0700), and a
    cache found there at staging is dropped even when no file changed."""
    src = make_dataset(tmp_path / "src")
    report = validate_dataset(str(src))
    copy = tmp_path / "copy"
    stage_dataset(str(src), report, str(copy), exclude=set())
    assert stat.S_IMODE(os.stat(copy).st_mode) == 0o700
    (copy / "train" / "labels.cache").write_bytes(b"a pickle someone left")
    s = stage_dataset(str(src), report, str(copy), exclude=set())
    assert (s["copied"], s["linked"], s["label_caches_invalidated"]) == (0, 0, 1)
    assert not (copy / "train" / "labels.cache").exists()


def test_a_symlink_at_the_copys_name_is_not_adopted(tmp_path):
    src = make_dataset(tmp_path / "src")
    planted = tmp_path / "planted"
    planted.mkdir()
    (planted / MARKER).write_text("{}")
    (tmp_path / "copy").symlink_to(planted)
    with pytest.raises(DatasetError, match="not created by stagedyolo"):
        stage_dataset(str(src), validate_dataset(str(src)), str(tmp_path / "copy"), exclude=set())
    assert sorted(p.name for p in planted.iterdir()) == [MARKER]
