"""An early phase's image size follows the data's box sizes, through the real pipeline: the dataset report's figure
raises a cheaper phase toward the target, and the probe, the image store and the stage all see the raised size."""

import json

import pytest
from dataset_testing import make_dataset
from snakemake_runner import run_overlay

pytestmark = pytest.mark.e2e

# make_dataset's smallest boxes are a tenth of the 64-px image: 8 px need 80 px of image, rounded up to 96.
BOXES_NEED = 96
CONFIG = {
    "run": "boxes",
    "model": {"weights": None},
    "cache": {"mode": "ram"},
    "probe": {
        "stop_when_unpaid": False,
        "budget_s": 8,
        "seconds_per_candidate": 1,
        "min_steps": 4,
        "workers": [0],
        "batch": [4],
    },
    "stage_defaults": {"batch": 4, "workers": 0},
    "stage_order": ["smoke", "frozen", "highres"],
    "stages": {
        "smoke": {"epochs": 1, "img": 64, "start_from": "model"},  # raised to what the boxes need
        "frozen": {"epochs": 1, "img": 64, "img_from_boxes": False},  # kept at its img
        "highres": {"epochs": 1, "img": 128},  # the target
    },
    "export": {"enabled": False},
}


def test_a_cheaper_phase_trains_at_the_size_its_boxes_need_and_every_job_sees_it(tmp_path):
    run = run_overlay(tmp_path / "project", CONFIG, make_dataset(tmp_path / "data", n_train=8, n_val=2))
    report = json.loads((run / "data" / "dataset_report.json").read_text())
    assert report["splits"]["train"]["box_short_side"]["min_img_for_95pct_at_stride"] == BOXES_NEED
    plan = {stage: json.loads((run / "stages" / stage / "stage.json").read_text()) for stage in CONFIG["stage_order"]}
    assert plan["smoke"]["img"] == BOXES_NEED
    assert plan["smoke"]["img_decision"] == {"configured": 64, "boxes_need": BOXES_NEED, "target": 128, "trained": 96}
    timing = json.loads((run / "stages" / "smoke" / "timing.json").read_text())["config"]
    assert (timing["img"], timing["img_decision"]) == (96, plan["smoke"]["img_decision"])
    assert (plan["frozen"]["img"], plan["frozen"]["img_decision"]) == (64, None)
    assert (plan["highres"]["img"], plan["highres"]["img_decision"]) == (128, None)
    assert [stage["img"] for stage in plan["smoke"]["run_stages"]] == [96, 64, 128]  # the progress line's ETA
    predicted = json.loads((run / "probe" / "tuning.json").read_text())["stages"]
    assert {stage: predicted[stage]["settings"]["img"] for stage in plan} == {"smoke": 96, "frozen": 64, "highres": 128}
    table = (run / "report" / "stages.csv").read_text().splitlines()
    assert [row.split(",")[2] for row in table] == ["img", "96", "64", "128"]  # the report shows the trained sizes
    store = json.loads((run / "data" / "cache.json").read_text())["store"]
    assert "[64, 96, 128]" in store["reason"], store  # the store holds the sizes the stages train at, no other
