"""The probe: measure loader and model throughput on this machine, then choose the stages' `auto` settings.

- `choice`: the pipeline model (predicted end-to-end images/s) and the choosing rule; pure, no torch.
- `child`: the measuring process (`python -m stagedyolo.probe.child request.json`), offline engine environment.
- `rule`: `probe_for_rule`, the Snakemake rule's entry point; writes tuning.json.
See docs/probe.md.
"""

from stagedyolo.probe.choice import choose, combine, predicted_images_per_s
from stagedyolo.probe.rule import probe_for_rule

__all__ = ["choose", "combine", "predicted_images_per_s", "probe_for_rule"]
