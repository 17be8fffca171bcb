"""The naive_vs_staged benchmark's analysis: which rows count, how each side's time and the ratio are got.

Synthetic rows stand in for the poller's stamps: the rules under test are the design's (same image size only,
the control's best budget per target, bounds labelled), not the timings."""

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from naive_vs_staged import (  # noqa: E402
    BEST,
    RESTART_DEMO_STAGES,
    analyse_repeat,
    base_config,
    markdown,
    restart_config,
    seeded,
    summarise,
    untuned_config,
    untuned_restart_stages,
)

from stagedyolo.recipe import stage_names, stage_spec  # noqa: E402


def _rows(*points, img=128, stage="s"):
    return [{"s": s, "stage": stage, "epoch": i, "map50": m, "img": img} for i, (s, m) in enumerate(points)]


def _repeat(staged_rows, control_rows_by_budget, newcomer_rows, newcomer_wall=150.0):
    runs = [{"side": "staged", "wall_s": 100.0, "rows": staged_rows}]
    runs += [{"side": "control", "budget": b, "wall_s": 10.0 * b, "rows": r} for b, r in control_rows_by_budget.items()]
    runs.append({"side": "newcomer", "budget": 10, "wall_s": newcomer_wall, "rows": newcomer_rows})
    return [{**run, "load_before": [1.0, 1.0, 1.0], "load_after": [2.0, 1.0, 1.0]} for run in runs]


def test_rows_at_another_image_size_never_count():
    staged = _rows((20, None), (30, 0.6)) + _rows((50, 0.95), img=160, stage="highres")
    result = analyse_repeat(_repeat(staged, {5: _rows((40, 0.92))}, _rows((60, 0.1))), img=128)
    assert result["vs_control"]["0.5"]["staged_s"] == 30
    assert result["vs_control"]["0.9"]["ratio"] is None  # 0.95 was validated at 160 px only
    assert result["vs_control"]["0.9"]["ratio_kind"] == "staged never reached it"
    assert result["staged_best_map50"] == 0.6


def test_control_time_is_its_best_budget_and_its_best_map_is_a_target():
    staged = _rows((30, 0.75), (45, 0.91))
    controls = {5: _rows((20, 0.55), (50, 0.8)), 10: _rows((25, 0.6), (40, 0.72), (90, 0.93))}
    result = analyse_repeat(_repeat(staged, controls, _rows((100, 0.2))), img=128)
    assert result["vs_control"]["0.5"]["other_s"] == 20  # the 5-epoch budget got there first
    assert result["vs_control"]["0.7"]["other_s"] == 40
    assert result["vs_control"]["0.7"]["ratio"] == 30 / 40
    assert result["targets"][BEST] == 0.93
    assert result["vs_control"][BEST]["ratio_kind"] == "staged never reached it"


def test_a_side_that_never_reaches_a_target_gives_a_labelled_bound():
    staged = _rows((30, 0.75))
    result = analyse_repeat(_repeat(staged, {5: _rows((20, 0.9))}, _rows((100, 0.2))), img=128)
    cell = result["vs_newcomer"]["0.7"]
    assert cell["ratio_kind"].startswith("upper bound")
    assert cell["ratio"] == 30 / 150  # the newcomer ran 150 s without reaching it
    summary = summarise([result, result, result])
    assert summary["vs_newcomer"]["0.7"]["ratio"] is None  # bounds never enter the median
    assert summary["vs_newcomer"]["0.7"]["bound"]["max"] == 0.2
    assert summary["vs_control"]["0.5"]["ratio"]["median"] == 1.5


def test_markdown_renders_every_target_and_run():
    staged = _rows((30, 0.75), (45, 0.91))
    runs = _repeat(staged, {5: _rows((20, 0.55)), 10: _rows((40, 0.72))}, _rows((100, 0.2)))
    repeats = [analyse_repeat(runs, img=128)] * 3
    result = {
        "machine": {"cores": 2, "cpu_model": "test"},
        "repeats": {"demo": 3},
        "repeats_planned": 3,
        "benchmark_wall_s": 60.0,
        "datasets": {"demo": {"eval_img": 128, "budgets": [5, 10], "summary": summarise(repeats), "runs": [runs] * 3}},
    }
    text = "\n".join(markdown(result))
    for target in ("| 0.5 ", "| 0.7 ", "| 0.9 ", f"| {BEST} "):
        assert target in text
    assert text.count("| control 10 ep |") == 3


