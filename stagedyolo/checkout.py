"""Jobs import stagedyolo from the source checkout the workflow runs from.

A conda env from envs/ (`--sdm conda`) holds the dependencies but not stagedyolo itself: Snakemake creates it from a
copy of the env file under .snakemake/conda/, where a relative `pip install -e ../` would name the wrong folder.
"""

from __future__ import annotations

import os
from pathlib import Path

import stagedyolo


def share_checkout_with_jobs() -> Path | None:
    """Put the checkout this process imported stagedyolo from first on PYTHONPATH, which every job inherits.

    An installed (wheel) stagedyolo is left to the job's own environment: its folder holds other packages too.
    Returns the checkout, or None for an installed package.
    """
    checkout = Path(stagedyolo.__file__).resolve().parent.parent
    if not (checkout / "pyproject.toml").is_file():
        return None
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(checkout), os.environ.get("PYTHONPATH")) if p)
    return checkout
