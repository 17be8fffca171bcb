# stagedyolo: a measured, staged YOLOv5 training pipeline. This file is only a table of contents.
from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/env.smk"
include: "workflow/rules/demo.smk"
include: "workflow/rules/dataset.smk"
include: "workflow/rules/probe.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/report.smk"


rule all:
    input:
        get_final_outputs(),
    default_target: True
