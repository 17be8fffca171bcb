from stagedyolo.report import build_report_for_rule

build_report_for_rule(
    snakemake.input.timings,
    summary_md=snakemake.output.md,
    log_path=snakemake.log[0],
    test_metrics=snakemake.input.test_metrics,
    env=snakemake.input.env,
)
