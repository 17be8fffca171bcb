from stagedyolo.launch import exit_when_job_starter_dies

# Snakemake killed (kill -9) must not leave this stage training and publishing on its own: end it with Snakemake.
exit_when_job_starter_dies()

from stagedyolo.jsonio import read_json  # noqa: E402  (the watch starts first)
from stagedyolo.recipe import boxes_need_in, run_outline, split_images  # noqa: E402
from stagedyolo.stage import train_stage  # noqa: E402

# The size the data's boxes need, read once: the stage's plan and the run's outline both apply it (recipe.stage_img).
dataset_report = read_json(snakemake.input.dataset_report)
boxes_need = boxes_need_in(dataset_report)
train_stage(
    snakemake.params.inputs,
    snakemake.wildcards.stage,
    # the progress line's run ETA only: decides nothing the stage trains
    run_stages=run_outline(snakemake.config, boxes_need),
    data=snakemake.input.data,
    boxes_need=boxes_need,
    previous_timing=list(snakemake.input.gate),
    images=split_images(dataset_report),  # what a stage under the recipe's time budget sizes its epochs by
    cache_decision=snakemake.input.cache,
    weights=list(snakemake.input.weights),
    probe=list(snakemake.input.probe),
    timing_path=snakemake.output.timing,
    threads=snakemake.threads,
    attempt=snakemake.resources.attempt,
    log_path=snakemake.log[0],
)
