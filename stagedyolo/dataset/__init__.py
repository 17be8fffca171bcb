"""Dataset stages: validate the user's YOLOv5 dataset, stage a private working copy, plan and prebuild the image cache.

The user's files are only ever read. Everything YOLOv5 writes (label ``.cache``, ``.npy`` disk cache, and the in-place
"restore" of a JPEG that lacks its end marker) lands in the working copy under the cache dir. See docs/dataset.md.
"""

from stagedyolo.dataset.validate import (
    DatasetError,
    apply_policy,
    validate_dataset,
    write_dataset_report,
)
from stagedyolo.dataset.staging import prepare_dataset, stage_dataset
from stagedyolo.dataset.cache import cache_dataset, decide_cache_mode, prebuild_disk_cache

__all__ = [
    "DatasetError",
    "apply_policy",
    "cache_dataset",
    "decide_cache_mode",
    "prebuild_disk_cache",
    "prepare_dataset",
    "stage_dataset",
    "validate_dataset",
    "write_dataset_report",
]
