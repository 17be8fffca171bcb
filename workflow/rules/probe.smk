rule probe:
    input:
        env=rules.verify_env.output.json,  # a broken environment fails before any measuring
        data=rules.prepare_dataset.output.data,
        dataset_report=rules.prepare_dataset.output.report_json,
        cache=rules.cache_dataset.output.decision,
        weights=get_pretrained_input(),
    output:
        tuning=f"{RUN}/probe/tuning.json",
    log:
        f"{RUN}/logs/probe.log",
    conda:
        "../../envs/stagedyolo.yaml"
    threads: get_train_threads()
    resources:
        gpu=1,
    params:
        probe=config["probe"],
        batches=get_probe_batches(),
        stages=get_probe_stages(),  # a rerun trigger only; the script reads the stages from the config
        engine=get_probe_engine(),
        stage_defaults=config["stage_defaults"],
        cfg=config["model"]["cfg"],
        device=config["device"],
        img=get_max_stage_img(),
    script:
        "../scripts/probe.py"
