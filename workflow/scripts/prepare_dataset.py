from stagedyolo.dataset import prepare_dataset

prepare_dataset(
    snakemake.input.source,
    cache_dir=snakemake.params.cache_dir,
    data_out=snakemake.output.data,
    report_json=snakemake.output.report_json,
    report_md=snakemake.output.report_md,
    on_bad_data=snakemake.params.checks["on_bad_data"],
    max_bad_fraction=snakemake.params.checks["max_bad_fraction"],
    log_path=snakemake.log[0],
)
