import json

import pytest
import yaml

from stagedyolo.engine.options import base_hyp, stage_hyp
from stagedyolo.probe.rule import worker_candidates
from stagedyolo.recipe import (
    boxes_need_img,
    image_store_sizes,
    image_store_stages,
    previous_stage,
    probe_batches,
    probe_needed,
    stage_img,
    stage_spec,
)
from stagedyolo.stage_plan import cpu_budget, scaled_lr0

CONFIG = yaml.safe_load(open("config/config.yaml"))


def test_stage_spec_merges_defaults_with_the_stage():
    spec = stage_spec(CONFIG, "finetune")
    assert (
        spec["img"] == CONFIG["stages"]["finetune"]["img"] and spec["epochs"] == CONFIG["stages"]["finetune"]["epochs"]
    )
    assert spec["lr0"] == CONFIG["stage_defaults"]["lr0"] and spec["optimizer"] == CONFIG["stage_defaults"]["optimizer"]
    assert spec["hyp"] == {**CONFIG["stage_defaults"]["hyp"], **CONFIG["stages"]["finetune"]["hyp"]}  # merged per key
    assert spec["device"] == CONFIG["device"]  # null stage device falls back to the top-level one
    assert previous_stage(CONFIG, "finetune") == "frozen"
    assert previous_stage(CONFIG, "smoke") is None


def test_every_stage_validates_at_the_last_stages_size_unless_it_names_its_own():
    stages = {"a": {"img": 96}, "b": {"img": 128, "val_img": 128}, "c": {"img": 192}}
    config = {**CONFIG, "stage_order": None, "stages": stages}
    assert [stage_spec(config, stage)["val_img"] for stage in "abc"] == [192, 128, 192]
    untold = {**config, "stages": {**config["stages"], "c": {}}}  # the last stage at stage_defaults' img
    assert stage_spec(untold, "a")["val_img"] == CONFIG["stage_defaults"]["img"]
    assert image_store_sizes(image_store_stages(config)) == {"train": [96, 128, 192], "val": [128, 192]}  # no val 96
    # A stage added at sizes another stage already loads at leaves cache_dataset's param, and so every stage, as is.
    polished = {**config, "stages": {**stages, "d": {"img": 192}}}
    assert image_store_stages(polished) == image_store_stages(config) and len(image_store_stages(config)) == 3


def test_an_early_phase_trains_at_no_less_than_its_boxes_need_and_never_above_the_target():
    config = {**CONFIG, "stage_order": None, "stages": {"a": {"img": 96}, "b": {"img": 128}, "c": {"img": 192}}}
    spec = {stage: stage_spec(config, stage) for stage in "abc"}
    assert stage_img(spec["a"], 64) == (96, {"configured": 96, "boxes_need": 64, "target": 192, "trained": 96})
    assert stage_img(spec["a"], 160) == (160, {"configured": 96, "boxes_need": 160, "target": 192, "trained": 160})
    assert stage_img(spec["b"], 224)[0] == 192  # capped at the target
    assert stage_img(spec["c"], 224) == (192, None)  # the target stage is the target
    assert stage_img(spec["a"], None) == (96, None)  # no box figure: no decision
    assert stage_img({**spec["a"], "img_from_boxes": False}, 160) == (96, None)
    assert image_store_sizes(image_store_stages(config), 160) == {"train": [160, 192], "val": [192]}


def test_the_box_figure_is_read_from_the_dataset_report(tmp_path):
    report = tmp_path / "dataset_report.json"
    train = {"box_short_side": {"min_img_for_95pct_at_stride": 224}}
    report.write_text(json.dumps({"splits": {"train": train, "val": {"box_short_side": None}}}))
    assert boxes_need_img(report) == 224
    report.write_text(json.dumps({"splits": {"train": {"box_short_side": None}}}))  # a data set without boxes
    assert boxes_need_img(report) is None and boxes_need_img(None) is None


def test_a_stage_after_the_first_continues_at_the_handed_over_lr_unless_it_names_its_own():
    config = {
        **CONFIG,
        "stage_order": None,
        "stages": {
            "a": {"start_from": "model"},
            "b": {},
            "c": {"lr0": 0.0001},
            "d": {"start_from": "previous_weights"},
        },
    }
    spec = {stage: stage_spec(config, stage) for stage in config["stages"]}
    assert [spec[s]["continues"] for s in "abcd"] == [False, True, True, False]
    assert [spec[s]["lr_from_previous"] for s in "abcd"] == [False, True, False, False]
    first = {**config, "stages": {"only": {}}}  # start_from: previous with no stage before it starts a training
    assert stage_spec(first, "only")["continues"] is False


def test_stage_hyp_is_complete_and_keeps_the_bias_warmup_at_the_low_lr():
    hyp = stage_hyp(1e-4, {"mosaic": 0.5})
    assert set(hyp) == set(base_hyp())  # yolov5 raises KeyError on a partial hyp file
    assert hyp["lr0"] == 1e-4 and hyp["warmup_bias_lr"] == 1e-4 and hyp["mosaic"] == 0.5
    assert stage_hyp(0.01, {})["warmup_bias_lr"] == 0.01
    assert stage_hyp(1e-4, {"warmup_bias_lr": 0.05})["warmup_bias_lr"] == 0.05  # explicit wins


def test_stage_hyp_rejects_unknown_keys():
    with pytest.raises(ValueError, match="lr_zero"):
        stage_hyp(0.01, {"lr_zero": 0.1})


