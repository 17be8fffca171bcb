"""Validation's NMS run to the end: yolov5's non_max_suppression stops once a batch has taken its time limit.

yolov5 7.0's non_max_suppression (utils/general.py) checks the clock after each image of a batch and, once the batch
has taken 0.5 + 0.05 x its size seconds, logs "NMS time limit ... exceeded" and returns: the batch's remaining
images keep no detections, and val.py scores them as missed. On a GPU a batch takes milliseconds. On a CPU, validating
at conf_thres 0.001 a model that still emits thousands of low-confidence boxes (early in training, or a phase trained
at a smaller size judged at the target size) passes the limit at every validation, so mAP50 is understated, best.pt
and the stages' stall handover are chosen on it, and how much depends on the machine's speed. Measured on det at 480
px (2-core CPU): a fine-tune trained at 256 px hit it at every validation, a one-stage run at 480 px once in 30.

complete_nms gives val.py the same function with each image on its own clock: one image per call, whose detections
yolov5 always keeps (it checks the limit after an image's output is set), so every image is scored and each image's
detections are yolov5's own. The limit's warning, no longer true, is dropped; a batch that takes longer than
yolov5's limit gets a line of its own, which says that it ran to the end.
"""

from __future__ import annotations

import logging
import time

TIME_LIMIT_WARNING = "NMS time limit"
_clock = time.perf_counter  # a module name, so a test can stand in for it


def yolov5_time_limit(batch_size: int) -> float:
    """Seconds after which yolov5 7.0's non_max_suppression stops a batch (its `time_limit`)."""
    return 0.5 + 0.05 * batch_size


class DropTimeLimitWarning(logging.Filter):
    """Drops yolov5's "NMS time limit exceeded" warning, which complete_nms makes untrue."""

    def filter(self, record: logging.LogRecord) -> bool:
        return TIME_LIMIT_WARNING not in record.getMessage()


def complete_nms() -> None:
    """Replace yolov5.val's non_max_suppression with nms_image_by_image over yolov5's own (once per process)."""
    from yolov5 import val

    if getattr(val.non_max_suppression, "_stagedyolo_complete", False):
        return
    logger = logging.getLogger("yolov5")
    logger.addFilter(DropTimeLimitWarning())
    val.non_max_suppression = nms_image_by_image(val.non_max_suppression, logger)


def nms_image_by_image(batch_nms, logger: logging.Logger):
    """``batch_nms`` (yolov5's non_max_suppression) called once per image of the batch, so that none is cut."""

    def complete(prediction, *args, labels=(), **kwargs):
        if isinstance(prediction, (list, tuple)):  # val.py's (inference_out, train_out)
            prediction = prediction[0]
        started = _clock()
        output = []
        for i in range(prediction.shape[0]):
            image_labels = labels[i : i + 1] if len(labels) else ()
            output += batch_nms(prediction[i : i + 1], *args, labels=image_labels, **kwargs)
        seconds, limit = _clock() - started, yolov5_time_limit(prediction.shape[0])
        if seconds > limit:
            complete.batches_over_limit += 1
            logger.warning(
                f"NMS took {seconds:.2f}s for {prediction.shape[0]} images, over yolov5's {limit:.2f}s limit: "
                "stagedyolo ran it to the end (yolov5 would have left the rest of the batch without detections)"
            )
        return output

    complete.batches_over_limit = 0
    complete._stagedyolo_complete = True
    return complete
