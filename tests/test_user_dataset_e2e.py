"""A user's own dataset through the real pipeline: read-only, with a corrupt JPEG, cached to disk. It must come out
byte-for-byte unchanged, and so must the user's files in the scratch folder given as cache.dir and in the folder given
as tracking.dir (TensorBoard), folders named like the stages and like `run` included."""

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from dataset_testing import jpeg_without_eoi, tree_sha256
from snakemake_runner import make_workdir, snakemake

from stagedyolo.demo import TARGET_CLASSES, DemoSpec, write_demo_dataset

pytestmark = pytest.mark.e2e

CONFIG = {
    "run": "user",
    "model": {"weights": None},
    "cache": {"mode": "disk"},
    "probe": {"enabled": False},
    "stage_defaults": {"img": 64, "batch": 8, "workers": 1},
    "stage_order": ["smoke", "finetune"],  # replaces the default recipe's four, which the merge keeps defined
    "stages": {"smoke": {"epochs": 1, "start_from": "model"}, "finetune": {"epochs": 1}},
    "export": {"enabled": False},  # the tiny demo run checks the export; here: switched off, it is never planned
}


@pytest.fixture
def read_only_dataset(tmp_path):
    source = tmp_path / "source"
    write_demo_dataset(source, DemoSpec(TARGET_CLASSES, 24, 8))
    jpeg_without_eoi(source / "images" / "train" / "train_0003.jpg")  # yolov5 would rewrite this file in place
    mount = tmp_path / "dataset"
    mount.mkdir()
    # chmod means nothing to root, so the dataset is bind-mounted read-only: any write fails for real.
    if subprocess.run(["mount", "--bind", "-o", "ro", str(source), str(mount)], capture_output=True).returncode:
        pytest.skip("needs a read-only bind mount (root on Linux)")
    data = yaml.safe_load((source / "data.yaml").read_text())
    (tmp_path / "data.yaml").write_text(yaml.safe_dump({**data, "path": str(mount)}))
    try:
        yield tmp_path / "data.yaml", mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def plant_user_files(root: Path) -> dict[str, str]:
    """Files a user keeps where the pipeline writes too: arrays and label caches in the scratch folder, earlier runs in
    yolov5's log folder, folders named like the stages and like the tracking's run folder."""
    for name in (
        "arrays/features.npy",
        "train/images/x.npy",
        "train/labels.cache",
        "val/labels.cache",
        "smoke/events.out.tfevents.1",
        "finetune/weights/best.pt",
        "run/params.json",
        "train/exp/last.pt",
        "user/keep.txt",
    ):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(f"the user's {name}".encode())
    return tree_sha256(root)


def test_a_read_only_dataset_trains_and_stays_byte_for_byte_unchanged(tmp_path, read_only_dataset):
    data_yaml, dataset = read_only_dataset
    before = tree_sha256(dataset)
    scratch, runs = tmp_path / "scratch", tmp_path / "runs"
    planted = {"scratch": plant_user_files(scratch), "runs": plant_user_files(runs)}
    workdir = make_workdir(tmp_path / "project")
    config = {
        **CONFIG,
        "dataset": str(data_yaml),
        "cache": {**CONFIG["cache"], "dir": str(scratch)},
        "tracking": {"backend": "tensorboard", "dir": str(runs)},
    }
    (workdir / "user.yaml").write_text(yaml.safe_dump(config))
    snakemake(workdir, configfiles=[workdir / "user.yaml"])

    assert tree_sha256(dataset) == before
    for root, files in (("scratch", scratch), ("runs", runs)):
        after = tree_sha256(files)
        assert {name: after.get(name) for name in planted[root]} == planted[root], f"{root}: a user file changed"
    assert list(scratch.glob("stagedyolo-user-*/**/*.npy")), "the disk cache lives in the run's own folder"
    run = workdir / "results" / "user"
    report = json.loads((run / "data" / "dataset_report.json").read_text())
    assert any(bad["file"].endswith("train_0003.jpg") for bad in report["bad"])
    assert json.loads((run / "data" / "cache.json").read_text())["mode"] == "disk"
    assert sorted(p.name for p in (run / "stages").iterdir()) == sorted(CONFIG["stage_order"])
    for stage in CONFIG["stages"]:
        assert (run / "stages" / stage / "weights" / "last.pt").is_file()
    # This data.yaml has no test: split: the pipeline says so and still succeeds.
    test = json.loads((run / "test" / "test_metrics.json").read_text())
    assert test["test_split"] is None and str(data_yaml) in test["reason"]
    assert "No test-split score" in (run / "report" / "summary.md").read_text()
    assert not (run / "export").exists()
