"""Per-stage yolov5 options: documented in the schema, checked before any job, and present in yolov5's resolved opt."""

import sys

import pytest
import yaml
from snakemake_runner import REPO, make_workdir, snakemake
from stage_specs import small_stage_plan, small_stage_spec

from stagedyolo.config import ConfigError, check_config
from stagedyolo.engine.options import YOLOV5_OPTIONS
from stagedyolo.recipe import STAGE_KEYS, stage_spec

SCHEMA = yaml.safe_load((REPO / "workflow" / "schemas" / "config.schema.yaml").read_text())
CONFIG = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
SPEC = small_stage_spec(epochs=3)

# A value for each option that differs from yolov5's parse_opt default, so the test fails if it is not passed on.
NON_DEFAULT = {
    "cos_lr": True,
    "rect": True,
    "multi_scale": True,
    "label_smoothing": 0.1,
    "image_weights": True,
    "single_cls": True,
    "noautoanchor": True,
    "quad": True,
    "save_period": 2,
    "seed": 7,
    "patience": 5,
}


@pytest.fixture(scope="module")
def train_module():
    """yolov5's train.py as the worker loads it (imports torch and yolov5: ~10 s), removed again afterwards."""
    from stagedyolo.engine.train_module import load_train

    saved = sys.modules.get("yolov5.train")
    yield load_train()
    if saved is None:
        sys.modules.pop("yolov5.train", None)
    else:
        sys.modules["yolov5.train"] = saved


def test_every_accepted_option_has_a_test_value():
    assert set(NON_DEFAULT) == set(YOLOV5_OPTIONS)


def test_every_stage_key_is_documented_with_type_description_and_default():
    stage = SCHEMA["$defs"]["stage"]["properties"]
    defaults = SCHEMA["properties"]["stage_defaults"]["properties"]
    for key in STAGE_KEYS:
        assert stage[key].get("description"), key
        assert "type" in stage[key] or "enum" in stage[key] or "oneOf" in stage[key], key
        assert "default" in defaults[key], key
    for key in ("label_smoothing", "save_period", "seed", "patience", "time_budget_min"):  # the numeric ones
        assert {"minimum", "exclusiveMinimum"} & set(stage[key]), key


@pytest.mark.parametrize("option", sorted(NON_DEFAULT))
def test_an_option_set_in_the_config_reaches_yolov5s_resolved_opt(tmp_path, train_module, option):
    from stagedyolo.engine.worker import build_opt

    argv, sys.argv = sys.argv, sys.argv[:1]
    default = getattr(train_module.parse_opt(known=True), option)
    sys.argv = argv
    assert default != NON_DEFAULT[option]
    config = {**CONFIG, "stage_order": ["only"], "stages": {"only": {option: NON_DEFAULT[option]}}}
    spec = {**SPEC, **{k: v for k, v in stage_spec(config, "only").items() if k in YOLOV5_OPTIONS}}
    plan = small_stage_plan(spec, tmp_path, stage="only", data=tmp_path / "data.yaml", work_dir=tmp_path / "work")
    (tmp_path / "work").mkdir()  # the supervisor's, where build_opt writes the stage's hyp file
    opt = build_opt(train_module, plan, "cpu")
    assert getattr(opt, option) == NON_DEFAULT[option]


def test_options_left_unset_keep_yolov5s_defaults_except_patience(tmp_path, train_module):
    from stagedyolo.engine.worker import build_opt

    plan = small_stage_plan(SPEC, tmp_path, data=tmp_path / "data.yaml", work_dir=tmp_path / "work")
    (tmp_path / "work").mkdir()
    opt = build_opt(train_module, plan, "cpu")
    assert (opt.cos_lr, opt.rect, opt.label_smoothing, opt.save_period, opt.seed) == (False, False, 0.0, -1, 0)
    assert opt.patience == 0  # yolov5's 100 would end a planned stage early: opt-in here


def test_a_misspelt_option_fails_before_any_job_naming_the_key(tmp_path):
    workdir = make_workdir(tmp_path)
    (workdir / "bad.yaml").write_text("stages:\n  frozen:\n    cos-lr: true\n")
    result = snakemake(workdir, "-n", configfiles=[workdir / "bad.yaml"], check=False)
    assert result.returncode != 0
    assert "'cos-lr' was unexpected" in result.stdout + result.stderr
    assert not (workdir / "results").exists()


@pytest.mark.parametrize(
    ("stages", "expected"),
    [
        ({"frozen": {"image_weights": True, "gpus": 2, "batch": 16}}, "stages.frozen.image_weights: yolov5 refuses"),
        ({"finetune": {"single_cls": True}}, "stages.finetune.single_cls: True differs from stage frozen"),
    ],
)
def test_combinations_yolov5_would_refuse_mid_run_fail_at_parse_time(stages, expected):
    config = {
        **CONFIG,
        "stages": {name: {**(CONFIG["stages"][name] or {}), **stages.get(name, {})} for name in CONFIG["stages"]},
    }
    with pytest.raises(ConfigError, match=expected.replace(".", r"\.")):
        check_config(config, REPO)


def test_single_cls_for_the_whole_run_is_fine():
    config = {**CONFIG, "stage_defaults": {**CONFIG["stage_defaults"], "single_cls": True}}
    check_config(config, REPO)


def test_save_period_zero_reaches_yolov5_as_its_off_value(tmp_path):
    # yolov5's loggers compute epoch % save_period on every save: 0 would divide by zero mid-stage.
    plan = small_stage_plan({**SPEC, "save_period": 0}, tmp_path)
    assert plan["options"]["save_period"] == -1
