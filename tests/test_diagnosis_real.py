"""The diagnosis on a real CPU run: decoding large JPEGs with heavy augmentation in the training process itself
(workers: 0, no cache) makes the stage data-loading bound, and the diagnosis must say so."""

import json

import pytest
from dataset_testing import LOADER_BOUND_SPEC

from stagedyolo.demo import TARGET_CLASSES, DemoSpec, write_demo_dataset
from stagedyolo.stage import run_stage
from stagedyolo.stage_plan import build_plan

pytestmark = pytest.mark.exclusive  # the data-wait share is measured (tests/conftest.py)
SPEC = {**LOADER_BOUND_SPEC, "epochs": 2, "val_period": 2}


def test_workers_0_with_heavy_augmentation_is_diagnosed_as_data_loading_bound(tmp_path):
    data = write_demo_dataset(tmp_path / "data", DemoSpec(TARGET_CLASSES, 24, 8, image_size=1024))
    plan = build_plan(
        SPEC,
        stage="loader",
        data=data,
        weights=None,
        cfg="yolov5n.yaml",
        cache_mode="none",
        threads=1,
        work_dir=tmp_path / "work" / "loader",
    )
    run_stage(plan, stage_dir=tmp_path / "loader", attempt=1, log_path=tmp_path / "loader.log", engine_home=tmp_path)

    diagnosis = json.loads((tmp_path / "loader" / "diagnosis.json").read_text())
    top = diagnosis["findings"][0]
    assert top["code"] == "data_loading_bound", diagnosis["findings"]
    assert top["evidence"]["data_wait_share"]["value"] > 0.3
    assert top["change"] in ("stages.loader.workers: 1", "stages.loader.cache: ram", "stages.loader.cache: disk")
