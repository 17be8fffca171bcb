# The user's dataset is only ever read: training uses a validated working copy in the run's own folder in cache.dir.
# A changed image or label changes source_fingerprint, and Snakemake re-stages.


# It reads only the data, so it runs beside verify_env (on the demo the environment check's 3 s overlap the data
# preparation); the probe and every training job wait for both.
rule prepare_dataset:
    input:
        source=get_source_data_yaml(),
    output:
        data=f"{RUN}/data/data.yaml",
        report_json=f"{RUN}/data/dataset_report.json",
        report_md=f"{RUN}/data/dataset_report.md",
    log:
        f"{RUN}/logs/prepare_dataset.log",
    conda:
        "../../envs/stagedyolo.yaml"
    params:
        cache_dir=config["cache"]["dir"],
        checks=config["dataset_checks"],
        source_fingerprint=get_source_fingerprint(),
    script:
        "../scripts/prepare_dataset.py"


rule cache_dataset:
    input:
        data=rules.prepare_dataset.output.data,
        dataset_report=rules.prepare_dataset.output.report_json,
    output:
        decision=f"{RUN}/data/cache.json",
    log:
        f"{RUN}/logs/cache_dataset.log",
    conda:
        "../../envs/stagedyolo.yaml"
    params:
        cache=config["cache"],
        max_img=get_max_stage_img(),
        store_stages=get_image_store_stages(),
    script:
        "../scripts/cache_dataset.py"
