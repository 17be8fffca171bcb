"""The recipe_ablation benchmark's sides and analysis: each side takes out exactly one part of the shipped recipe,
and its ratio to the shipped recipe is measured, bounded or absent as the design says (synthetic rows)."""

import copy
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import recipe_ablation  # noqa: E402
from naive_vs_staged import FIXED_TARGETS, UNTUNED  # noqa: E402
from recipe_ablation import BEST, JUDGED, SIDES, ablated, analyse_repeat, markdown, summarise  # noqa: E402

SHIPPED = yaml.safe_load((Path(__file__).resolve().parents[1] / "config" / "config.yaml").read_text())


def _differences(side: str, config: dict = SHIPPED) -> set[tuple[str, str]]:
    before, after = config["stages"], ablated(config, side)["stages"]
    keys = {(stage, key) for stage in before for key in {*before[stage], *after[stage]}}
    return {(stage, key) for stage, key in keys if before[stage].get(key) != after[stage].get(key)}


def test_each_side_takes_out_one_part_and_nothing_else():
    assert _differences("staged") == set()
    assert {key for _, key in _differences("no_continuity")} == {"start_from"}
    assert ("smoke", "start_from") not in _differences("no_continuity")  # the first stage starts the training anyway
    assert {key for _, key in _differences("no_resolution")} == {"img"}
    assert _differences("no_freezing") == {("frozen", "freeze")}
    # the demo keeps mosaic off in stage_defaults, so taking highres's own setting away changes no training there
    assert _differences("no_close_mosaic") == {("highres", "hyp")}
    assert SHIPPED["stage_defaults"]["hyp"]["mosaic"] == 0.0


@pytest.mark.parametrize(
    "name, img, small, epochs",
    [("mixed", 320, 256, [2, 2, 12, 4]), ("det", 160, 128, [2, 4, 18, 6]), ("det320", 320, 256, [2, 4, 18, 6])],
)
def test_on_an_untuned_set_the_sides_take_out_the_same_parts_of_its_recipe_and_judge_it_at_its_target_size(
    name, img, small, epochs, monkeypatch, tmp_path
):
    # recipe() builds the set it trains on (det320: det's own set, at det's ablation size) and the recipe at the
    # target size the data set is judged at; the generator is replaced, so nothing is drawn
    made = []
    source = recipe_ablation.SOURCE.get(name, name)
    spec = replace(UNTUNED[source], make=lambda folder, train, val: made.append((Path(folder).name, train, val)))
    monkeypatch.setattr(recipe_ablation, "UNTUNED", {source: spec})
    monkeypatch.setattr(recipe_ablation, "WORK", tmp_path)
    monkeypatch.setattr(recipe_ablation, "demo_inputs", lambda: {"weights": Path("w.pt")})
    config = recipe_ablation.recipe(name)
    train, val = recipe_ablation.SIZES.get(name, (spec.train, spec.val))
    assert made == [(f"{source}_data_{train}_{val}", train, val)]
    assert [stage["epochs"] for stage in config["stages"].values()] == epochs
    assert [stage.get("img", img) for stage in config["stages"].values()] == [small, small, small, img]
    assert config["stage_defaults"]["img"] == img == JUDGED[name][0] and JUDGED["demo"] == (160, FIXED_TARGETS)
    assert {key for _, key in _differences("no_continuity", config)} == {"start_from"}
    assert _differences("no_freezing", config) == {("frozen", "freeze")}
    assert {key for _, key in _differences("no_resolution", config)} == {"img"}
    assert {stage["img"] for stage in ablated(config, "no_resolution")["stages"].values()} == {img}
    # the final phase keeps the earlier phases' mosaic (yolov5's default): only its own mosaic 0 is taken away
    assert _differences("no_close_mosaic", config) == {("highres", "hyp")}
    assert config["stages"]["highres"]["hyp"]["mosaic"] == 0.0
    assert "mosaic" not in ablated(config, "no_close_mosaic")["stages"]["highres"]["hyp"]
    assert "mosaic" not in config["stage_defaults"]["hyp"]


def _run(wall, *points):
    return {"wall_s": wall, "rows": [{"s": s, "map50": m, "img": 160, "stage": "x", "epoch": 0} for s, m in points]}


