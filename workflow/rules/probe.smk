rule probe:
    input:
        data=rules.prepare_dataset.output.data,
        cache=rules.cache_dataset.output.decision,
        weights=get_model_weights() or [],
    output:
        tuning=f"{RUN}/probe/tuning.json",
    params:
        probe=config["probe"],
        stage_defaults=config["stage_defaults"],
        cfg=config["model"]["cfg"],
        device=config["device"],
        img=get_max_stage_img(),
    conda:
        "../../envs/stagedyolo.yaml"
    log:
        f"{RUN}/logs/probe.log",
    threads: workflow.cores
    resources:
        gpu=1,
    script:
        "../scripts/probe.py"
