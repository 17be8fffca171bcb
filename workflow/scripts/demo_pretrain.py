from stagedyolo.demo import pretrain_demo_weights

pretrain_demo_weights(
    snakemake.input.data,
    snakemake.output.weights,
    settings=snakemake.params.pretrain,
    cfg=snakemake.params.cfg,
    stage_defaults=snakemake.params.stage_defaults,
    device=snakemake.params.device,
    threads=snakemake.threads,
    log_path=snakemake.log[0],
)
