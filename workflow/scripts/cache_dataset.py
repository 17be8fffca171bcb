from stagedyolo.dataset import cache_dataset
from stagedyolo.recipe import boxes_need_img, image_store_sizes

cache_dataset(
    snakemake.input.data,
    decision_out=snakemake.output.decision,
    mode=snakemake.params.cache["mode"],
    safety_margin=snakemake.params.cache["ram_safety_margin"],
    max_img=snakemake.params.max_img,
    log_path=snakemake.log[0],
    # the sizes the stages will load at: an early phase's img may follow the data's box sizes (recipe.stage_img)
    store_sizes=image_store_sizes(snakemake.params.store_stages, boxes_need_img(snakemake.input.dataset_report)),
)
