from stagedyolo.envcheck import verify_env

verify_env(
    snakemake.params.device,
    snakemake.params.cache_dir,
    json_path=snakemake.output.json,
    md_path=snakemake.output.md,
    log_path=snakemake.log[0],
)
