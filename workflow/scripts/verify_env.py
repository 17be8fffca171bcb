from stagedyolo.engine.compat import skip_exit_collection
from stagedyolo.envcheck import verify_env

verify_env(
    snakemake.params.device,
    snakemake.params.cache_dir,
    json_path=snakemake.output.json,
    md_path=snakemake.output.md,
    log_path=snakemake.log[0],
)
skip_exit_collection()  # torch is loaded and the outputs are written: end without its teardown's collections
