from stagedyolo.stage import train_stage

train_stage(
    snakemake.config,
    snakemake.wildcards.stage,
    data=snakemake.input.data,
    cache_decision=snakemake.input.cache,
    weights=list(snakemake.input.weights),
    probe=list(snakemake.input.probe),
    timing_path=snakemake.output.timing,
    threads=snakemake.threads,
    attempt=snakemake.resources.attempt,
    log_path=snakemake.log[0],
)
