"""Stages as phases of one training (stagedyolo.engine.continuation), on the real engine: a stage that continues the
previous one takes up its optimizer state, EMA and update count and learning rate, warms up only once and runs no
second AutoAnchor; a restart (previous_weights) does none of that; the published last.pt stays yolov5's."""

import csv
from pathlib import Path

import pytest
import torch
import yaml
from stage_specs import small_stage_spec

from stagedyolo.demo import TARGET_CLASSES, DemoSpec, write_demo_dataset
from stagedyolo.engine.continuation import HANDOVER_NAME
from stagedyolo.jsonio import read_json
from stagedyolo.stage import run_stage
from stagedyolo.stage_plan import build_plan

EPOCHS_FIRST = 2
SPEC = small_stage_spec(
    epochs=EPOCHS_FIRST,
    lr0=0.004,
    hyp={"lrf": 0.5, "warmup_epochs": 1.0, "mosaic": 0.0},
    nominal_batch=8,
    min_warmup_iters=0,
)


def run(tmp_path, data, stage, spec, weights=None):
    plan = build_plan(
        spec,
        stage=stage,
        data=data,
        weights=weights,
        cfg="yolov5n.yaml",
        cache_mode="none",
        threads=2,
        work_dir=tmp_path / "work" / stage,
    )
    run_stage(
        plan,
        stage_dir=tmp_path / "stages" / stage,
        attempt=1,
        log_path=tmp_path / f"{stage}.log",
        engine_home=tmp_path / "engine",
    )
    return tmp_path / "stages" / stage


def lr_rows(stage_dir: Path) -> list[list[float]]:
    """Each epoch's LR of the three param groups (biases, weights, BatchNorm), as results.csv logs them: the LR of
    the epoch's last iteration."""
    with open(stage_dir / "results.csv") as handle:
        rows = [{k.strip(): v for k, v in row.items()} for row in csv.DictReader(handle)]
    return [[float(row[f"x/lr{i}"]) for i in range(3)] for row in rows]


def load(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=False)


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    """first (from cfg, warmup 1 epoch) -> continued (start_from previous) and -> restarted (previous_weights)."""
    tmp = tmp_path_factory.mktemp("chain")
    data = write_demo_dataset(tmp / "data", DemoSpec(TARGET_CLASSES, 16, 8))
    first = run(tmp, data, "first", {**SPEC, "start_from": "model"})
    handover = first / HANDOVER_NAME
    continued = run(
        tmp,
        data,
        "continued",
        {**SPEC, "epochs": 1, "start_from": "previous", "continues": True, "lr_from_previous": True, "freeze": 10},
        weights=handover,
    )
    restarted = run(
        tmp,
        data,
        "restarted",
        {**SPEC, "epochs": 1, "start_from": "previous_weights"},
        weights=first / "weights" / "last.pt",
    )
    return {"first": first, "continued": continued, "restarted": restarted}


def test_the_handover_keeps_what_continuation_needs_and_last_pt_stays_yolov5s(chain):
    handover, last = load(chain["first"] / HANDOVER_NAME), load(chain["first"] / "weights" / "last.pt")
    assert handover["optimizer"] and handover["ema"] is not None and handover["updates"] > 0
    assert handover["recipe_epochs"] == EPOCHS_FIRST and handover["epoch"] == EPOCHS_FIRST - 1
    assert last["optimizer"] is None and last["epoch"] == -1 and last["model"] is not None  # stripped, as yolov5 does


