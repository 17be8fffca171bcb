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
