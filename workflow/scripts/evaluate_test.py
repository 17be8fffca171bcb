from stagedyolo.engine.compat import skip_exit_collection
from stagedyolo.engine.plan import stage_names, stage_spec
from stagedyolo.evaluate import evaluate_for_rule

# The weights are the last stage's: trained with its single_cls, they detect one class (val.py must be told).
final_stage = stage_spec(snakemake.config, stage_names(snakemake.config)[-1])

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
    single_cls=bool(final_stage.get("single_cls")),
)
skip_exit_collection()  # torch is loaded and the outputs are written: end without its teardown's collections
