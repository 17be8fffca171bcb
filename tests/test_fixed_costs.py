"""The report's fixed costs: the gaps before each stage's first training step, from the stamps the jobs write."""

from stagedyolo.fixed_costs import fixed_costs, markdown


def stage(name, process_start, train_start, train_end):
    return {
        "name": name,
        "timing": {"clock": {"process_start": process_start, "train_start": train_start, "train_end": train_end}},
    }


def test_each_gap_runs_from_the_previous_stages_last_step_to_this_stages_first():
    stages = [stage("smoke", 130.0, 140.0, 160.0), stage("frozen", 170.0, 178.0, 200.0)]
    costs = fixed_costs(100.0, stages)
    assert [(r["gap_s"], r["setup_s"]) for r in costs["rows"]] == [(40.0, 10.0), (18.0, 8.0)]
    assert costs["rows"][1]["after"] == "smoke's last training step"
    assert (costs["total_s"], costs["run_s"], costs["share"]) == (58.0, 100.0, 0.58)
    assert "58.0 s of the 100.0 s" in markdown(costs)


def test_a_missing_stamp_gives_no_figure_rather_than_a_wrong_one():
    stages = [stage("smoke", 130.0, 140.0, 160.0), {"name": "old", "timing": {}}]
    costs = fixed_costs(None, stages)
    assert costs["rows"][0]["gap_s"] is None and costs["rows"][0]["setup_s"] == 10.0
    assert costs["rows"][1]["gap_s"] is None and costs["total_s"] is None and costs["share"] is None
    assert "n/a" in markdown(costs)


def test_the_clock_starts_at_the_snakemake_call_when_verify_env_found_it():
    stages = [stage("smoke", 130.0, 140.0, 160.0)]
    costs = fixed_costs(100.0, stages, snakemake_started_unix=96.5)
    assert [(r["until"], r["gap_s"]) for r in costs["rows"]] == [
        ("the run's first job", 3.5),
        ("smoke's first training step", 40.0),
    ]
    assert (costs["total_s"], costs["run_s"], costs["clock_from"]) == (43.5, 63.5, "the snakemake call")
    assert "from the snakemake call" in markdown(costs) and "Snakemake's start-up" in markdown(costs)


def test_verify_env_finds_the_outermost_snakemake_among_its_parents(monkeypatch):
    from stagedyolo import envcheck

    class Proc:
        def __init__(self, cmdline, started):
            self._cmdline, self._started = cmdline, started

        def cmdline(self):
            return self._cmdline

        def create_time(self):
            return self._started

    class Me:
        def parents(self):  # nearest first, as psutil lists them
            return [
                Proc(["/bin/sh", "-c", "python /w/.snakemake/scripts/tmp1.verify_env.py"], 30.0),
                Proc(["/usr/bin/python3", "-m", "snakemake", "--cores", "2"], 20.0),
                Proc(["/v/bin/python", "/v/bin/snakemake", "--cores", "8"], 10.0),
                Proc(["bash"], 1.0),
            ]

    monkeypatch.setattr(envcheck.psutil, "Process", Me)
    assert envcheck.snakemake_started_unix() == (10.0, None)

    class Elsewhere:  # a SLURM job step: the snakemake there runs one job, it is not the user's call
        def parents(self):
            return [
                Proc(["python", "-m", "snakemake", "--target-jobs", "verify_env:", "--mode", "remote"], 6.0),
                Proc(["slurmstepd: [12.batch]"], 5.0),
            ]

    monkeypatch.setattr(envcheck.psutil, "Process", Elsewhere)
    started, reason = envcheck.snakemake_started_unix()
    assert started is None and "no snakemake process" in reason
