"""The probe: measure on this machine, choose the stages' `auto` settings and predict each stage's images/s.

- `steady`: timing a repeated step in its steady state (warm-up excluded); pure, no torch.
- `choice`: the pipeline model for the candidates, the choosing rule and the AMP verdict; pure, no torch.
- `stages`: each stage's settings as the probe predicts them, and the prediction beside the stage's measurement.
- `child`: the measuring process (`python -m stagedyolo.probe.child request.json`), offline engine environment.
- `reuse`: measurements kept across runs while machine, images, model and settings are unchanged.
- `rule`: `probe_for_rule`, the Snakemake rule's entry point; writes tuning.json.
See docs/probe.md.
"""

from stagedyolo.probe.choice import choose, combine, predicted_images_per_s

__all__ = ["choose", "combine", "predicted_images_per_s", "probe_for_rule"]


def __getattr__(name: str):
    """probe_for_rule on first use: the measuring process (`python -m stagedyolo.probe.child`) imports this package
    too, and needs neither the rule nor what the rule imports (the dataset tools, cv2)."""
    if name == "probe_for_rule":
        from stagedyolo.probe.rule import probe_for_rule

        return probe_for_rule
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
