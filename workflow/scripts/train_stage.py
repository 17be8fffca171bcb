from stagedyolo.launch import exit_when_job_starter_dies

# Snakemake killed (kill -9) must not leave this stage training and publishing on its own: end it with Snakemake.
exit_when_job_starter_dies()

from stagedyolo.recipe import boxes_need_img, run_outline  # noqa: E402  (the watch starts first)
from stagedyolo.stage import train_stage  # noqa: E402

train_stage(
    snakemake.params.inputs,
    snakemake.wildcards.stage,
    # the progress line's run ETA only: decides nothing the stage trains
    run_stages=run_outline(snakemake.config, boxes_need_img(snakemake.input.dataset_report)),
    data=snakemake.input.data,
    dataset_report=snakemake.input.dataset_report,
    cache_decision=snakemake.input.cache,
    weights=list(snakemake.input.weights),
    probe=list(snakemake.input.probe),
    timing_path=snakemake.output.timing,
    threads=snakemake.threads,
    attempt=snakemake.resources.attempt,
    log_path=snakemake.log[0],
)
