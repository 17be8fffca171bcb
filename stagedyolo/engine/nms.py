"""Validation's NMS, every image scored and each NMS stopped once it has what val.py keeps.

yolov5 7.0's non_max_suppression (utils/general.py) checks the clock after each image of a batch and, once the batch
has taken 0.5 + 0.05 x its size seconds, logs "NMS time limit ... exceeded" and returns: the batch's remaining images
keep no detections, and val.py scores them as missed. On a GPU a batch takes milliseconds. On a CPU, validating at
conf_thres 0.001 a model that still emits thousands of low-confidence boxes (early in training, or a phase trained at
a smaller size judged at the target size) passes the limit at most validations, so mAP50 is understated, best.pt and
the stages' stall handover are chosen on it, and by how much depends on the machine's speed.

Without the limit that NMS is slow: up to 30000 candidates per image go to torchvision's greedy NMS, which compares
each kept box with every lower-scored one, so a 256-px model judged at 480 took 9-12 s per batch of 32 on the 2-core
CPU. val.py keeps only the first max_det (300) boxes NMS keeps, and greedy NMS decides each box from the boxes scored
above it alone: the first k boxes kept from the top-scored candidates are the first k kept from all of them. So
first_kept runs NMS on the fewest top-scored candidates that yield max_det kept boxes (all of them where fewer do).

non_max_suppression below is yolov5 7.0's for val.py's calls (detection, no masks, no merge) with that NMS and no time
limit: per image the same candidates, scores, class offsets and order, so the same detections as yolov5's wherever
yolov5's finishes in time (tests/test_nms.py compares them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
# torch and torchvision are imported where used: the patch table imports this module before the process rows
# (lazy_dynamo, compiler_unloaded) have acted on torchvision's imports.

MAX_WH = 7680  # yolov5's class offset: boxes of different classes never overlap
MAX_NMS = 30000  # yolov5's cap on the candidates per image
FIRST_PREFIX = 1024  # candidates tried first; each retry takes four times as many


def complete_nms() -> None:
    """val.py's non_max_suppression becomes this module's (once per process)."""
    from yolov5 import val

    val.non_max_suppression = non_max_suppression


def first_kept(boxes: torch.Tensor, scores: torch.Tensor, iou_thres: float, max_det: int) -> torch.Tensor:
    """torchvision.ops.nms(boxes, scores, iou_thres)[:max_det] for ``scores`` sorted high to low, from the fewest
    leading candidates that give max_det kept boxes."""
    import torchvision

    count = FIRST_PREFIX
    while True:
        kept = torchvision.ops.nms(boxes[:count], scores[:count], iou_thres)
        if len(kept) >= max_det or count >= len(scores):
            return kept[:max_det]
        count *= 4


def non_max_suppression(
    prediction,
    conf_thres=0.25,
    iou_thres=0.45,
    classes=None,
    agnostic=False,
    multi_label=False,
    labels=(),
    max_det=300,
    nm=0,
):
    """yolov5 7.0's non_max_suppression (same arguments; masks, nm > 0, are not val.py's) without its time limit."""
    import torch

    if nm:
        raise ValueError("stagedyolo's validation NMS is for detection (nm=0), as yolov5's val.py calls it")
    if isinstance(prediction, (list, tuple)):  # val.py's (inference_out, train_out)
        prediction = prediction[0]
    nc = prediction.shape[2] - 5
    multi_label &= nc > 1
    output = []
    for image, x in enumerate(prediction):
        x = x[x[:, 4] > conf_thres]
        if labels and len(labels[image]):  # a priori labels (val.py's save_hybrid), as yolov5 adds them
            given = labels[image]
            rows = torch.zeros((len(given), nc + 5), device=x.device)
            rows[:, :4], rows[:, 4] = given[:, 1:5], 1.0
            rows[range(len(given)), given[:, 0].long() + 5] = 1.0
            x = torch.cat((x, rows), 0)
        x = detections(x, nc, conf_thres, multi_label)
        if classes is not None:
            x = x[(x[:, 5:6] == torch.tensor(classes, device=x.device)).any(1)]
        x = x[x[:, 4].argsort(descending=True)[:MAX_NMS]]
        offsets = x[:, 5:6] * (0 if agnostic else MAX_WH)
        output.append(x[first_kept(x[:, :4] + offsets, x[:, 4], iou_thres, max_det)])
    return output


def detections(x: torch.Tensor, nc: int, conf_thres: float, multi_label: bool) -> torch.Tensor:
    """One image's candidates as yolov5 rows them: xyxy, conf (objectness x class score), class; one row per class
    above conf_thres with ``multi_label``, else the best class's."""
    import torch
    from yolov5.utils.general import xywh2xyxy

    scores = x[:, 5 : 5 + nc] * x[:, 4:5]
    box = xywh2xyxy(x[:, :4])
    if multi_label:
        i, j = (scores > conf_thres).nonzero(as_tuple=False).T
        return torch.cat((box[i], scores[i, j, None], j[:, None].float()), 1)
    conf, j = scores.max(1, keepdim=True)
    return torch.cat((box, conf, j.float()), 1)[conf.view(-1) > conf_thres]
