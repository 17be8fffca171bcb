"""A cheap fingerprint of a dataset's source tree, so that Snakemake re-stages when an image or label changes.

prepare_dataset's only input file is the data.yaml: editing a label changes no input, and the run would keep training
on the old working copy. The fingerprint (a param of the rule) covers what staging reads: every image YOLOv5 lists,
the label file it derives from each (present or not), the data.yaml and any image list files, by name, size and
mtime_ns. Contents are not read: planning a run stays at one stat per file.
"""

from __future__ import annotations

import hashlib
import os

from stagedyolo.dataset.validate import DatasetError, img2label_path, list_split_images, load_data_yaml


def source_fingerprint(data_yaml: str) -> str:
    """sha256 of (path, size, mtime_ns) of the data.yaml, its list files, its images and their labels. A dataset
    that cannot be read gives a constant naming why: prepare_dataset then fails with the full message."""
    try:
        data = load_data_yaml(data_yaml)
        files = [data["yaml"]]
        for sources in data["splits"].values():
            files += [s for s in sources if not os.path.isdir(s)]  # image list files (.txt)
            images = list_split_images(sources)[0]
            files += [f for image in images for f in (image, img2label_path(image))]
    except (DatasetError, OSError, UnicodeDecodeError) as e:
        return f"unreadable: {type(e).__name__}"
    digest = hashlib.sha256()
    for f in files:
        digest.update(f"{f}\0{_stat_key(f)}\n".encode())
    return digest.hexdigest()[:16]


def _stat_key(path: str) -> str:
    try:
        st = os.stat(path)
    except OSError:
        return "-"  # a background image's missing label: adding one changes the fingerprint
    return f"{st.st_size}:{st.st_mtime_ns}"
