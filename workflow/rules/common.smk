# Helpers: every decision the rules need is a named get_* function; the logic lives in the stagedyolo package.
from snakemake.utils import validate

import yaml

from stagedyolo.checkout import share_checkout_with_jobs
from stagedyolo.config import check_before_schema, check_config, coerce_cli_strings
from stagedyolo.export import FORMATS as EXPORT_SUFFIXES
from stagedyolo.recipe import (
    image_store_stages,
    previous_stage,
    probe_batches,
    probe_engine,
    probe_needed,
    probe_rerun_stages,
    stage_names,
    stage_inputs,
    stage_spec,
    unlisted_stages,
)
from stagedyolo.stage_plan import available_cores

CONFIG_SCHEMA = workflow.source_path("../schemas/config.schema.yaml")
config.update(coerce_cli_strings(config, yaml.safe_load(open(CONFIG_SCHEMA))))
check_before_schema(config)
validate(config, schema="../schemas/config.schema.yaml")
check_config(config)
UNLISTED_STAGES = unlisted_stages(config)
if UNLISTED_STAGES:
    logger.warning(
        f"stages not in stage_order do not run: {', '.join(UNLISTED_STAGES)}"
    )

RUN = f"{config['results_dir']}/{config['run']}"

share_checkout_with_jobs()  # jobs in a conda env from envs/ get stagedyolo from this checkout


def get_final_outputs():
    return [f"{RUN}/report/summary.md", *get_export_targets(), *get_tracking_targets()]


def get_stage_names():
    return stage_names(config)


def get_train_threads():
    """Every core of the machine; Snakemake lowers it to --cores, and the stage splits it between torch and loaders."""
    return available_cores()


def get_source_data_yaml():
    """The user's data.yaml, or the demo's (built by the demo_dataset rule)."""
    if config["dataset"] == "demo":
        return f"{RUN}/demo/target/data.yaml"
    return config["dataset"]


def get_model_weights():
    """The pretrained checkpoint stages with start_from: model begin from; None means train from model.cfg."""
    weights = config["model"]["weights"]
    if weights == "demo":
        return f"{RUN}/demo/pretrained.pt"
    return weights


def get_pretrained_input():
    """model.weights as a list of input files: empty when training from model.cfg."""
    weights = get_model_weights()
    return [weights] if weights else []


def get_probe_output():
    """The probe's tuning.json, unless it is disabled or no stage leaves workers, batch or amp at auto."""
    return [f"{RUN}/probe/tuning.json"] if probe_needed(config) else []


def get_probe_batches():
    """The batch sizes the probe measures: only those a stage can take from it."""
    return probe_batches(config)


def get_probe_stages():
    """The stages' speed settings, a param of the probe only under a time budget (recipe.probe_rerun_stages):
    without one, changing a later stage's mosaic or workers reruns that stage, not the probe and every stage.
    """
    return probe_rerun_stages(config)


def get_probe_engine():
    """The step the probe's model runs time: the first stage's engine settings."""
    return probe_engine(config)


def get_stage_weights(wildcards):
    """The checkpoint a stage starts from: the previous stage's handover (continue.pt: its
    training continues), its last.pt (previous_weights: a new training from its weights), or
    the model's weights.
    """
    spec = stage_spec(config, wildcards.stage)
    previous = previous_stage(config, wildcards.stage)
    if spec["continues"]:
        return [get_stage_outputs(previous)["handover"]]
    if spec["start_from"] == "previous_weights" and previous:
        return [get_stage_outputs(previous)["last"]]
    return get_pretrained_input()


def get_stage_gate(wildcards):
    """Each stage waits for the one before it, even one it takes no weights from (smoke gates frozen)."""
    previous = previous_stage(config, wildcards.stage)
    return [f"{RUN}/stages/{previous}/timing.json"] if previous else []


def get_stage_params(wildcards):
    """Everything the stage's job reads from the config (stagedyolo.recipe.stage_inputs); Snakemake reruns the stage
    when it changes. (The run's outline, for the progress line's ETA, is read beside it and decides nothing.)
    """
    return stage_inputs(config, wildcards.stage)


def get_stage_gpus(wildcards):
    return stage_spec(config, wildcards.stage)["gpus"]


def get_stage_nodes(wildcards):
    """The nodes of the stage's allocation (a cluster executor's `nodes` resource; a local run ignores it)."""
    return stage_spec(config, wildcards.stage)["nodes"] or 1


def get_attempt(wildcards, attempt):
    """Snakemake's try number, passed to the script as a resource (scripts see no `attempt` otherwise)."""
    return attempt


def get_stage_outputs(stage):
    folder = f"{RUN}/stages/{stage}"
    return {
        "last": f"{folder}/weights/last.pt",
        "handover": f"{folder}/continue.pt",
        "results": f"{folder}/results.csv",
        "timing": f"{folder}/timing.json",
        "plan": f"{folder}/stage.json",
    }


def get_image_store_stages():
    """The stages that may cache in RAM, by what decides their sizes: the store cache_dataset decodes once for them."""
    return image_store_stages(config)


def get_max_stage_img():
    """The largest training image size of any stage: what a RAM cache must hold."""
    return max(stage_spec(config, stage)["img"] for stage in get_stage_names())


def get_final_stage():
    return get_stage_names()[-1]


def get_final_weights():
    """What the pipeline delivers: the last stage's last.pt (best.pt is absent with nosave)."""
    return f"{RUN}/stages/{get_final_stage()}/weights/last.pt"


def get_final_spec():
    """The last stage's settings: export and the test score use its image size, batch and device."""
    return stage_spec(config, get_final_stage())


def get_test_batch():
    """The last stage's batch on one device; auto (the probe's choice, not an input here) scores at 16."""
    spec = get_final_spec()
    return spec["batch"] // spec["gpus"] if isinstance(spec["batch"], int) else 16


def get_export_files():
    """One exported file per export.formats, named as yolov5's exporter names it."""
    return {
        fmt: f"{RUN}/export/model{EXPORT_SUFFIXES[fmt]}"
        for fmt in config["export"]["formats"]
    }


def get_export_targets():
    """The export rule's outputs when export.enabled, else nothing (the rule is then never planned)."""
    if not config["export"]["enabled"]:
        return []
    return [*get_export_files().values(), f"{RUN}/export/export.json"]


def get_tracking_targets():
    """tracking.backend none plans no tracking job at all."""
    return (
        [] if config["tracking"]["backend"] == "none" else [f"{RUN}/tracking/run.json"]
    )


def get_previous_tracking_record(wildcards):
    """Stages are tracked one after another: the first creates the pipeline run's parent record."""
    previous = previous_stage(config, wildcards.stage)
    return [f"{RUN}/tracking/stages/{previous}.json"] if previous else []


def get_source_fingerprint():
    """Names, sizes and mtimes of the dataset's images and labels: Snakemake re-stages when a label or image changes,
    not only the data.yaml. The demo dataset is built by a rule: nothing to read yet."""
    if config["dataset"] == "demo":
        return "demo"
    from stagedyolo.dataset.fingerprint import source_fingerprint

    return source_fingerprint(config["dataset"])
