rule report:
    input:
        timings=expand(f"{RUN}/stages/{{stage}}/timing.json", stage=get_stage_names()),
        env=rules.verify_env.output.json,
    output:
        md=f"{RUN}/report/summary.md",
        html=report(
            f"{RUN}/report/summary.html",
            caption="../report/summary.rst",
            category="Summary",
        ),
        phases=report(
            f"{RUN}/report/phases.png",
            caption="../report/phases.rst",
            category="Timing",
        ),
        utilization=report(
            f"{RUN}/report/utilization.png",
            caption="../report/utilization.rst",
            category="Timing",
        ),
        throughput=report(
            f"{RUN}/report/throughput.png",
            caption="../report/throughput.rst",
            category="Timing",
        ),
        map50=report(
            f"{RUN}/report/map50.png",
            caption="../report/map50.rst",
            category="Accuracy",
        ),
    log:
        f"{RUN}/logs/report.log",
    localrule: True
    conda:
        "../../envs/stagedyolo.yaml"
    script:
        "../scripts/report.py"
