import psutil

from stagedyolo.probe import probe_for_rule
from stagedyolo.recipe import planned_epochs, planned_training_s, probe_stage_specs

probe_for_rule(
    snakemake.input.data,
    dataset_report=snakemake.input.dataset_report,
    cache_decision=snakemake.input.cache,
    weights=list(snakemake.input.weights),
    tuning_out=snakemake.output.tuning,
    settings=snakemake.params.probe,
    batches=snakemake.params.batches,
    stages=probe_stage_specs(snakemake.config),  # as they are now: not all of them are rule params
    stage_defaults=snakemake.params.stage_defaults,
    cfg=snakemake.params.cfg,
    device=snakemake.params.device,
    img=snakemake.params.img,
    threads=snakemake.threads,
    log_path=snakemake.log[0],
    planned_epochs=planned_epochs(snakemake.config),
    planned_training_s=planned_training_s(snakemake.config),
    started_unix=psutil.Process().create_time(),  # the budget counts this process's start-up too
)