def test_ratios_to_the_shipped_recipe_are_measured_or_bounded():
    runs = {
        "staged": _run(100, (40, 0.6), (80, 0.95)),
        "no_continuity": _run(150, (60, 0.6), (120, 0.95)),
        "no_resolution": _run(130, (50, 0.75)),  # never reaches 0.9 or the staged best
        "no_freezing": _run(90, (30, 0.6), (70, 0.96)),
        "no_close_mosaic": _run(100, (40, 0.6), (80, 0.95)),  # the A/A pair of the demo: ratios of 1
    }
    repeat = analyse_repeat(runs, 160, FIXED_TARGETS)
    assert repeat["targets"][BEST] == 0.95
    assert repeat["ratio_vs_staged"]["no_continuity"]["0.5"] == {"ratio": 1.5, "kind": "measured"}
    assert repeat["ratio_vs_staged"]["no_resolution"]["0.9"]["kind"].startswith("lower bound")
    assert repeat["ratio_vs_staged"]["no_resolution"]["0.9"]["ratio"] == 130 / 80
    assert repeat["ratio_vs_staged"]["no_freezing"][BEST]["ratio"] == 70 / 80
    assert repeat["ratio_vs_staged"]["no_close_mosaic"]["0.9"] == {"ratio": 1.0, "kind": "measured"}
    summary = summarise([repeat, repeat, repeat])
    assert summary["ratio_vs_staged"]["no_continuity"]["0.5"]["ratio"]["median"] == 1.5
    assert summary["ratio_vs_staged"]["no_resolution"]["0.9"]["ratio"] is None  # bounds are not medians
    seeded_repeats = [{**repeat, "seed": seed} for seed in (0, 1, 2)]
    table = "\n".join(markdown({"dataset": "demo", "repeats": 3, "summary": summary, "per_repeat": seeded_repeats}))
    assert all(f"| {side} |" in table for side in SIDES)
    assert "| 3 | 2 | no_resolution | 0.750 | 130 | 50 | 50 | — | — |" in table  # per repeat: seed, best, s to each


def test_repeat_i_trains_every_side_at_seed_i_and_leaves_the_recipe_as_it_was(monkeypatch, tmp_path):
    trained, saved = [], []

    def fake_run(config, workdir, side):
        trained.append((workdir.parent.name, side, config["stage_defaults"].get("seed")))
        return _run(10, (5, 0.6), (8, 0.95))

    recipe = yaml.safe_load(yaml.safe_dump(SHIPPED))
    monkeypatch.setattr(recipe_ablation, "recipe", lambda dataset: recipe)
    monkeypatch.setattr(recipe_ablation, "run_staged", fake_run)
    monkeypatch.setattr(recipe_ablation, "save", lambda name, result, lines: saved.append(result))
    recipe_ablation.main(["--seeds", "7,8,9", "--workdir", str(tmp_path)])
    assert sorted(trained) == sorted((f"r{i}", side, 7 + i) for i in range(3) for side in SIDES)
    assert [r["seed"] for r in saved[-1]["per_repeat"]] == [7, 8, 9]
    assert "seed" not in recipe["stage_defaults"]


def test_the_cut_sides_are_one_training_cut_at_the_recipes_boundaries_and_the_same_training_uncut():
    recipe = yaml.safe_load(yaml.safe_dump(SHIPPED))
    recipe["stages"]["frozen"]["handover_on_stall"] = 0.25
    before = copy.deepcopy(recipe)
    split, whole = ablated(recipe, "split_only"), ablated(recipe, "one_run")
    assert list(split["stages"]) == list(recipe["stages"])
    for name, stage in split["stages"].items():
        # only the cut is left: the stage's epochs, LR line (hyp.lrf), start and checkpointing are the recipe's
        assert {key: stage.get(key) for key in ("epochs", "start_from", "nosave")} == {
            key: recipe["stages"][name].get(key) for key in ("epochs", "start_from", "nosave")
        }
        assert stage["hyp"] == {k: v for k, v in recipe["stages"][name]["hyp"].items() if k != "mosaic"}
        assert not {"img", "freeze", "handover_on_stall"} & set(stage) and stage["val_period"] == 1
    epochs = sum(stage["epochs"] for stage in recipe["stages"].values())
    assert whole["stage_order"] == ["train"]
    assert whole["stages"] == {"train": {"epochs": epochs, "start_from": "model", "val_period": 1}}
    assert whole["stage_defaults"] == recipe["stage_defaults"]  # the fair control's settings, untouched
    assert recipe == before  # the recipe the other sides are cut from is left as it was


