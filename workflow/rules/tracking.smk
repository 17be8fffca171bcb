# Experiment tracking (tracking.backend mlflow or tensorboard): each stage is logged from its published files by a
# job of its own, so a tracker failure can never kill a stage (docs/export-test-tracking.md). The job itself never
# fails on a tracker error either (it logs it and writes a record saying so): a failed job would stop later stages.


rule track_stage:
    input:
        timing=f"{RUN}/stages/{{stage}}/timing.json",
        previous=get_previous_tracking_record,
    output:
        record=f"{RUN}/tracking/stages/{{stage}}.json",
    log:
        f"{RUN}/logs/tracking/{{stage}}.log",
    wildcard_constraints:
        stage="|".join(get_stage_names()),
    localrule: True
    conda:
        "../../envs/stagedyolo.yaml"
    params:
        tracking=config["tracking"],
        run=config["run"],
    script:
        "../scripts/track_stage.py"


rule track_run:
    input:
        stages=expand(f"{RUN}/tracking/stages/{{stage}}.json", stage=get_stage_names()),
        test_json=rules.evaluate_test.output.json,
        test_md=rules.evaluate_test.output.md,
        export=get_export_targets(),
        report=rules.report.output.md,
    output:
        record=f"{RUN}/tracking/run.json",
    log:
        f"{RUN}/logs/tracking/run.log",
    localrule: True
    conda:
        "../../envs/stagedyolo.yaml"
    params:
        tracking=config["tracking"],
        run=config["run"],
    script:
        "../scripts/track_run.py"
