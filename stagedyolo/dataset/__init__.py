"""Dataset stages: validate the user's YOLOv5 dataset, stage a private working copy, plan and prebuild the image cache.

The user's files are only ever read. Everything YOLOv5 writes (label ``.cache``, ``.npy`` disk cache, and the in-place
"restore" of a JPEG that lacks its end marker) lands in the working copy, the pipeline's own folder in the cache dir.
See docs/dataset.md.

The names below are loaded on first use (PEP 562): the workflow imports ``stagedyolo.dataset.fingerprint`` while it
plans every run, and should not pay for cv2 and numpy there.
"""

import importlib

_HOMES = {
    "DatasetError": "validate",
    "apply_policy": "validate",
    "validate_dataset": "validate",
    "write_dataset_report": "validate",
    "prepare_dataset": "staging",
    "stage_dataset": "staging",
    "cache_dataset": "cache",
    "decide_cache_mode": "cache",
    "prebuild_disk_cache": "cache",
    "source_fingerprint": "fingerprint",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
