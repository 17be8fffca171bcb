from stagedyolo.tracking import track_run_for_rule

track_run_for_rule(
    snakemake.output.record,
    test_json=snakemake.input.test_json,
    export_json=next((f for f in snakemake.input.export if f.endswith(".json")), None),
    files=[snakemake.input.test_json, snakemake.input.test_md, *snakemake.input.export, snakemake.input.report],
    settings=snakemake.params.tracking,
    run_name=snakemake.params.run,
    log_path=snakemake.log[0],
)
