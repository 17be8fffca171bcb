"""The recipe's time budget (recipe_minutes): each stage sizes its epochs at its start, from the demo's recorded
timing.json of the stages before it (tests/fixtures/recipe_budget)."""

import copy
import json
from pathlib import Path

import pytest
import yaml

from stagedyolo.recipe import budget_inputs, stage_inputs, stage_names
from stagedyolo.recipe_budget import budget_markdown, budget_use, budgeted_settings, measured_costs, size_stage

CONFIG = yaml.safe_load(open("config/config.yaml"))
FIXTURES = Path(__file__).parent / "fixtures" / "recipe_budget"
IMAGES = (256, 64)  # the demo's training and validation images


def recorded(stage: str, freeze: int = 0) -> dict:
    timing = json.loads((FIXTURES / f"{stage}.timing.json").read_text())
    timing["config"]["freeze"] = freeze  # recorded before timing.json carried it
    return timing


def budgeted(minutes: float, **changes) -> dict:
    config = copy.deepcopy(CONFIG)
    config["recipe_minutes"] = minutes
    for stage, settings in changes.items():
        config["stages"][stage].update(settings)
    return config


def size(config: dict, stage: str, previous: dict | None, predictions: dict | None = None, first_rate=None) -> dict:
    return size_stage(
        budget_inputs(config, stage),
        previous=previous,
        predictions=predictions or {},
        first_rate=first_rate,
        images=IMAGES,
        boxes_need=None,
    )


def test_without_a_budget_the_stage_params_are_as_before_so_no_finished_stage_reruns():
    assert all("recipe_budget" not in stage_inputs(CONFIG, stage) for stage in stage_names(CONFIG))
    assert budget_inputs(CONFIG, "smoke") is None


def test_a_stage_shares_the_budget_with_the_later_stages_only():
    budget = budget_inputs(budgeted(2), "finetune")
    assert budget["budget_s"] == 120 and [s["stage"] for s in budget["stages"]] == ["finetune", "highres"]
    # a change to a later stage changes what the earlier ones share; a change to an earlier one leaves it alone
    longer_final = budgeted(2, highres={"epochs": 5})
    assert budget_inputs(longer_final, "smoke") != budget_inputs(budgeted(2), "smoke")
    assert budget_inputs(budgeted(2, smoke={"epochs": 5}), "finetune") == budget


def test_measured_costs_read_a_recorded_stage():
    smoke = measured_costs(recorded("smoke"))
    assert smoke["train_epoch_s"] == 2.7524  # its second epoch: the first carries the process's one-off costs
    assert (smoke["val_s"], smoke["checkpoint_s"]) == (1.4406, 0.2044)  # its one validation and one save
    assert 2.0 < smoke["fixed_s"] < 3.5  # its set-up (2.35 s) and ending: the wall-clock less its epochs
    assert (smoke["img"], smoke["freeze"]) == (128, 0)


def test_the_first_stage_without_a_probe_figure_trains_its_configured_epochs():
    decision = size(budgeted(2), "smoke", previous=None)
    assert (decision["epochs"], decision["factor"], decision["spent_s"]) == (2, None, 0.0)
    assert "nothing measured" in decision["basis"]


def test_the_first_stage_is_sized_from_the_probe_and_one_factor_scales_the_whole_recipe():
    small = size(budgeted(1), "smoke", previous=None, first_rate=100.0)
    large = size(budgeted(2), "smoke", previous=None, first_rate=100.0)
    assert small["basis"].startswith("the probe's first model run")
    assert large["factor"] == pytest.approx(2 * small["factor"], rel=1e-3)  # no set-up is predicted before any stage
    assert large["epochs"] == round(CONFIG["stages"]["smoke"]["epochs"] * large["factor"])
    predicted = size(budgeted(2), "smoke", previous=None, predictions={"smoke": 50.0}, first_rate=100.0)
    assert predicted["basis"].startswith("the probe's prediction") and predicted["factor"] < large["factor"]


