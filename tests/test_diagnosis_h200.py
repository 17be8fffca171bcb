"""The recorded H200 timing files replay through the diagnosis (tests/fixtures/h200/README.md).

On that GPU the step on the host set the pace (data-wait < 5 %, GPU idle half the time), and the old advice
"raise the batch" made every stage slower: no stage with low data-wait may be told to raise its batch without a
measurement. The frozen stage waited on its 4 loader workers 45 % of the time: it must be told to add workers.
"""

import copy
import json
from pathlib import Path

import pytest

from stagedyolo.diagnosis import diagnose, diagnosis_markdown, verdict_line
from stagedyolo.telemetry.summary import validate_timing

FIXTURES = Path(__file__).parent / "fixtures" / "h200"


def recorded(stage: str) -> dict:
    timing = json.loads((FIXTURES / f"b3_{stage}_timing.json").read_text())
    validate_timing(timing)  # a real timing.json, as the pipeline wrote it
    return timing


def b2_like(stage: str, util_p50: float) -> dict:
    """B2 (batch 64) as its log reports it: the B3 file with batch, GPU util and data-wait set to B2's figures."""
    t = copy.deepcopy(recorded(stage))
    t["config"]["batch"] = 64
    t["gpu"]["util_pct"].update(p50=util_p50, mean=util_p50)
    t["data_wait"].update(share=0.005, steady_share=0.005)
    return t


def advises_bigger_batch(findings) -> bool:
    return any(
        ".batch:" in f["change"] or any(".batch:" in a and "measure" not in a for a in f["also"]) for f in findings
    )


LOW_DATA_WAIT = {
    "b3_smoke": lambda: recorded("smoke"),
    "b3_finetune": lambda: recorded("finetune"),
    "b3_highres": lambda: recorded("highres"),
    "b2_frozen_like": lambda: b2_like("frozen", 27.0),
    "b2_highres_like": lambda: b2_like("highres", 42.0),
}


@pytest.mark.parametrize("case", sorted(LOW_DATA_WAIT))
def test_low_data_wait_never_advises_a_bigger_batch_unmeasured(case):
    findings = diagnose(LOW_DATA_WAIT[case]())
    assert not advises_bigger_batch(findings), [f["change"] for f in findings]
    assert "data_loading_bound" not in findings.codes
    line = verdict_line(findings.stage, findings)
    assert "(unverified)" in line or "healthy" in line
    for f in findings:
        assert f["expected_gain"]["basis"], f


@pytest.mark.parametrize("case", ["b3_smoke", "b2_frozen_like", "b2_highres_like"])
def test_low_util_with_low_data_wait_is_host_bound(case):
    findings = diagnose(LOW_DATA_WAIT[case]())
    host = next(f for f in findings if f["code"] == "host_bound_step")
    assert host["evidence"]["main_process_step_share"]["value"] >= 0.95
    assert host["change"].endswith(".tune: true")  # measure, don't guess
    assert "More workers do not help" in host["why"]


def test_frozen_waiting_on_its_loader_gets_more_workers():
    findings = diagnose(recorded("frozen"))
    top = findings[0]
    assert top["code"] == "data_loading_bound" and top["change"] == "stages.frozen.workers: 8"
    assert top["candidate"] == {"workers": 8}
    assert top["expected_gain"]["speedup"] == pytest.approx(1 / (1 - 0.44623), rel=1e-3)  # data-wait 44.6 %
    assert "host_bound_step" not in findings.codes and not advises_bigger_batch(findings)


@pytest.mark.parametrize("stage", ["smoke", "frozen", "finetune", "highres"])
def test_no_val_period_advice_that_would_skip_nothing(stage):
    # The old diagnosis told these stages "val_period: 2": smoke has 1 epoch and the others already validated only
    # their last (of 2) epochs, which always runs, so that advice saved nothing. The advice is now the measured
    # saving (validations skipped x mean validation time), and it is not given when that is zero.
    findings = diagnose(recorded(stage))
    assert not any("val_period" in f["change"] or any("val_period" in a for a in f["also"]) for f in findings)
    assert any(n["code"] == "periodic_stalls" and "always runs" in n["reason"] for n in findings.not_evaluated)


def test_val_period_advice_carries_its_measured_saving():
    t = copy.deepcopy(recorded("finetune"))  # 2 epochs, validated only at the end; make it 6 epochs, every epoch
    t["epochs"] = [dict(t["epochs"][1], epoch=i, validated=True) for i in range(6)]
    t["config"].update(epochs=6, val_period=1)
    val = next(f for f in diagnose(t) if f["code"] == "periodic_stalls")
    n = int(val["change"].rsplit(" ", 1)[1])
    e = t["epochs"][0]
    loop = 6 * (e["train_s"] + e["val_s"] + e["checkpoint_s"] + e["logging_s"])
    skipped = 6 - sum(1 for i in range(1, 7) if i % n == 0 or i == 6)
    assert val["expected_gain"]["saves_share"] == pytest.approx(skipped * e["val_s"] / loop, abs=1e-4)


def test_markdown_labels_unverified_advice_and_names_tune():
    md = diagnosis_markdown(diagnose(recorded("smoke")))
    assert "(unverified)" in md and "Expected gain:" in md and "## Tune" in md and "Not run" in md