@pytest.mark.parametrize(
    ("threads", "workers", "probe", "expected"),
    [(2, "auto", None, (1, 1)), (2, 0, None, (0, 2)), (2, "auto", {"workers": 0}, (0, 2)), (1, "auto", None, (0, 1))],
)
def test_cpu_budget_never_oversubscribes(threads, workers, probe, expected, monkeypatch):
    monkeypatch.setattr("stagedyolo.stage_plan.available_cores", lambda: 2)
    assert cpu_budget(threads, workers, probe) == expected
    assert cpu_budget(64, 1, None) == (1, 1)  # capped at the machine's 2 cores


def test_under_ddp_each_rank_gets_its_share_of_the_cores(monkeypatch):
    """4 GPUs on 16 cores: 4 ranks, each with its own workers and torch threads, 4 cores each. Until 2026-12-02
    every rank took 16 - workers torch threads: 14 each with 2 workers, 56 threads and 8 workers on 16 cores."""
    monkeypatch.setattr("stagedyolo.stage_plan.available_cores", lambda: 16)
    assert cpu_budget(16, "auto", None, gpus=4) == (2, 2)
    assert cpu_budget(16, "auto", {"workers": 12}, gpus=4) == (4, 1)  # at most the rank's cores, as yolov5 caps
    assert cpu_budget(16, 3, None, gpus=4) == (3, 1)  # an explicit count is the user's
    assert cpu_budget(16, "auto", {"workers": 12}) == (12, 4)  # one GPU: the probe's choice as measured


@pytest.mark.parametrize(
    ("cores", "expected"), [(1, [0, 1]), (2, [0, 1, 2]), (4, [0, 1, 2, 3]), (8, [0, 2, 4, 6]), (16, [0, 4, 8, 12])]
)
def test_auto_worker_candidates_spread_over_the_cores(cores, expected):
    assert worker_candidates("auto", cores) == expected
    assert worker_candidates([2, 0, 2], cores) == [0, 2]  # a list is taken as it is, once each


def test_the_probe_runs_only_when_enabled_and_some_stage_leaves_a_probed_key_at_auto():
    assert probe_needed(CONFIG)  # the demo leaves workers at auto
    pinned = {**CONFIG, "stage_defaults": {**CONFIG["stage_defaults"], "workers": 1, "batch": 16, "amp": False}}
    assert not probe_needed(pinned)
    one_auto = {**pinned, "stages": {**pinned["stages"], "highres": {**pinned["stages"]["highres"], "batch": "auto"}}}
    assert probe_needed(one_auto)
    assert not probe_needed({**one_auto, "probe": {**one_auto["probe"], "enabled": False}})


def test_the_probe_times_the_model_only_at_batches_a_stage_can_take():
    assert probe_batches(CONFIG) == [16]  # the demo fixes batch 16 and leaves workers at auto
    one_auto = {**CONFIG, "stages": {**CONFIG["stages"], "highres": {**CONFIG["stages"]["highres"], "batch": "auto"}}}
    assert probe_batches(one_auto) == CONFIG["probe"]["batch"]  # a batch: auto stage may take any candidate
    two_gpus = {**CONFIG, "stage_defaults": {**CONFIG["stage_defaults"], "batch": 64, "gpus": 2}}
    assert probe_batches(two_gpus) == [32]  # the probe measures one GPU's share of the total batch


def test_lr_is_not_scaled_by_default():
    assert scaled_lr0(0.01, 256, "none") == 0.01


def test_linear_lr_scaling_follows_the_effective_batch_yolov5_steps_with():
    assert scaled_lr0(0.01, 16, "linear") == pytest.approx(0.01)  # accumulate 4: already 64
    assert scaled_lr0(0.01, 64, "linear") == pytest.approx(0.01)
    assert scaled_lr0(0.01, 48, "linear") == pytest.approx(0.0075)  # accumulate rounds to 1
    assert scaled_lr0(0.01, 256, "linear") == pytest.approx(0.04)
    with pytest.raises(ValueError, match="lr_scaling must be one of none, linear"):
        scaled_lr0(0.01, 64, "sqrt")


def test_a_stage_across_nodes_plans_its_total_batch_over_every_rank_and_launches_on_each_node(tmp_path):
    from stage_specs import small_stage_plan, small_stage_spec

    from stagedyolo.worker_launch import worker_command

    spec = small_stage_spec(nodes=2, gpus=2, batch="auto", device="cuda", workers=1)
    plan = small_stage_plan(spec, tmp_path, threads=8, probe_choice={"batch": 8})
    assert (plan["nodes"], plan["gpus"], plan["batch"]) == (2, 2, 32)  # the probe's per-GPU 8 on 4 ranks
    env = {"SLURM_JOB_ID": "123", "SLURM_JOB_NODELIST": "gpu[1-2]", "SLURM_NNODES": "2"}
    argv, _ = worker_command(plan, tmp_path / "plan.json", env)
    assert argv[0] == "srun" and "--nnodes" in argv and argv[argv.index("--nnodes") + 1] == "2"


def test_a_batch_that_does_not_divide_over_every_node_and_gpu_is_refused_at_config_check():
    from stagedyolo.config import _check_stage

    config = {"stages": {"s": {"batch": 12, "gpus": 2, "nodes": 4}}, "stage_defaults": {"lr0": 0.01, "hyp": {}}}
    config["device"] = "cuda"
    problems = _check_stage(config, "s")
    assert any("total batch over 8 GPUs (4 nodes x 2)" in p and "use 8 or 16" in p for p in problems), problems


def test_the_plan_has_exactly_the_keys_stage_plan_declares(tmp_path):
    from stage_specs import small_stage_plan, small_stage_spec

    from stagedyolo.stage_plan import PLAN_KEYS_SET_LATER, StagePlan

    plan = small_stage_plan(small_stage_spec(), tmp_path)
    assert set(plan) == set(StagePlan.__annotations__) - set(PLAN_KEYS_SET_LATER)
