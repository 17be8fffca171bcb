"""What to raise when a cluster ends a job at one of its limits. The SLURM executor reports the job's state
('TIMEOUT', 'OUT_OF_MEMORY') and its logs, but not which Snakemake resource asked for the limit; the workflow's
onerror handler prints it from Snakemake's log."""

from __future__ import annotations

import re
from pathlib import Path

# SLURM's state -> the resource that set the limit, and what its unit is.
LIMITS = {"TIMEOUT": ("runtime", "minutes"), "OUT_OF_MEMORY": ("mem_mb", "MB")}
_ERROR = re.compile(r"Error in rule (?P<rule>\w+):")
_STATE = re.compile(r"SLURM status is: '(?P<state>\w+)'")


def limit_hints(log_text: str) -> list[str]:
    """One line per failed job that ran into a limit: the rule, the state and the resource to raise."""
    hints = []
    blocks = _ERROR.split(log_text)[1:]  # [rule, its block, rule, its block, ...]
    for rule, block in zip(blocks[::2], blocks[1::2]):
        state = _STATE.search(block)
        if state and state["state"] in LIMITS:
            resource, unit = LIMITS[state["state"]]
            hints.append(
                f"stagedyolo: rule {rule} ended {state['state']} on the cluster: raise its `{resource}` ({unit}), "
                f"e.g. in the profile's set-resources: {rule}: {resource}: <more>"
            )
    return sorted(set(hints))


def print_limit_hints(logs: str | list[str] | None) -> None:
    """The workflow's onerror handler: the hints for Snakemake's log (its `log`: a list of paths in Snakemake 9, one
    path before), on stderr; nothing when there are none."""
    import sys

    paths = [logs] if isinstance(logs, str) else list(logs or [])
    text = ""
    for path in paths:
        try:
            text += Path(path).read_text(errors="replace")
        except OSError:
            continue
    for hint in limit_hints(text):
        print(hint, file=sys.stderr)
