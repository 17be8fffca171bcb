from stagedyolo.report import build_report_for_rule

build_report_for_rule(
    snakemake.params.stages,
    md_path=snakemake.output.md,
    html_path=snakemake.output.html,
    plots_dir=snakemake.output.plots,
    env_json=snakemake.input.env,
    log_path=snakemake.log[0],
)
