# The user's dataset is only ever read: training uses a validated working copy in the run's own folder in cache.dir.
# A changed image or label changes source_fingerprint, and Snakemake re-stages.


rule prepare_dataset:
    input:
        source=get_source_data_yaml(),
        env=rules.verify_env.output.json,
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
