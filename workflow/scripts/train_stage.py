from stagedyolo.launch import exit_when_job_starter_dies

# Snakemake killed (kill -9) must not leave this stage training and publishing on its own: end it with Snakemake.
exit_when_job_starter_dies()

from stagedyolo.stage import train_stage  # noqa: E402  (the watch starts first)

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
