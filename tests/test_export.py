"""The export check's comparison (yolov5's own NMS on synthetic raw predictions) and its choice of image. The real
export, on real weights, is checked in test_pipeline_e2e (and independently of this code there)."""

import numpy as np
import pytest

from stagedyolo.demo import TARGET_CLASSES, DemoSpec, write_demo_dataset
from stagedyolo.export import ExportFailed, check_image, compare_predictions


@pytest.fixture(scope="module", autouse=True)
def offline_yolov5(tmp_path_factory):
    """NMS comes from yolov5: import it as the export job does, offline."""
    import os

    from stagedyolo.engine.offline import engine_environment

    saved = dict(os.environ)
    os.environ.update(engine_environment(tmp_path_factory.mktemp("engine"), base={}))
    yield
    os.environ.clear()
    os.environ.update(saved)


def raw_predictions(seed=0, anchors=567, classes=3):
    """(1, anchors, 5 + classes) like yolov5's Detect output at 96 px: xywh in pixels, sigmoid scores; three
    confident, well separated objects."""
    rng = np.random.default_rng(seed)
    pred = np.zeros((1, anchors, 5 + classes), np.float32)
    pred[0, :, :2] = rng.uniform(0, 96, (anchors, 2))
    pred[0, :, 2:4] = rng.uniform(4, 30, (anchors, 2))
    pred[0, :, 4:] = rng.uniform(0, 0.1, (anchors, 1 + classes))
    for k, (x, y) in enumerate(((20, 20), (70, 20), (45, 70))):
        pred[0, k] = [x, y, 16, 16, 0.9, *np.eye(classes)[k]]
    return pred


def test_identical_predictions_pass_and_keep_the_confident_boxes():
    pred = raw_predictions()
    check = compare_predictions(pred, pred.copy(), box_tolerance_px=0.1, score_tolerance=1e-3)
    assert check["passed"] and check["detections"] == check["detections_exported"] == 3
    assert check["raw_max_box_diff_px"] == 0 and check["detections_max_box_diff_px"] == 0


def test_float_noise_within_tolerance_passes():
    pred = raw_predictions()
    noisy = pred + np.random.default_rng(1).normal(0, 1e-6, pred.shape).astype(np.float32)
    check = compare_predictions(pred, noisy, box_tolerance_px=0.1, score_tolerance=1e-3)
    assert check["passed"] and 0 < check["raw_max_box_diff_px"] < 1e-4


def test_a_box_off_by_half_a_pixel_fails():
    pred = raw_predictions()
    shifted = pred.copy()
    shifted[0, 100, 0] += 0.5  # an unconfident anchor: NMS drops it, the raw comparison still sees it
    check = compare_predictions(pred, shifted, box_tolerance_px=0.1, score_tolerance=1e-3)
    assert not check["passed"] and check["raw_max_box_diff_px"] == pytest.approx(0.5, abs=1e-4)
    assert check["detections"] == check["detections_exported"] == 3


def test_a_lost_detection_fails():
    pred = raw_predictions()
    weaker = pred.copy()
    weaker[0, 2, 4] = 0.2  # below detect.py's 0.25: the third object disappears
    check = compare_predictions(pred, weaker, box_tolerance_px=0.1, score_tolerance=1.0)
    assert not check["passed"] and (check["detections"], check["detections_exported"]) == (3, 2)


def test_a_different_output_shape_fails_with_the_reason():
    check = compare_predictions(raw_predictions(), raw_predictions(anchors=252), 0.1, 1e-3)
    assert not check["passed"] and "[1, 252, 8]" in check["reason"]


def test_the_check_image_is_held_out_when_there_is_a_test_split(tmp_path):
    with_test = write_demo_dataset(tmp_path / "a", DemoSpec(TARGET_CLASSES, 8, 4, 2))
    without = write_demo_dataset(tmp_path / "b", DemoSpec(TARGET_CLASSES, 8, 4))
    assert check_image(str(with_test)).endswith("images/test/test_0000.jpg")
    assert check_image(str(without)).endswith("images/val/val_0000.jpg")
    (tmp_path / "b" / "empty").mkdir()
    (tmp_path / "b" / "data.yaml").write_text("train: images/train\nval: empty\nnames: [a]\n")
    with pytest.raises(ExportFailed, match="lists no test or val image"):
        check_image(str(tmp_path / "b" / "data.yaml"))
