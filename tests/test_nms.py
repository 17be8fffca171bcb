"""complete_nms: validation scores every image, where yolov5's NMS time limit leaves some without detections."""

import itertools
import logging
from types import SimpleNamespace

import pytest
import torch

from stagedyolo.engine import nms

general = pytest.importorskip("yolov5.utils.general")


def predictions(images: int = 4, boxes: int = 400, classes: int = 3, seed: int = 0) -> torch.Tensor:
    """What a yolov5 detector hands NMS at validation: xywh in pixels, objectness, class scores."""
    generator = torch.Generator().manual_seed(seed)
    xy = torch.rand(images, boxes, 2, generator=generator) * 480
    wh = 8 + torch.rand(images, boxes, 2, generator=generator) * 80
    scores = torch.rand(images, boxes, 1 + classes, generator=generator)
    return torch.cat((xy, wh, scores), 2)


@pytest.fixture
def slow_clock(monkeypatch):
    """yolov5's clock jumps 10 s at every reading: every batch passes its time limit after its first image."""
    ticks = itertools.count(step=10.0)
    monkeypatch.setattr(general, "time", SimpleNamespace(time=lambda: next(ticks)))


def nms_args() -> dict:
    return {"conf_thres": 0.001, "iou_thres": 0.6, "multi_label": True, "max_det": 300}


def test_past_its_time_limit_yolov5s_nms_leaves_images_without_detections(slow_clock):
    output = general.non_max_suppression(predictions(), **nms_args())
    assert len(output[0]) > 0
    assert [len(image) for image in output[1:]] == [0, 0, 0]


def test_complete_nms_scores_every_image_as_yolov5_does_without_its_limit(monkeypatch):
    prediction = predictions()
    unhurried = general.non_max_suppression(prediction, **nms_args())
    ticks = itertools.count(step=10.0)
    monkeypatch.setattr(general, "time", SimpleNamespace(time=lambda: next(ticks)))
    complete = nms.nms_image_by_image(general.non_max_suppression, logging.getLogger("test"))
    output = complete(prediction, **nms_args())
    assert len(output) == len(unhurried) == 4
    for ours, theirs in zip(output, unhurried):
        assert len(theirs) > 0
        assert torch.equal(ours, theirs)


def test_within_the_limit_complete_nms_is_yolov5s_own_with_val_pys_arguments():
    prediction = predictions(images=3, seed=1)
    labels = [torch.tensor([[1.0, 100, 100, 40, 40]]), torch.zeros((0, 5)), torch.tensor([[0.0, 200, 50, 30, 60]])]
    complete = nms.nms_image_by_image(general.non_max_suppression, logging.getLogger("test"))
    val_py = {"multi_label": True, "max_det": 300}  # as val.py calls it, after conf_thres and iou_thres
    for arguments in ({**val_py, "labels": labels}, {**val_py, "labels": []}, {"agnostic": True}):
        theirs = general.non_max_suppression((prediction, None), 0.001, 0.6, **arguments)
        ours = complete((prediction, None), 0.001, 0.6, **arguments)
        assert all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True))


class Recorder(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_a_batch_over_yolov5s_limit_is_logged_as_run_to_the_end_and_yolov5s_warning_is_dropped(slow_clock, monkeypatch):
    from yolov5 import val

    ticks = itertools.count(step=5.0)
    monkeypatch.setattr(nms, "_clock", lambda: next(ticks))
    monkeypatch.setattr(val, "non_max_suppression", val.non_max_suppression)  # restored after the test
    logger, recorder = logging.getLogger("yolov5"), Recorder()
    filters = list(logger.filters)
    logger.addHandler(recorder)
    try:
        nms.complete_nms()
        nms.complete_nms()  # once per process
        assert sum(isinstance(f, nms.DropTimeLimitWarning) for f in logger.filters) == 1
        output = val.non_max_suppression(predictions(), **nms_args())
    finally:
        logger.filters[:] = filters
        logger.removeHandler(recorder)
    assert all(len(image) > 0 for image in output)
    assert val.non_max_suppression.batches_over_limit == 1
    assert not any(nms.TIME_LIMIT_WARNING in message for message in recorder.messages), recorder.messages
    assert any("over yolov5's 0.70s limit: stagedyolo ran it to the end" in m for m in recorder.messages), (
        recorder.messages
    )
