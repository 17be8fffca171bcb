# stagedyolo: run `snakemake --cores 8 --resources gpu=1` here. The workflow itself (its table of contents) is
# workflow/Snakefile, imported below exactly as another project would import it (docs/cluster.md), so that both
# uses run the same code. Rule names stay unprefixed and `all` stays the default target.


configfile: "config/config.yaml"


module stagedyolo:
    snakefile:
        "workflow/Snakefile"
    config:
        config


use rule * from stagedyolo
