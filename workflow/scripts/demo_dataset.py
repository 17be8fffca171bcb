from stagedyolo.demo import write_demo_for_rule

write_demo_for_rule(snakemake.output.target, snakemake.output.pretrain, snakemake.params.demo, snakemake.log[0])
