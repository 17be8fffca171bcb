from stagedyolo.dataset import cache_dataset

cache_dataset(
    snakemake.input.data,
    decision_out=snakemake.output.decision,
    mode=snakemake.params.cache["mode"],
    safety_margin=snakemake.params.cache["ram_safety_margin"],
    max_img=snakemake.params.max_img,
    log_path=snakemake.log[0],
    store_sizes=snakemake.params.store_sizes,
)
