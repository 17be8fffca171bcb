from stagedyolo.engine.compat import skip_exit_collection
from stagedyolo.evaluate import evaluate_for_rule

evaluate_for_rule(
    snakemake.input.weights,
    snakemake.input.data,
    snakemake.output.json,
    snakemake.output.md,
    img=snakemake.params.img,
    batch=snakemake.params.batch,
    device=snakemake.params.device,
    threads=snakemake.threads,
    log_path=snakemake.log[0],
    single_cls=snakemake.params.single_cls,
)
skip_exit_collection()  # torch is loaded and the outputs are written: end without its teardown's collections
