"""Config checks for settings that pass the schema and fail (or hang, or write to the filesystem root) only once the
pipeline runs. Unit level: the Snakemake dry runs of test_config cover how a check reaches the user."""

import copy

import pytest
import yaml

from stagedyolo.config import ConfigError, check_before_schema, check_config

CONFIG = yaml.safe_load(open("config/config.yaml"))


@pytest.mark.parametrize("results_dir", ["", " ", "\t\n"])
def test_an_empty_results_dir_is_refused(results_dir):
    with pytest.raises(ConfigError, match=r"results_dir: .* is empty: every output path would start at the"):
        check_before_schema({**CONFIG, "results_dir": results_dir})
    check_before_schema({**CONFIG, "results_dir": "results"})
    check_before_schema({**CONFIG, "results_dir": "/scratch/me/results"})


def test_tune_on_a_multi_gpu_stage_is_refused_with_the_stage_keys_and_fix():
    stages = {"frozen": {"epochs": 1, "tune": True, "gpus": 2}, "finetune": {"epochs": 1, "gpus": 2}}
    with pytest.raises(ConfigError) as error:
        check_config({**CONFIG, "stage_order": list(stages), "stages": stages})
    message = str(error.value)
    assert "stages.frozen.tune: true cannot be combined with stages.frozen.gpus: 2" in message
    assert "30-minute DDP timeout" in message and "Set tune: false for this stage, or gpus: 1" in message
    assert "stages.finetune.tune" not in message
    check_config(
        {**CONFIG, "stage_order": list(stages), "stages": {**stages, "frozen": {"epochs": 1, "tune": True, "gpus": 1}}}
    )


def test_a_stall_handover_with_nosave_is_refused_before_any_job_runs():
    config = copy.deepcopy(CONFIG)
    config["stages"]["frozen"]["nosave"] = True
    with pytest.raises(ConfigError, match=r"stages.frozen: handover_on_stall needs every epoch saved"):
        check_config(config)
