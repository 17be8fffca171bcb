"""`stagedyolo recipe`: the measured recipe's shape, written for a user's data as a --configfile override."""

import math
import sys
from pathlib import Path

import pytest
import yaml
from dataset_testing import tree_sha256
from snakemake.utils import update_config
from snakemake_runner import REPO, make_workdir, snakemake

from stagedyolo.cli import main
from stagedyolo.demo import TARGET_CLASSES, DemoSpec, write_demo_dataset
from stagedyolo.engine.options import base_hyp
from stagedyolo.recipe import stage_names, stage_spec
from stagedyolo.recipe_shape import linear_lrf, recipe_epochs, recipe_override

sys.path.insert(0, str(REPO / "benchmarks"))
from naive_vs_staged import untuned_config  # noqa: E402

SHIPPED = yaml.safe_load((REPO / "config" / "config.yaml").read_text())


def override_for(img=480, total=30, boxes_need=224, **kwargs) -> dict:
    return recipe_override(
        Path("data.yaml"), img, total, weights=None, shipped=SHIPPED, yolov5_hyp=base_hyp(), boxes_need=boxes_need,
        **kwargs,
    )  # fmt: skip


def merged(override: dict) -> dict:
    """config.yaml with ``override`` applied as Snakemake applies a --configfile (key by key, nested)."""
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    update_config(config, override)
    return config


def test_the_written_recipe_is_the_one_the_benchmark_measured():
    # det at 480 px, boxes needing 224 px, phases at half the target: naive_vs_staged's det480 runs (0.52x)
    measured = untuned_config("det", Path("data.yaml"), Path("w.pt"), 480, 14, 14, boxes_need=224, small_share=0.5)
    written = override_for()
    assert written["stages"] == measured["stages"]
    assert written["stage_order"] == measured["stage_order"] == ["smoke", "frozen", "finetune", "highres"]
    assert [(s["epochs"], s.get("img")) for s in written["stages"].values()] == [
        (2, 256),
        (4, 256),
        (78, 256),
        (6, None),
    ]


def test_over_config_yaml_it_trains_with_yolov5s_own_hyp_on_one_lr_line():
    config = merged(override_for())
    hyp, scratch_low = config["stage_defaults"]["hyp"], base_hyp()
    assert hyp and all(hyp[key] == scratch_low[key] for key in hyp)  # the demo's obj, cls, mosaic and warmup undone
    assert config["stage_defaults"]["optimizer"] == "SGD" and config["stage_defaults"]["lr0"] == 0.01
    specs = [stage_spec(config, stage) for stage in stage_names(config)]
    assert [spec["img"] for spec in specs] == [256, 256, 256, 480]
    assert specs[-1]["hyp"]["mosaic"] == 0.0 and all(spec["continues"] for spec in specs[1:])
    # each stage's lrf takes the LR down the same straight line, to about lr0/100 at the end (lrf rounded to 0.01)
    assert math.prod(spec["hyp"]["lrf"] for spec in specs) == pytest.approx(0.01, rel=0.15)
    assert [spec["hyp"]["lrf"] for spec in specs] == linear_lrf([spec["epochs"] for spec in specs])


def test_the_stages_train_the_single_runs_pixels_at_the_size_the_boxes_allow():
    def pixels(epochs, trained):
        return sum(n * size**2 for n, size in zip(epochs, trained))

    for boxes_need, trained_small in ((224, 256), (320, 320), (None, 256)):
        epochs = recipe_epochs(30, 480, 256, 4, boxes_need)
        trained = [trained_small] * 3 + [480]
        assert pixels(epochs, trained) <= 30 * 480**2 < pixels(epochs, trained) + trained_small**2
    # boxes that need the target size leave nothing to spend: the single run's epochs
    assert sum(recipe_epochs(30, 480, 256, 4, 480)) == 30


@pytest.fixture
def user_data(tmp_path):
    source = tmp_path / "mydata"
    write_demo_dataset(source, DemoSpec(TARGET_CLASSES, 24, 8))
    return source / "data.yaml"


def test_the_cli_writes_an_override_snakemake_plans_and_leaves_the_data_as_it_was(tmp_path, user_data, capsys):
    before = tree_sha256(user_data.parent)
    out = tmp_path / "my.yaml"
    assert main(["recipe", str(user_data), "--img", "96", "--epochs", "8", "--minutes", "2", "-o", str(out)]) == 0
    text = out.read_text()
    assert text.startswith("# The staged recipe for") and "Run: snakemake" in text
    written = yaml.safe_load(text)
    assert written["dataset"] == str(user_data.resolve()) and written["run"] == "mydata"
    assert written["recipe_minutes"] == 2 and written["model"]["weights"] is None
    assert tree_sha256(user_data.parent) == before  # only read
    # an existing file is never overwritten
    assert main(["recipe", str(user_data), "--img", "64", "--epochs", "6", "-o", str(out)]) == 2
    assert out.read_text() == text and "exists" in capsys.readouterr().err
    # the real workflow takes it: schema, config checks, and the four stages planned in order, each continuing
    plan = snakemake(make_workdir(tmp_path / "project"), "-n", configfiles=[out]).stdout
    for previous, stage in zip(written["stage_order"], written["stage_order"][1:]):
        block = plan.split(f"wildcards: stage={stage}")[0].rsplit("rule train_stage:", 1)[1]
        assert f"stages/{previous}/continue.pt" in block, stage


def test_a_broken_data_yaml_gets_the_validators_message(tmp_path, capsys):
    missing = tmp_path / "data.yaml"
    missing.write_text("train: images/train\nval: images/val\nnames: [a]\n")
    assert main(["recipe", str(missing), "--img", "320", "--epochs", "30"]) == 2
    assert "Fix: correct `train:`" in capsys.readouterr().err  # the validator names the key and the fix


def test_without_the_config_it_overrides_it_says_what_to_give(tmp_path, user_data, capsys):
    absent = tmp_path / "none.yaml"
    assert main(["recipe", str(user_data), "--img", "96", "--epochs", "8", "--base", str(absent)]) == 2
    assert f"no {absent}: give --base" in capsys.readouterr().err


def test_a_run_too_short_to_stage_is_refused_with_the_reason(user_data, capsys):
    assert main(["recipe", str(user_data), "--img", "320", "--epochs", "3"]) == 2
    assert "at least 5 epochs" in capsys.readouterr().err
