rule verify_env:
    output:
        json=f"{RUN}/env/env.json",
        md=f"{RUN}/env/env.md",
    params:
        device=config["device"],
        cache_dir=get_cache_dir(),
    conda:
        "../../envs/stagedyolo.yaml"
    log:
        f"{RUN}/logs/verify_env.log",
    localrule: True
    script:
        "../scripts/verify_env.py"
