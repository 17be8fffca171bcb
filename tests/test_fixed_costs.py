"""The report's fixed costs: the gaps before each stage's first training step, from the stamps the jobs write."""

import datetime

from stagedyolo.fixed_costs import fixed_costs, markdown


def stage(name, process_start, train_start, train_end, call=None):
    clock = {"process_start": process_start, "train_start": train_start, "train_end": train_end, "snakemake_call": call}
    return {"name": name, "timing": {"clock": clock}}


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


def test_a_rerun_of_the_later_stages_gives_no_gap_across_two_snakemake_calls():
    """finetune's epochs changed: an hour later a second call reruns finetune and highres only, so frozen's last
    step is the first call's and the hour between is nobody's fixed cost."""
    first, second = 96.5, 4000.0
    stages = [
        stage("smoke", 130.0, 140.0, 160.0, call=first),
        stage("frozen", 165.0, 170.0, 200.0, call=first),
        stage("finetune", 4010.0, 4015.0, 4100.0, call=second),
        stage("highres", 4104.0, 4108.0, 4200.0, call=second),
    ]
    costs = fixed_costs(100.0, stages, snakemake_started_unix=first)
    gaps = {row["until"]: (row["gap_s"], row["other_call"]) for row in costs["rows"]}
    assert gaps["frozen's first training step"] == (10.0, False)
    assert gaps["finetune's first training step"] == (None, True)
    assert gaps["highres's first training step"] == (8.0, False)  # both ends in the second call
    assert (costs["total_s"], costs["run_s"], costs["share"]) == (None, None, None)
    assert "earlier snakemake call" in markdown(costs) and "trained nothing" not in markdown(costs)
    # One call throughout (stamps equal), or stamps unknown (a cluster node): the gaps stand.
    same = fixed_costs(100.0, [stage("smoke", 130.0, 140.0, 160.0, call=first)], snakemake_started_unix=first)
    assert same["rows"][1]["gap_s"] == 40.0 and same["share"] is not None
    unknown = fixed_costs(100.0, [stage("smoke", 130.0, 140.0, 160.0)], snakemake_started_unix=first)
    assert unknown["rows"][1]["gap_s"] == 40.0
    # A shell exec'd Snakemake after 110 s of pip install: the clock starts at the log, but the call is the process
    # every stage stamps, so it is one call throughout.
    execd = fixed_costs(
        first + 110.3,
        [stage("smoke", first + 130.0, first + 140.0, first + 160.0, call=first)],
        snakemake_started_unix=first + 110.0,
        snakemake_call_unix=first,
    )
    assert [row["gap_s"] for row in execd["rows"]] == [0.3, 29.7] and execd["share"] is not None


def test_verify_env_finds_the_outermost_snakemake_among_its_parents(monkeypatch):
    from stagedyolo import fixed_costs

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

    monkeypatch.setattr("psutil.Process", Me)
    assert fixed_costs.snakemake_call_unix() == (10.0, None)

    class Elsewhere:  # a SLURM job step: the snakemake there runs one job, it is not the user's call
        def parents(self):
            return [
                Proc(["python", "-m", "snakemake", "--target-jobs", "verify_env:", "--mode", "remote"], 6.0),
                Proc(["slurmstepd: [12.batch]"], 5.0),
            ]

    monkeypatch.setattr("psutil.Process", Elsewhere)
    started, reason = fixed_costs.snakemake_call_unix()
    assert started is None and "no snakemake process" in reason


def log_named_at(log_dir, unix_time):
    """A Snakemake log file named as Snakemake names it: its local set-up time, colons dropped."""
    name = datetime.datetime.fromtimestamp(unix_time).isoformat().replace(":", "") + ".snakemake.log"
    log_dir.mkdir(parents=True, exist_ok=True)
    (log_dir / name).write_text("")


def test_a_snakemake_exec_d_by_a_shell_after_other_commands_is_clocked_from_its_log(tmp_path):
    """`bash -c "pip install ... && snakemake"`: the process is the shell's, started 106 s before Snakemake's log."""
    from stagedyolo import fixed_costs as clock

    call = (1_800_000_000.0, None)  # the process start snakemake_call_unix read
    assert clock.snakemake_started(call, tmp_path) == (1_800_000_000.0, None)  # no log: the process start stands
    log_dir = tmp_path / ".snakemake" / "log"
    log_named_at(log_dir, 1_799_990_000.5)  # an earlier call's log
    log_named_at(log_dir, 1_800_000_002.25)  # this call's, 2 s after its start: Snakemake's own imports
    assert clock.snakemake_started(call, tmp_path) == (1_800_000_000.0, None)
    log_named_at(log_dir, 1_800_000_106.5)  # set up 106 s after the process started: the shell ran pip first
    started, reason = clock.snakemake_started(call, tmp_path)
    assert started == 1_800_000_106.5 and "106 s before Snakemake set up its log" in reason
    (log_dir / "notes.snakemake.log").write_text("")  # a name that is no time is ignored
    assert clock.latest_log_time(log_dir) == 1_800_000_106.5
