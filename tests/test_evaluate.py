"""The test-split score: per-class rows from yolov5's ap_per_class, the no-test-split path, and the demo's split.
The real evaluation on real weights runs in test_pipeline_e2e (with a split) and test_user_dataset_e2e (without)."""

import json

import numpy as np
from dataset_testing import make_dataset, tree_sha256

from stagedyolo.demo import TARGET_CLASSES, DemoSpec, write_demo_dataset
from stagedyolo.evaluate import evaluate_for_rule, instance_counts, markdown, per_class


def test_a_class_absent_from_the_split_has_no_ap():
    # ap_per_class's return for classes 0 and 2 (class 1 has no instance): tp, fp, p, r, f1, ap (10 IoUs), classes
    ap = np.array([np.linspace(0.9, 0.5, 10), np.linspace(0.6, 0.2, 10)])
    scored = (None, None, np.array([0.8, 0.5]), np.array([0.7, 0.4]), None, ap, np.array([0, 2]))
    rows = per_class(["a", "b", "c"], [3, 0, 1], scored)
    assert [r["instances"] for r in rows] == [3, 0, 1]
    assert rows[0]["ap50"] == 0.9 and rows[0]["ap50_95"] == ap[0].mean() and rows[2]["precision"] == 0.5
    assert rows[1] == {"class": "b", "instances": 0, "precision": None, "recall": None, "ap50": None, "ap50_95": None}
    table = markdown(
        {
            "test_split": ["/t"],
            "weights": "w.pt",
            "img": 96,
            "classes": rows,
            "all": {"precision": 0.65, "recall": 0.55, "ap50": 0.75, "ap50_95": 0.55},
        }
    )
    assert "| all | 4 | 0.6500 | 0.5500 | 0.7500 | 0.5500 |" in table and "| b | 0 | n/a | n/a | n/a | n/a |" in table


def test_without_a_test_split_it_says_so_and_succeeds(tmp_path):
    data = make_dataset(tmp_path / "data")
    result = evaluate_for_rule(
        "w.pt",
        str(data),
        str(tmp_path / "t.json"),
        str(tmp_path / "t.md"),
        img=64,
        batch=8,
        device="cpu",
        threads=1,
        log_path=str(tmp_path / "log"),
    )
    assert result["test_split"] is None and "has no test: split" in result["reason"]
    assert json.loads((tmp_path / "t.json").read_text()) == result
    assert "No test-split score" in (tmp_path / "t.md").read_text()


def test_the_demo_test_split_leaves_train_and_val_unchanged(tmp_path):
    before = write_demo_dataset(tmp_path / "a", DemoSpec(TARGET_CLASSES, 8, 4))
    after = write_demo_dataset(tmp_path / "b", DemoSpec(TARGET_CLASSES, 8, 4, 3))
    for split in ("images/train", "labels/train", "images/val", "labels/val"):
        assert tree_sha256(tmp_path / "a" / split) == tree_sha256(tmp_path / "b" / split)
    assert len(list((tmp_path / "b" / "images" / "test").glob("*.jpg"))) == 3
    assert "test:" not in before.read_text() and "test: images/test" in after.read_text()


def labelled_split(folder, labels: dict) -> list[str]:
    """A split folder of images with the given label file text ({stem: text}); returns its sources."""
    for stem, text in labels.items():
        (folder / "images").mkdir(parents=True, exist_ok=True)
        (folder / "labels").mkdir(parents=True, exist_ok=True)
        (folder / "images" / f"{stem}.jpg").write_bytes(b"")
        if text is not None:
            (folder / "labels" / f"{stem}.txt").write_text(text)
    return [str(folder / "images")]


def test_when_nothing_is_detected_the_instances_still_count_and_score_zero(tmp_path):
    """val.py calls ap_per_class only when a detection is right: with none, nothing is captured."""
    split = labelled_split(
        tmp_path,
        {
            "a": "0 0.5 0.5 0.1 0.1\n2 0.2 0.2 0.1 0.1\n",
            "b": "0 0.3 0.3 0.1 0.1\n\n",
            "c": "",
            "d": None,
            "e": "0 0.3 0.3 0.1 0.1\n0 0.3 0.3 0.1 0.1\n",
        },
    )
    counts = instance_counts(split, 3)
    assert counts == [3, 0, 1]  # e's repeated row counts once, as val.py loads it; c and d have no objects
    rows = per_class(["a", "b", "c"], counts, None)
    assert [(r["instances"], r["ap50"], r["ap50_95"], r["precision"]) for r in rows] == [
        (3, 0.0, 0.0, 0.0),
        (0, None, None, None),
        (1, 0.0, 0.0, 0.0),
    ]
    table = markdown(
        {
            "test_split": split,
            "weights": "w.pt",
            "img": 96,
            "classes": rows,
            "all": {"precision": 0.0, "recall": 0.0, "ap50": 0.0, "ap50_95": 0.0},
        }
    )
    assert "| all | 4 | 0.0000 |" in table and "| a | 3 | 0.0000 | 0.0000 | 0.0000 | 0.0000 |" in table
    assert instance_counts(split, 1, single_cls=True) == [4]


def test_an_explicit_device_counts_the_schedulers_gpus_and_yolov5_gets_an_empty_device():
    from stagedyolo.engine.worker import resolve_device
    from stagedyolo.evaluate import narrow_to_device_setting

    env = {"CUDA_VISIBLE_DEVICES": "4,5"}
    narrow_to_device_setting("1", env)
    assert env["CUDA_VISIBLE_DEVICES"] == "5" and resolve_device("1", True, env) == ""
    untouched = {"CUDA_VISIBLE_DEVICES": "4,5"}
    narrow_to_device_setting("auto", untouched)
    assert untouched == {"CUDA_VISIBLE_DEVICES": "4,5"}
