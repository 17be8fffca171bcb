# The last stage's weights as ONNX and TorchScript (yolov5's exporter), each checked against PyTorch on one image.


rule export:
    input:
        weights=get_final_weights(),
        data=rules.prepare_dataset.output.data,
    output:
        **get_export_files(),
        check=f"{RUN}/export/export.json",
    log:
        f"{RUN}/logs/export.log",
    benchmark:
        f"{RUN}/benchmarks/export.tsv"
    conda:
        "../../envs/stagedyolo.yaml"
    threads: get_train_threads()
    params:
        export=config["export"],
        img=get_final_spec()["img"],
    script:
        "../scripts/export.py"
