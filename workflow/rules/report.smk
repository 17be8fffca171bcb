rule report:
    input:
        timings=expand(f"{RUN}/stages/{{stage}}/timing.json", stage=get_stage_names()),
        env=rules.verify_env.output.json,
    output:
        md=f"{RUN}/report/report.md",
        html=report(
            f"{RUN}/report/report.html",
            caption="../report/summary.rst",
            category="Summary",
        ),
        plots=report(
            directory(f"{RUN}/report/plots"),
            patterns=["{name}.png"],
            caption="../report/plots.rst",
            category="Plots",
        ),
    params:
        stages=get_stage_dirs(),
    conda:
        "../../envs/stagedyolo.yaml"
    log:
        f"{RUN}/logs/report.log",
    localrule: True
    script:
        "../scripts/report.py"
