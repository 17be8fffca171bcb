"""A bad config fails before any job runs, with a message that names the key or file and the fix."""

import pytest
import yaml
from snakemake_runner import REPO, make_workdir, snakemake

from stagedyolo.config import ConfigError, check_config, coerce_cli_strings
from stagedyolo.recipe import stage_names, unlisted_stages

SCHEMA = yaml.safe_load((REPO / "workflow" / "schemas" / "config.schema.yaml").read_text())


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("stages:\n  frozen:\n    epoch: 3\n", "'epoch' was unexpected"),  # unknown key (a typo)
        ("stages:\n  frozen:\n    epochs: many\n", "'many' is not of type 'integer'"),  # wrong type
        ("stages:\n  finetune:\n    epochs: -2\n", "-2 is less than the minimum of 1"),  # negative epoch count
        ("dataset: data/missing.yaml\nmodel:\n  weights: null\n", "dataset: 'data/missing.yaml' does not exist"),
        ("model:\n  weights: yolov5s.pt\n", "model.weights: 'yolov5s.pt' does not exist"),
        ("stage_defaults:\n  gpus: 4\n  batch: 30\n", "stages.smoke.batch: 30 is the total batch over 4 GPUs"),
        ("stages:\n  smoke:\n    hyp: {lr_zero: 1}\n", "stages.smoke.hyp: unknown hyp key(s) ['lr_zero']"),
        ("run: ..\n", "run: '..' must be a plain folder name"),  # would write (and clean up) above results_dir
        ("results_dir: ../elsewhere\n", "results_dir: '../elsewhere' contains '..'"),
        ("engine:\n  warm_start: true\n", "engine.warm_start: the warm-start server was removed"),
        ("tracking:\n  backend: wandb\n", "'wandb' is not one of ['none', 'mlflow', 'tensorboard']"),
        ("export:\n  formats: [tflite]\n", "'tflite' is not one of ['onnx', 'torchscript']"),
    ],
)
def test_a_bad_config_fails_before_any_job_with_a_clear_message(tmp_path, override, expected):
    workdir = make_workdir(tmp_path)
    (workdir / "bad.yaml").write_text(override)
    result = snakemake(workdir, "-n", configfiles=[workdir / "bad.yaml"], check=False)
    assert result.returncode != 0
    assert expected in result.stdout + result.stderr
    assert not (workdir / "results").exists()


def test_command_line_values_get_the_schema_types():
    # snakemake --config 'stages={finetune: {epochs: 3}}' hands over the string "3"
    config = {"run": "001", "stages": {"finetune": {"epochs": "3", "amp": "true", "batch": "auto"}}, "device": "0"}
    coerced = coerce_cli_strings(config, SCHEMA)
    assert coerced["stages"]["finetune"] == {"epochs": 3, "amp": True, "batch": "auto"}
    # an integer or auto: "auto" is kept, a number is read as one (it failed validation as the string "0")
    numbers = coerce_cli_strings({"stages": {"finetune": {"workers": "0", "batch": "16"}}}, SCHEMA)
    assert numbers["stages"]["finetune"] == {"workers": 0, "batch": 16}
    assert coerced["run"] == "001" and coerced["device"] == "0"  # strings where the schema allows strings


def test_a_run_name_from_the_command_line_cannot_escape_results_dir(tmp_path):
    workdir = make_workdir(tmp_path)
    result = snakemake(workdir, "-n", "--config", "run=..", check=False)
    assert result.returncode != 0 and "run: '..' must be a plain folder name" in result.stdout + result.stderr


def planned_stage_inputs(dry_run: str) -> dict[str, str]:
    """Each planned train_stage job's stage, with the input line of its job."""
    planned = {}
    for block in dry_run.split("rule train_stage:")[1:]:
        inputs = next(line for line in block.splitlines() if line.strip().startswith("input:"))
        planned[block.split("wildcards: stage=")[1].split()[0]] = inputs
    return planned


@pytest.mark.parametrize("how", ["--config", "--configfile"])
def test_overriding_one_stage_keeps_the_recipe_in_its_order(tmp_path, how):
    # Snakemake merges an override's stages mapping with its keys first: read from the mapping, finetune would
    # become the first stage and train from the pretrained weights.
    workdir = make_workdir(tmp_path)
    if how == "--config":
        result = snakemake(workdir, "-n", "--config", "stages={finetune: {epochs: 9}}")
    else:
        (workdir / "mine.yaml").write_text("stages:\n  finetune:\n    epochs: 9\n")
        result = snakemake(workdir, "-n", configfiles=[workdir / "mine.yaml"])
    planned = planned_stage_inputs(result.stdout)
    order = yaml.safe_load((REPO / "config" / "config.yaml").read_text())["stage_order"]
    assert sorted(planned) == sorted(order)
    assert "demo/pretrained.pt" in planned[order[0]]
    for previous, stage in zip(order, order[1:]):
        assert f"stages/{previous}/continue.pt" in planned[stage], (stage, planned[stage])


def test_stage_order_runs_the_stages_it_lists_and_names_an_undefined_one():
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    shorter = {**config, "stage_order": ["smoke", "finetune"]}
    assert stage_names(shorter) == ["smoke", "finetune"] and unlisted_stages(shorter) == ["frozen", "highres"]
    assert stage_names({**config, "stage_order": None}) == list(config["stages"])  # unset: the mapping's order
    with pytest.raises(ConfigError, match=r"stage_order: \['fnetune'\] not defined under stages"):
        check_config({**config, "stage_order": ["smoke", "fnetune"]})