def test_a_later_stage_counts_what_the_earlier_stages_took_and_the_last_one_fills_what_is_left():
    finetune = recorded("finetune")
    finetune["config"]["epochs_decision"] = {"spent_s": 22.0, "measured": [measured_costs(recorded("smoke"))]}
    decision = size(budgeted(1.5), "highres", previous=finetune)
    assert decision["spent_s"] == pytest.approx(22.0 + finetune["wall_s"], abs=0.01)
    assert decision["left_s"] == pytest.approx(90 - decision["spent_s"], abs=0.01)
    assert [m["stage"] for m in decision["measured"]] == ["smoke", "finetune"]  # handed on to the next stage
    assert decision["basis"] == "finetune measured, scaled by the pixel ratio"  # 160 px against finetune's 128
    epoch_s = (decision["predicted_s"] - decision["measured"][-1]["fixed_s"]) / decision["epochs"]
    assert abs(decision["predicted_s"] - decision["left_s"]) <= epoch_s / 2  # the last stage fills what is left
    assert decision["epochs"] > CONFIG["stages"]["highres"]["epochs"]


def test_a_stage_scales_from_the_latest_stage_that_froze_what_it_freezes():
    frozen = recorded("frozen", freeze=10)
    frozen["config"]["epochs_decision"] = {"spent_s": 10.3, "measured": [measured_costs(recorded("smoke"))]}
    decision = size(budgeted(2), "finetune", previous=frozen)
    assert decision["basis"].startswith("smoke measured")  # unfrozen like finetune; frozen's epochs are cheaper
    frozen_config = budgeted(2, finetune={"freeze": 10})
    assert size(frozen_config, "finetune", previous=frozen)["basis"].startswith("frozen measured")


def test_the_probes_predictions_scale_a_stage_where_it_measured_both():
    finetune = recorded("finetune")
    by_pixels = size(budgeted(1.5), "highres", previous=finetune)
    predicted = size(budgeted(1.5), "highres", previous=finetune, predictions={"finetune": 100.0, "highres": 80.0})
    assert predicted["basis"] == "finetune measured, scaled by the probe's predicted images/s"
    assert predicted["epochs"] > by_pixels["epochs"]  # 1.25x dearer by the probe, 1.5625x by the pixels


def test_a_spent_budget_leaves_one_epoch():
    finetune = recorded("finetune")
    finetune["config"]["epochs_decision"] = {"spent_s": 500.0, "measured": []}
    decision = size(budgeted(1), "highres", previous=finetune)
    assert (decision["epochs"], decision["factor"]) == (1, 0.0) and decision["left_s"] < 0


def test_no_stage_may_run_past_what_is_left_of_the_budget():
    decision = {"epochs": 7, "left_s": 90.0}
    assert budgeted_settings({"time_budget_min": None}, decision)["time_budget_min"] == 1.5
    assert budgeted_settings({"time_budget_min": 1.0}, decision)["time_budget_min"] == 1.0  # the stage's own is less
    spent = budgeted_settings({"time_budget_min": None}, {"epochs": 1, "left_s": -4.0})
    assert 0 < spent["time_budget_min"] < 0.01  # one epoch, then it ends


def test_the_report_sums_what_each_budgeted_stage_took_against_the_budget():
    config = budgeted(2)
    smoke = {**recorded("smoke"), "stopped_by": None}
    smoke["config"]["epochs_decision"] = size(config, "smoke", None)
    frozen = recorded("frozen", freeze=10)
    frozen["config"]["epochs_decision"] = size(config, "frozen", smoke)
    stages = [{"name": "smoke", "timing": smoke}, {"name": "frozen", "timing": frozen}, {"name": "finetune"}]
    use = budget_use(stages)
    assert use["budget_s"] == 120 and use["took_s"] == round(smoke["wall_s"], 1) + round(frozen["wall_s"], 1)
    assert [row["epochs"] for row in use["stages"]] == [2, frozen["config"]["epochs_decision"]["epochs"]]
    assert not use["every_stage"]  # finetune has no timing.json yet
    section = budget_markdown(use)
    assert f"The stages took {use['took_s']:.1f} s of the 120.0 s budget ({use['off_pct']:+.1f} %)" in section
    assert "| smoke | 2 | 2 |" in section and "left out of the sum" in section
    assert budget_use([{"name": "smoke", "timing": recorded("smoke")}]) is None and budget_markdown(None) == ""
