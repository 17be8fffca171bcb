from stagedyolo.demo import pretrain_demo_weights

pretrain_demo_weights(
    snakemake.input.data,
    snakemake.output.weights,
    settings=snakemake.params.pretrain,
    cfg=snakemake.params.cfg,
    hyp=snakemake.params.hyp,
    device=snakemake.params.device,
    threads=snakemake.threads,
    log_path=snakemake.log[0],
)