def test_a_continued_stage_takes_up_optimizer_ema_and_the_handed_over_lr(chain):
    handover = load(chain["first"] / HANDOVER_NAME)
    record = read_json(chain["continued"] / "stage.json")["continuation"]
    assert record["optimizer"] == "restored" and record["ema_updates"] == handover["updates"]
    assert record["recipe_epochs_before"] == EPOCHS_FIRST
    # The LR at the boundary: the first stage hands over the LR its scheduler set for the epoch after its last.
    # The first stage is yolov5's own run, whose LambdaLR runs one epoch behind (train.py sets last_epoch =
    # start_epoch - 1 after the constructor has stepped once), so that is lr0 * lf(E - 1), lf(x) = (1 - x / E) *
    # (1 - lrf) + lrf. The continued stage trains its first epoch there, in all three groups: no warmup.
    lrf = SPEC["hyp"]["lrf"]
    handed_over = SPEC["lr0"] * ((1 - (EPOCHS_FIRST - 1) / EPOCHS_FIRST) * (1 - lrf) + lrf)
    assert record["lr0"] == pytest.approx(handed_over)
    assert lr_rows(chain["continued"])[0] == pytest.approx([handed_over] * 3, rel=1e-4)  # results.csv: 5 digits
    # A continued stage's schedule is not behind: its one epoch ran at lf(0) and it hands over its own lrf's end
    # (behind, it would hand over lf(0) again and its lrf would change nothing).
    groups = load(chain["continued"] / HANDOVER_NAME)["optimizer"]["param_groups"]
    assert [group["lr"] for group in groups] == pytest.approx([handed_over * lrf] * 3)
    # The EMA went on counting from the first stage's updates.
    assert load(chain["continued"] / HANDOVER_NAME)["updates"] > handover["updates"]
    assert load(chain["continued"] / HANDOVER_NAME)["recipe_epochs"] == EPOCHS_FIRST + 1


def test_a_continued_stage_keeps_the_optimizers_moments_a_restart_throws_away(chain):
    before = load(chain["first"] / HANDOVER_NAME)["optimizer"]["state"]
    after = load(chain["continued"] / HANDOVER_NAME)["optimizer"]["state"]
    restarted = load(chain["restarted"] / HANDOVER_NAME)["optimizer"]["state"]
    some = next(i for i in before if "step" in before[i])
    # AdamW's step count of a parameter trained in both stages (the head: layer 24 is not frozen) goes on.
    head = max(before)
    assert float(after[head]["step"]) > float(before[head]["step"])
    assert float(restarted[head]["step"]) < float(before[head]["step"])
    # A parameter frozen in the continued stage kept the moments it had.
    assert torch.equal(after[some]["exp_avg"], before[some]["exp_avg"])


def test_warmup_runs_once_the_restart_warms_up_again(chain):
    first, restarted = lr_rows(chain["first"]), lr_rows(chain["restarted"])
    assert first[0][0] != pytest.approx(first[0][1])  # epoch 0 of the first stage: the bias LR still warming
    assert restarted[0][0] != pytest.approx(restarted[0][1])  # the restart warms up again
    assert lr_rows(chain["continued"])[0] == pytest.approx([lr_rows(chain["continued"])[0][0]] * 3)  # no warmup


def test_a_continued_stage_runs_no_autoanchor_and_its_plan_says_why(chain):
    record = read_json(chain["continued"] / "stage.json")
    assert record["options"]["noautoanchor"] is True and record["hyp"]["warmup_epochs"] == 0.0
    assert "AutoAnchor" not in (chain["continued"].parent.parent / "continued.log").read_text()
    assert "AutoAnchor" in (chain["restarted"].parent.parent / "restarted.log").read_text()


def test_a_continued_stage_draws_its_own_shuffles_and_augmentations(chain):
    # train.py seeds the sampler and the augmentations at its start: at the first stage's seed a continued stage
    # would replay the first stage's epochs draw for draw. It runs at the seed plus the epochs already trained.
    seeds = {stage: yaml.safe_load((folder / "opt.yaml").read_text())["seed"] for stage, folder in chain.items()}
    assert seeds == {"first": 0, "continued": EPOCHS_FIRST, "restarted": 0}
    assert read_json(chain["continued"] / "stage.json")["continuation"]["seed"] == EPOCHS_FIRST
