"""A tune trial's measuring window, inside the worker: skip the warm-up batches, time the next ones, then stop.

The window is timed from batch end to batch end: the first ``warmup`` batches (loader workers starting, the
loader's prefetched batches draining, first-iteration allocations, cuDNN autotuning) are excluded, and the
``measure`` batches after them are the steady rate. yolov5 returns from train() when ``stop_training`` is set at a
batch end, so the trial stops there without validating or saving.
"""

from __future__ import annotations

import time

from stagedyolo.engine.hooks import register


class TrialWindow:
    def __init__(self, warmup: int, measure: int):
        self.warmup, self.measure = int(warmup), int(measure)
        self.ends: list[float] = []  # perf_counter at each batch end
        self.images: list[int] = []
        self.callbacks = None

    @classmethod
    def from_plan(cls, plan: dict):
        trial = plan.get("trial")
        return cls(trial["warmup_batches"], trial["measure_batches"]) if trial else None

    def attach(self, callbacks) -> None:
        self.callbacks = callbacks
        register(self, callbacks)

    def on_train_batch_end(self, model, ni, imgs, targets, paths, mloss):
        self.ends.append(time.perf_counter())
        self.images.append(int(imgs.shape[0]))
        if len(self.ends) >= self.warmup + self.measure:
            self.callbacks.stop_training = True

    def result(self) -> dict:
        """Steady images/s over the batches after the warm-up; None when the window was not reached."""
        done = len(self.ends) - self.warmup
        if done < 1:
            return {
                "images_per_s": None,
                "batches": max(done, 0),
                "seconds": None,
                "warmup_batches": self.warmup,
                "reason": f"training ended after {len(self.ends)} batch(es), inside the warm-up",
            }
        start = max(self.warmup, 1)  # without a warm-up, timed from the first batch's end
        seconds = self.ends[-1] - self.ends[start - 1]
        images = sum(self.images[start:])
        return {
            "images_per_s": round(images / seconds, 3) if seconds > 0 else None,
            "batches": done,
            "images": images,
            "seconds": round(seconds, 4),
            "warmup_batches": self.warmup,
            "complete": done >= self.measure,
        }