def test_sides_runs_staged_and_the_named_sides_only(monkeypatch, tmp_path):
    trained, saved = [], []

    def fake_run(config, workdir, side):
        trained.append(side)
        return _run(10, (5, 0.6), (8, 0.95))

    monkeypatch.setattr(recipe_ablation, "recipe", lambda dataset: yaml.safe_load(yaml.safe_dump(SHIPPED)))
    monkeypatch.setattr(recipe_ablation, "run_staged", fake_run)
    monkeypatch.setattr(recipe_ablation, "save", lambda name, result, lines: saved.append((result, lines)))
    recipe_ablation.main(["--sides", "split_only,one_run", "--workdir", str(tmp_path)])
    assert sorted(trained) == sorted(["staged", "split_only", "one_run"] * 3)
    result, lines = saved[-1]
    assert list(result["summary"]["best_map50"]) == ["staged", "split_only", "one_run"]
    assert set(result["summary"]["ratio_vs_staged"]) == {"split_only", "one_run"}
    assert any(line.startswith("| one_run |") for line in lines)
    with pytest.raises(SystemExit, match="unknown"):
        recipe_ablation.main(["--sides", "no_such_side", "--workdir", str(tmp_path)])


def test_equal_time_lengthens_only_the_fine_tune_and_keeps_the_stages_on_one_lr_line(monkeypatch, tmp_path):
    spec = replace(UNTUNED["det"], make=lambda folder, train, val: None)
    monkeypatch.setattr(recipe_ablation, "UNTUNED", {"det": spec})
    monkeypatch.setattr(recipe_ablation, "WORK", tmp_path)
    monkeypatch.setattr(recipe_ablation, "demo_inputs", lambda: {"weights": Path("w.pt")})
    config = recipe_ablation.recipe("det320")
    before = copy.deepcopy(config)
    longer = ablated(config, "equal_time", "det320")
    assert config == before
    assert [stage["epochs"] for stage in longer["stages"].values()] == [
        2,
        4,
        recipe_ablation.EQUAL_TIME_FINETUNE["det320"],
        6,
    ]
    for name, stage in longer["stages"].items():
        changed = {
            key for key in {*stage, *config["stages"][name]} if stage.get(key) != config["stages"][name].get(key)
        }
        assert changed <= {"epochs", "hyp"} and (name == "finetune") == ("epochs" in changed)
        assert {k: v for k, v in stage["hyp"].items() if k != "lrf"} == {
            k: v for k, v in config["stages"][name]["hyp"].items() if k != "lrf"
        }
    # each stage hands over lr0 x the product of the lrfs so far: the line ends near lr0/100 after all 41 epochs
    # (linear_lrf rounds each lrf to two places)
    handed_over = 1.0
    for stage in longer["stages"].values():
        handed_over *= stage["hyp"]["lrf"]
    assert handed_over == pytest.approx(0.01, rel=0.1)
    assert longer["stages"]["finetune"]["hyp"]["lrf"] < config["stages"]["finetune"]["hyp"]["lrf"]
    with pytest.raises(KeyError):
        ablated(config, "equal_time", "demo")  # no figures to size it by
    with pytest.raises(SystemExit, match="det320 only"):
        recipe_ablation.main(["--sides", "equal_time", "--workdir", str(tmp_path)])


def test_where_one_run_ran_its_best_is_a_target_of_every_side():
    runs = {
        "staged": _run(100, (40, 0.6), (80, 0.7)),
        "one_run": _run(120, (60, 0.6), (110, 0.8)),
        "equal_time": _run(118, (50, 0.6), (100, 0.81)),
    }
    repeat = analyse_repeat(runs, 160, (0.5,))
    assert repeat["targets"] == {"0.5": 0.5, BEST: 0.7, recipe_ablation.ONE_RUN_BEST: 0.8}
    assert repeat["time_s"]["equal_time"][recipe_ablation.ONE_RUN_BEST] == 100
    assert repeat["ratio_vs_staged"]["one_run"][recipe_ablation.ONE_RUN_BEST]["kind"] == "staged never reached it"
    table = "\n".join(
        markdown({"dataset": "det320", "repeats": 1, "summary": summarise([repeat]), "per_repeat": [repeat]})
    )
    assert "| ratio to one_run_best |\n" in table and "| 1 | 0 | equal_time | 0.810 | 118 | 50 | 100 | 100 |" in table
    # every row of a markdown table has as many cells as its header
    header, rule, *rows = table.split("\n\n")[2].split("\n")
    assert {row.count("|") for row in rows} == {header.count("|")} == {rule.count("|")}
