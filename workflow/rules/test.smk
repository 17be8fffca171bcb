# The final score on data held out from training: the last stage's weights on data.yaml's test: split.


rule evaluate_test:
    input:
        weights=get_final_weights(),
        data=rules.prepare_dataset.output.data,
    output:
        json=f"{RUN}/test/test_metrics.json",
        md=f"{RUN}/test/test_metrics.md",
    log:
        f"{RUN}/logs/evaluate_test.log",
    benchmark:
        f"{RUN}/benchmarks/evaluate_test.tsv"
    conda:
        "../../envs/stagedyolo.yaml"
    threads: get_train_threads()
    resources:
        gpu=1,
    params:
        img=get_final_spec()["img"],
        batch=get_test_batch(),
        device=get_final_spec()["device"],
        # trained with the last stage's single_cls, the weights detect one class (val.py must be told)
        single_cls=bool(get_final_spec().get("single_cls")),
    script:
        "../scripts/evaluate_test.py"
