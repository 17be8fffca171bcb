# One rule for every training stage: stages are data (config "stages"), run in their config order.


rule train_stage:
    input:
        data=rules.prepare_dataset.output.data,
        dataset_report=rules.prepare_dataset.output.report_json,
        cache=rules.cache_dataset.output.decision,
        env=rules.verify_env.output.json,
        probe=get_probe_output(),
        weights=get_stage_weights,
        gate=get_stage_gate,
    output:
        **get_stage_outputs("{stage}"),
    log:
        f"{RUN}/logs/stages/{{stage}}.log",
    benchmark:
        f"{RUN}/benchmarks/stages/{{stage}}.tsv"
    wildcard_constraints:
        stage="|".join(get_stage_names()),
    # Only out-of-memory failures are worth a retry (at half the batch); the script fails other retries at once.
    retries: 2
    conda:
        "../../envs/stagedyolo.yaml"
    threads: get_train_threads()
    resources:
        gpu=get_stage_gpus,
        nodes=get_stage_nodes,
        attempt=get_attempt,
    params:
        inputs=get_stage_params,
    script:
        "../scripts/train_stage.py"
