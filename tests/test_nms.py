"""complete_nms: validation scores every image, where yolov5's NMS time limit leaves some without detections."""

import itertools
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


def test_stagedyolos_nms_scores_every_image_where_yolov5s_would_cut_them(slow_clock):
    prediction = predictions()
    output = nms.non_max_suppression(prediction, **nms_args())
    assert all(len(image) > 0 for image in output)
    assert [len(image) for image in general.non_max_suppression(prediction, **nms_args())[1:]] == [0, 0, 0]


@pytest.mark.parametrize("first_prefix", [nms.FIRST_PREFIX, 16])  # 16: NMS stops early and retries, several times
def test_stagedyolos_nms_gives_yolov5s_detections_for_val_pys_calls(monkeypatch, first_prefix):
    monkeypatch.setattr(nms, "FIRST_PREFIX", first_prefix)
    prediction = predictions(images=3, boxes=3000, seed=1)  # up to 9000 candidates an image with multi_label
    labels = [torch.tensor([[1.0, 100, 100, 40, 40]]), torch.zeros((0, 5)), torch.tensor([[0.0, 200, 50, 30, 60]])]
    val_py = {"multi_label": True, "max_det": 300}  # val.py's, after conf_thres and iou_thres
    for arguments in (
        {**val_py, "labels": labels},
        {**val_py, "labels": []},
        {**val_py, "max_det": 20},
        {"agnostic": True},
        {"classes": [0, 2]},
    ):
        theirs = general.non_max_suppression((prediction, None), 0.001, 0.6, **arguments)
        ours = nms.non_max_suppression((prediction, None), 0.001, 0.6, **arguments)
        for a, b in zip(ours, theirs, strict=True):
            assert len(b) > 0 and torch.equal(a, b), arguments


def test_an_image_without_candidates_gets_no_detections_as_in_yolov5():
    prediction = predictions(images=2)
    prediction[1, :, 4] = 0.0  # no objectness above conf_thres
    ours, theirs = (
        nms.non_max_suppression(prediction, **nms_args()),
        general.non_max_suppression(prediction, **nms_args()),
    )
    assert ours[1].shape == theirs[1].shape == (0, 6)
    assert torch.equal(ours[0], theirs[0])


def test_nms_from_the_leading_candidates_keeps_what_nms_of_all_keeps_first_ties_included():
    import torchvision

    generator = torch.Generator().manual_seed(2)
    xy = torch.rand(5000, 2, generator=generator) * 300
    boxes = torch.cat((xy, xy + 10 + torch.rand(5000, 2, generator=generator) * 40), 1)
    scores = (torch.rand(5000, generator=generator) * 20).round() / 20  # 21 distinct scores: ties everywhere
    order = scores.sort(descending=True, stable=True).indices
    boxes, scores = boxes[order], scores[order]
    everything = torchvision.ops.nms(boxes, scores, 0.5)
    assert len(everything) > 300
    for max_det in (1, 50, 300, len(everything) + 10):
        assert torch.equal(nms.first_kept(boxes, scores, 0.5, max_det), everything[:max_det])


def test_complete_nms_gives_val_py_stagedyolos_nms(monkeypatch):
    from yolov5 import val

    monkeypatch.setattr(val, "non_max_suppression", val.non_max_suppression)  # restored after the test
    nms.complete_nms()
    assert val.non_max_suppression is nms.non_max_suppression