def test_the_restart_side_is_compared_with_the_control_and_the_staged_recipe():
    staged = _rows((30, 0.75), (45, 0.91))
    runs = _repeat(staged, {5: _rows((20, 0.55)), 10: _rows((40, 0.72), (60, 0.95))}, _rows((100, 0.2)))
    runs.append(
        {
            "side": "restart",
            "wall_s": 120.0,
            "rows": _rows((60, 0.6), (90, 0.92)),
            "load_before": [1.0] * 3,
            "load_after": [1.0] * 3,
        }
    )
    result = analyse_repeat(runs, img=128)
    assert result["restart_vs_control"]["0.5"]["ratio"] == 60 / 20
    assert result["vs_restart"]["0.9"]["ratio"] == 45 / 90
    assert result["whole_wall_s"]["restart"] == 120.0
    summary = summarise([result] * 3)
    assert summary["vs_restart"]["0.5"]["ratio"]["median"] == 0.5
    page = "\n".join(
        markdown(
            {
                "machine": {"cores": 2, "cpu_model": "cpu"},
                "repeats": {"demo": 3},
                "repeats_planned": 3,
                "benchmark_wall_s": 60.0,
                "datasets": {"demo": {"eval_img": 128, "budgets": [5, 10], "summary": summary, "runs": [runs]}},
            }
        )
    )
    assert "ratio staged / restart" in page and "| restart |" in page


def test_the_restart_recipes_run_exactly_their_own_stages(tmp_path):
    # Built from config.yaml, whose stage_order names four stages: the untuned restart recipe has three.
    base = base_config(tmp_path / "data.yaml", tmp_path / "pretrained.pt", "mixed")
    for stages in (RESTART_DEMO_STAGES, untuned_restart_stages(4, 18)):
        config = restart_config(base, stages)
        assert stage_names(config) == list(stages) == list(config["stages"])


def test_a_repeats_seed_reaches_every_stage_of_both_recipes_and_the_control(tmp_path):
    base = base_config(tmp_path / "data.yaml", tmp_path / "pretrained.pt", "demo")
    for config in (seeded(base, 2), seeded(restart_config(base, RESTART_DEMO_STAGES), 2)):
        assert {stage: stage_spec(config, stage)["seed"] for stage in stage_names(config)} == dict.fromkeys(
            stage_names(config), 2
        )
    # the fair control is one stage built on the same stage_defaults (run_control)
    control = {**seeded(base, 1), "stage_order": ["control"], "stages": {"control": {"epochs": 5}}}
    assert stage_spec(control, "control")["seed"] == 1
    assert "seed" not in base["stage_defaults"]  # the shared config is copied, not changed


def _pixels(config):
    target = config["stage_defaults"]["img"]
    return sum(stage["epochs"] * stage.get("img", target) ** 2 for stage in config["stages"].values())


def test_the_untuned_recipe_spends_what_its_smaller_size_saves_on_fine_tune_epochs(tmp_path):
    data, weights = tmp_path / "data.yaml", tmp_path / "pretrained.pt"
    for img, frozen, finetune in ((320, 14, 14), (160, 14, 14), (320, 6, 12), (640, 2, 2)):
        control_epochs = 2 + frozen + finetune
        shared = untuned_config("det", data, weights, img, frozen, finetune, spend_savings=False)
        spent = untuned_config("det", data, weights, img, frozen, finetune)
        assert sum(stage["epochs"] for stage in shared["stages"].values()) == control_epochs
        # as many pixels as the control's long budget: one more fine-tune epoch would train more
        control_pixels = control_epochs * img**2
        small = spent["stages"]["finetune"]["img"]
        assert _pixels(spent) <= control_pixels < _pixels(spent) + small**2
        changed = {
            name for name, stage in spent["stages"].items() if stage["epochs"] != shared["stages"][name]["epochs"]
        }
        assert changed == {"finetune"}
        # the stages still hand the LR down one line to about lr0/100 (each lrf is rounded to two places)
        assert math.prod(stage["hyp"]["lrf"] for stage in spent["stages"].values()) == pytest.approx(0.01, rel=0.15)
    assert [s["epochs"] for s in untuned_config("det", data, weights, 320, 14, 14)["stages"].values()] == [2, 4, 31, 6]
    # --small-share 0.5 at a 480-px target: every phase before the last at 256 px, the control's pixels there
    half = untuned_config("det", data, weights, 480, 14, 14, boxes_need=224, small_share=0.5)
    assert [(s["epochs"], s.get("img")) for s in half["stages"].values()] == [(2, 256), (4, 256), (78, 256), (6, None)]
    assert _pixels(half) <= 30 * 480**2 < _pixels(half) + 256**2


def test_the_savings_are_counted_at_the_size_the_boxes_let_the_phases_train_at(tmp_path):
    data, weights = tmp_path / "data.yaml", tmp_path / "pretrained.pt"

    def shape(img, frozen, finetune, boxes_need):
        config = untuned_config("mixed", data, weights, img, frozen, finetune, boxes_need=boxes_need)
        return [stage["epochs"] for stage in config["stages"].values()]

    # det's boxes need 224 px: its 256-px phases at a 320 target train at 256 and save pixels to spend
    assert shape(320, 14, 14, 224) == [2, 4, 31, 6]
    # mixed's boxes need 1280 px: img_from_boxes keeps every phase at 320, nothing is saved, the control's 20 epochs
    assert shape(320, 6, 12, 1280) == [2, 2, 12, 4]
    # part-way: phases raised from 256 to 288 save (320/288)^2, not (320/256)^2
    assert shape(320, 14, 14, 288) == [2, 4, 23, 6]
    assert shape(320, 14, 14, None) == shape(320, 14, 14, 224)  # no box figure: the configured size
