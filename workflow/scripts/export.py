from stagedyolo.engine.compat import skip_exit_collection
from stagedyolo.export import export_for_rule

export_for_rule(
    snakemake.input.weights,
    snakemake.input.data,
    outputs={fmt: snakemake.output[fmt] for fmt in snakemake.params.export["formats"]},
    comparison_json=snakemake.output.check,
    settings=snakemake.params.export,
    img=snakemake.params.img,
    threads=snakemake.threads,
    log_path=snakemake.log[0],
)
skip_exit_collection()  # torch is loaded and the outputs are written: end without its teardown's collections
