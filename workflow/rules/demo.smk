# The built-in demo: synthetic data, and pretrained weights made on a separate generic set (no download).


rule demo_dataset:
    output:
        target=f"{RUN}/demo/target/data.yaml",
        pretrain=f"{RUN}/demo/pretrain/data.yaml",
    log:
        f"{RUN}/logs/demo_dataset.log",
    conda:
        "../../envs/stagedyolo.yaml"
    params:
        demo=config["demo"],
    script:
        "../scripts/demo_dataset.py"


rule demo_pretrain:
    input:
        data=rules.demo_dataset.output.pretrain,
        env=rules.verify_env.output.json,
    output:
        weights=f"{RUN}/demo/pretrained.pt",
    log:
        f"{RUN}/logs/demo_pretrain.log",
    conda:
        "../../envs/stagedyolo.yaml"
    threads: get_train_threads()
    resources:
        gpu=1,
    params:
        pretrain=config["demo"]["pretrain"],
        cfg=config["model"]["cfg"],
        stage_defaults=config["stage_defaults"],
        device=config["device"],
    script:
        "../scripts/demo_pretrain.py"
