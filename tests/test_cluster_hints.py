"""The onerror hint: a job SLURM ended at its time or memory limit names the resource to raise."""

from stagedyolo.cluster_hints import limit_hints, print_limit_hints

LOG = """
Error in rule demo_pretrain:
    message: SLURM-job '12' failed, SLURM status is: 'TIMEOUT'. Reason: Job exceeded its time limit.
    jobid: 3
    log: results/tiny/logs/demo_pretrain.log, .snakemake/slurm_logs/rule_demo_pretrain/12.log (check log file(s))
Error in rule train_stage:
    message: SLURM-job '14' failed, SLURM status is: 'OUT_OF_MEMORY'.
Error in rule export:
    message: SLURM-job '15' failed, SLURM status is: 'FAILED'.
"""


def test_a_timeout_and_an_oom_name_the_resource_to_raise_and_other_failures_nothing():
    hints = limit_hints(LOG)
    assert len(hints) == 2
    assert any("demo_pretrain ended TIMEOUT" in h and "`runtime`" in h for h in hints)
    assert any("train_stage ended OUT_OF_MEMORY" in h and "`mem_mb`" in h for h in hints)


def test_the_handler_reads_snakemakes_list_of_logs_and_prints_nothing_without_one(capsys, tmp_path):
    print_limit_hints(str(tmp_path / "missing.log"))
    print_limit_hints(None)
    assert capsys.readouterr().err == ""
    (tmp_path / "run.log").write_text(LOG)
    print_limit_hints([str(tmp_path / "run.log")])  # Snakemake 9's onerror `log`
    assert "raise its `runtime`" in capsys.readouterr().err
