from pathlib import Path

from stagedyolo.tracking import track_stage_for_rule

track_stage_for_rule(
    str(Path(snakemake.input.timing).parent),
    snakemake.output.record,
    settings=snakemake.params.tracking,
    run_name=snakemake.params.run,
    log_path=snakemake.log[0],
)
