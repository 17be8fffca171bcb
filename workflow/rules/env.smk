rule verify_env:
    output:
        json=f"{RUN}/env/env.json",
        md=f"{RUN}/env/env.md",
    log:
        f"{RUN}/logs/verify_env.log",
    localrule: True
    conda:
        "../../envs/stagedyolo.yaml"
    params:
        device=config["device"],
        cache_dir=config["cache"]["dir"],
    script:
        "../scripts/verify_env.py"
