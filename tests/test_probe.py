"""The probe: the pipeline model and choosing rule on synthetic measurements, then one real run on a tiny demo."""

import json
import math
import time
from pathlib import Path

import pytest
import yaml

from stagedyolo.demo import TARGET_CLASSES, DemoSpec, write_demo_dataset
from stagedyolo.probe import child, choose, combine, predicted_images_per_s, probe_for_rule
from stagedyolo.probe.child import (
    MODEL_WARMUP_STEPS,
    PREFETCH_PER_WORKER,
    SEEN_SHAPE_WARMUP_STEPS,
    WarmShapes,
    model_runs_for,
)
from stagedyolo.probe.reuse import reuse_key, unmeasured
from stagedyolo.probe.rule import candidate_img, epochs_at, plan_request
from stagedyolo.probe.stages import STEADY_BASIS, compare_prediction, prediction_for
from stagedyolo.probe.steady import MIN_TIMED_STEPS, MeasuringBudget
from stagedyolo.recipe import probe_rerun_stages, probe_stage_specs, stage_names, stage_spec

CONFIG = yaml.safe_load(open("config/config.yaml"))


def loader(workers, images_per_s, threads):
    return {"workers": workers, "torch_threads": threads, "images_per_s": images_per_s}


def model(batch, images_per_s, threads=1, amp=False, peak=None, status="ok"):
    return {
        "batch": batch,
        "amp": amp,
        "torch_threads": threads,
        "images_per_s": images_per_s,
        "peak_memory_bytes": peak,
        "status": status,
    }


def test_zero_workers_load_then_compute_in_series():
    rate, bound = predicted_images_per_s(0, 100.0, 25.0, torch_threads=2, cores=2, shares_cpu=True)
    assert rate == pytest.approx(20.0) and bound == "serial"  # 1 / (1/100 + 1/25)


def test_workers_overlap_loading_with_compute():
    assert predicted_images_per_s(1, 100.0, 25.0, torch_threads=1, cores=2, shares_cpu=True) == (25.0, "compute")
    assert predicted_images_per_s(1, 10.0, 25.0, torch_threads=1, cores=2, shares_cpu=True) == (10.0, "loader")


def test_oversubscribed_cores_cap_the_prediction_on_cpu_only():
    # 2 workers + 1 thread on 2 cores: each image costs 2/40 + 1/40 core-seconds, so 2 cores give 26.7 images/s.
    rate, bound = predicted_images_per_s(2, 40.0, 40.0, torch_threads=1, cores=2, shares_cpu=True)
    assert rate == pytest.approx(2 / (2 / 40 + 1 / 40)) and bound == "shared cores"
    assert predicted_images_per_s(2, 40.0, 40.0, torch_threads=1, cores=2, shares_cpu=False) == (40.0, "loader")


def test_cpu_candidates_use_the_model_run_at_the_threads_their_workers_leave():
    candidates = combine(
        [loader(0, 100.0, 2), loader(1, 100.0, 1)],
        [model(8, 30.0, 2), model(8, 50.0, 1)],
        cores=2,
        shares_cpu=True,
        memory_limit_bytes=None,
    )
    by_workers = {c["workers"]: c for c in candidates}
    assert len(candidates) == 2
    assert by_workers[0]["model_images_per_s"] == 30.0 and by_workers[1]["model_images_per_s"] == 50.0


def test_the_choice_is_the_argmax_of_the_predicted_throughput():
    candidates = combine(
        [loader(0, 200.0, 2), loader(1, 60.0, 1)],
        [model(8, 40.0, 2), model(16, 50.0, 2), model(8, 45.0, 1), model(16, 80.0, 1)],
        cores=2,
        shares_cpu=True,
        memory_limit_bytes=None,
    )
    best = max(candidates, key=lambda c: c["predicted_images_per_s"])
    assert (best["workers"], best["batch"]) == (1, 16)  # min(60, 80) = 60 beats 1/(1/200 + 1/50) = 40
    assert choose(candidates) == {"workers": 1, "batch": 16, "amp": False}


def test_within_three_percent_the_smaller_batch_wins():
    candidates = combine(
        [loader(1, 1000.0, 1)],
        [model(8, 98.0), model(16, 100.0), model(32, 101.0)],
        cores=2,
        shares_cpu=True,
        memory_limit_bytes=None,
    )
    assert choose(candidates)["batch"] == 8
    candidates = combine(
        [loader(1, 1000.0, 1)], [model(8, 96.0), model(16, 100.0)], cores=2, shares_cpu=True, memory_limit_bytes=None
    )
    assert choose(candidates)["batch"] == 16  # 4 % slower is not a tie


def test_the_memory_cap_and_failed_runs_exclude_candidates_on_cuda():
    gib = 1 << 30
    runs = [
        model(16, 500.0, amp=True, peak=4 * gib),
        model(32, 900.0, amp=True, peak=30 * gib),
        model(64, 0.0, amp=True, status="oom"),
        model(32, 700.0, amp=False, peak=None),
    ]
    candidates = combine([loader(2, 5000.0, 14)], runs, cores=16, shares_cpu=False, memory_limit_bytes=20 * gib)
    assert len(candidates) == 4
    excluded = {(c["batch"], c["amp"]): c["excluded_because"] for c in candidates if not c["usable"]}
    assert set(excluded) == {(32, True), (64, True), (32, False)}
    assert "limit" in excluded[(32, True)] and "oom" in excluded[(64, True)]
    assert choose(candidates) == {"workers": 2, "batch": 16, "amp": True}


def test_on_cuda_a_batch_is_judged_at_the_memory_the_largest_stage_will_need():
    # Timed at 256 px for a recipe that ends at 512: the peak is taken to grow with the image area (4x).
    gib = 1 << 30
    runs = [model(16, 500.0, amp=True, peak=4 * gib), model(32, 900.0, amp=True, peak=6 * gib)]
    same = combine([loader(2, 5000.0, 14)], runs, cores=16, shares_cpu=False, memory_limit_bytes=20 * gib)
    assert all(c["usable"] for c in same)  # judged at the size it was timed at, 6 GiB fits
    scaled = combine(
        [loader(2, 5000.0, 14)], runs, cores=16, shares_cpu=False, memory_limit_bytes=20 * gib, memory_scale=4.0
    )
    by_batch = {c["batch"]: c for c in scaled}
    assert by_batch[16]["usable"] and by_batch[16]["peak_memory_at_largest_img_bytes"] == 16 * gib
    assert not by_batch[32]["usable"] and "at the largest stage size" in by_batch[32]["excluded_because"]
    assert choose(scaled)["batch"] == 16


def test_the_candidates_are_timed_at_the_size_most_of_the_training_runs_at():
    def at(*stages):  # (epochs, img) per stage
        requests = {f"s{i}": {"img": img} for i, (_, img) in enumerate(stages)}
        return candidate_img(requests, {f"s{i}": epochs for i, (epochs, _) in enumerate(stages)}, largest=480)

    assert at((2, 256), (4, 256), (78, 256), (6, 480)) == 256  # stagedyolo recipe's det at 480 px
    assert at((2, 128), (3, 128), (4, 128), (2, 160)) == 128  # the demo: 9 x 128^2 against 2 x 160^2
    assert at((2, 256), (4, 256), (10, 256), (6, 480)) == 480  # 16 x 256^2 < 6 x 480^2
    assert at((4, 240), (1, 480)) == 480  # equal areas: the larger size
    assert candidate_img({}, {}, largest=480) == 480  # no stages, no epochs: the largest size
    assert at((0, 256), (0, 480)) == 480
    # The budget counts the planned training in epochs at the candidates' size: 84 at 256, 6 at 480 = 21.1 at 256.
    det480 = {"smoke": 2, "frozen": 4, "finetune": 78, "highres": 6}
    sizes = {name: {"img": 480 if name == "highres" else 256} for name in det480}
    assert epochs_at(256, sizes, det480) == pytest.approx(84 + 6 * (480 / 256) ** 2)
    assert epochs_at(256, {}, det480) == 90  # no stage sizes: the plain sum


def test_the_candidates_size_counts_the_size_the_boxes_raise_a_phase_to(tmp_path):
    data = write_demo_dataset(tmp_path / "data", DemoSpec(TARGET_CLASSES, 4, 2, image_size=64))
    stage_defaults = {**CONFIG["stage_defaults"], "img": 160}
    config = {**CONFIG, "stage_defaults": stage_defaults}
    plan = dict(
        cache_mode="ram",
        weights=[],
        stage_defaults=stage_defaults,
        cfg="yolov5n.yaml",
        device="cpu",
        img=160,
        work=tmp_path,
        threads=2,
        settings=CONFIG["probe"],
        stages=probe_stage_specs(config),
        planned_epochs={"smoke": 2, "frozen": 3, "finetune": 4, "highres": 2},
    )
    request = plan_request(str(data), **plan)
    assert (request["img"], request["largest_img"]) == (128, 160)
    assert request["planned_train_images"] == round((9 + 2 * (160 / 128) ** 2) * 4)  # 4 images, counted at 128 px
    raised = plan_request(str(data), boxes_need=160, **plan)  # every phase raised to the 160-px target
    assert (raised["img"], raised["largest_img"], raised["planned_train_images"]) == (160, 160, 11 * 4)


def test_the_stage_loops_least_time_grows_with_their_image_area():
    first = {"seconds": 2.0, "steps": 2, "batch": 16, "torch_threads": 2, "images_per_s": 16.0}  # 1 s a step at 256
    costs = child.RunCosts(first, {"img": 256, "min_steps": 10, "max_seconds": 3.0, "loader_batch": 16}, cuda=False)
    per_loop = MODEL_WARMUP_STEPS + MIN_TIMED_STEPS
    assert costs.stages([256]) == pytest.approx(per_loop)
    assert costs.stages([256, 512]) == pytest.approx(5 * per_loop)  # a 512-px loop: 4 steps' worth each
    assert costs.stages([]) == 0
    # Expected: the warm-up, then min_steps steps but at most max_seconds of them (and never fewer than two).
    assert costs.expected_stage_loops([256, 512]) == pytest.approx([MODEL_WARMUP_STEPS + 3.0, 4 * (2 + 2)])


def test_a_loader_run_is_expected_to_stop_early_and_a_model_run_at_fewer_threads_to_take_longer():
    first = {"seconds": 0.8, "steps": 2, "batch": 16, "torch_threads": 2, "images_per_s": 40.0}  # 0.4 s a step
    costs = child.RunCosts(first, {"img": 128, "min_steps": 10, "max_seconds": 3.0, "loader_batch": 16}, cuda=False)
    one_thread = {"batch": 16, "torch_threads": 1, "min_steps": 10}
    assert costs.expected_model_run(one_thread, warmup_steps=1) == pytest.approx(0.8 + 3.0)  # its 10 steps > 3 s
    batch_s = 16 / (child.LOADER_AMPLE_FACTOR * 40.0)  # a loader 3x the model's rate, where it stops
    assert costs.expected_loader_run({"workers": 0}) == pytest.approx(11 * batch_s)  # 1 warm-up, 10 timed
    assert costs.expected_loader_run({"workers": 2}) == pytest.approx((5 + 10) * batch_s)  # 2 queued per worker


def test_nothing_usable_means_no_choice():
    candidates = combine(
        [loader(1, 10.0, 1)], [model(8, 0.0, status="oom")], cores=2, shares_cpu=True, memory_limit_bytes=None
    )
    assert choose(candidates) == {}


def rule_kwargs(tmp_path: Path, settings: dict, config: dict, planned_epochs: dict[str, int]) -> dict:
    """probe_for_rule's keywords for a 64-px CPU run of ``config``'s stages in ``tmp_path``."""
    return dict(
        cache_decision=str(tmp_path / "cache.json"),
        weights=[],
        tuning_out=str(tmp_path / "run" / "probe" / "tuning.json"),
        settings=settings,
        stage_defaults=config["stage_defaults"],
        cfg="yolov5n.yaml",
        device="cpu",
        img=64,
        threads=2,
        log_path=str(tmp_path / "probe.log"),
        stages=probe_stage_specs(config),
        planned_epochs=planned_epochs,
    )


@pytest.mark.exclusive  # budgets and cut runs depend on the machine being this test's alone
def test_probe_for_rule_measures_every_candidate_and_stage_and_invents_no_gpu_numbers(tmp_path, monkeypatch):
    # Whether the measurement is kept must not depend on what else this machine ran in the last minute.
    monkeypatch.setattr("stagedyolo.probe.reuse.busy_machine", lambda load: None)
    data = write_demo_dataset(tmp_path / "data", DemoSpec(TARGET_CLASSES, 16, 8, image_size=64))
    (tmp_path / "cache.json").write_text(json.dumps({"mode": "ram"}))
    # Every run is steady at its first two timed steps (halves that agree within 100 %): the test stays short, and a
    # budget of a minute measures every candidate.
    settings = {
        **CONFIG["probe"],
        "seconds_per_candidate": 5,
        "min_steps": 2,
        "stable_within": 1.0,
        "workers": [0, 1],
        "batch": [2, 4],
        "budget_s": 60,
        "stop_when_unpaid": False,  # 3 epochs of 16 images could never repay the measuring: measure anyway
    }
    config = {
        **CONFIG,
        "stage_defaults": {**CONFIG["stage_defaults"], "img": 64, "batch": "auto"},
        "stage_order": None,
        "stages": {"a": {"epochs": 1}, "b": {"epochs": 1, "freeze": 10}, "c": {"epochs": 1, "batch": 4}},
    }
    tuning_out = tmp_path / "run" / "probe" / "tuning.json"
    run = rule_kwargs(tmp_path, settings, config, planned_epochs={"a": 1, "b": 1, "c": 1})
    probe_for_rule(str(data), **run)
    tuning = json.loads(tuning_out.read_text())

    loader_runs, model_runs = tuning["measurements"]["loader"], tuning["measurements"]["model"]
    assert sorted(r["workers"] for r in loader_runs) == [0, 1]
    assert all(r["images"] > 0 and r["images_per_s"] > 0 for r in loader_runs + model_runs)
    every_run = loader_runs + model_runs + tuning["measurements"]["stages"]
    assert all(r["steps"] == MIN_TIMED_STEPS and r["stable"] and not r["cut_by_budget"] for r in every_run)
    assert tuning["budget_s"]["budget_s"] == 60 and any("budget" in note for note in tuning["notes"])
    assert tuning["budget_s"]["allowed_s"] == 60  # 3 epochs of 16 images: 5 % of that is far less than 60 s
    # On 2 cores: 0 workers leave compute 2 threads, 1 worker leaves 1; every batch is timed at both.
    assert sorted((r["batch"], r["torch_threads"]) for r in model_runs) == [(2, 1), (2, 2), (4, 1), (4, 2)]
    # A step shape's first run warms up in full, later runs at it for one step (the stages all run shapes the
    # model runs ran: image size 64, batch 2 or 4); loader workers add their prefetched batches.
    assert [r["warmup_steps"] for r in model_runs] == [MODEL_WARMUP_STEPS, SEEN_SHAPE_WARMUP_STEPS] * 2
    assert all(
        r["warmup_steps"] == SEEN_SHAPE_WARMUP_STEPS + PREFETCH_PER_WORKER * r["workers"]
        for r in tuning["measurements"]["stages"]
    )
    assert sorted((c["workers"], c["batch"]) for c in tuning["candidates"]) == [(0, 2), (0, 4), (1, 2), (1, 4)]
    assert tuning["choice"] == choose(tuning["candidates"])

    # Every stage has a prediction, measured end to end at its own settings with the choice filled in.
    chosen_batch = tuning["choice"]["batch"]
    stages = tuning["stages"]
    assert set(stages) == {"a", "b", "c"} and all(s["predicted_images_per_s"] > 0 for s in stages.values())
    assert stages["b"]["settings"]["freeze"] == 10 and stages["a"]["settings"]["freeze"] == 0
    assert stages["a"]["settings"]["batch"] == chosen_batch and stages["c"]["settings"]["batch"] == 4
    assert stages["a"]["settings"]["workers"] == tuning["choice"]["workers"]
    measured_groups = tuning["measurements"]["stages"]
    assert len(measured_groups) == (2 if chosen_batch == 4 else 3)  # a and c train alike when the choice is 4
    # Each prediction names the speed settings it was measured for, and each stage as it is now takes it up.
    specs = probe_stage_specs(config)
    assert all(stages[name]["measured_for"] == json.loads(json.dumps(specs[name])) for name in "abc")
    assert all(prediction_for(tuning, name, stage_spec(config, name)) == stages[name] for name in "abc")

    # Every run times the step the stages run: the fast engine's step rows that apply on CPU.
    assert all(r["engine_rows"] == ["foreach_ema", "fused_optimizer"] for r in model_runs + measured_groups)
    assert all(r["amp"] is False for r in model_runs)  # AMP needs CUDA
    assert tuning["amp_verdict"]["amp"] is False and "CPU" in tuning["amp_verdict"]["reason"]
    assert all(r["peak_memory_bytes"] is None and r["peak_memory_reason"] for r in model_runs)
    assert tuning["machine"]["gpu_total_memory_bytes"] is None and tuning["machine"]["bf16_supported"] is None
    assert not list((tmp_path / "data").rglob("*.cache"))  # the label cache stays out of the user's data

    # A second run with the same machine, images, model and settings reuses the measurements.
    tuning_out.unlink()
    probe_for_rule(str(data), **run)
    again = json.loads(tuning_out.read_text())
    assert again["reused"]["key"] and again["stages"] == tuning["stages"] and again["choice"] == tuning["choice"]
    assert again["budget_s"]["rule_s"] < tuning["budget_s"]["rule_s"]
    assert list((tmp_path / "probe_cache").glob("*.json"))  # <results_dir>/probe_cache, beside the run folder
    assert tuning["reuse_cache"]["kept"] and "reuse_cache" not in again
    # ...and not once a setting the measurement depends on, or the images, changed.
    request = json.loads((tmp_path / "run" / "probe" / "probe_work" / "request.json").read_text())
    key = reuse_key(request, [])
    assert reuse_key({**request, "stages": {"a": {**request["stages"]["a"], "img": 96}}}, []) != key
    assert reuse_key({**request, "threads": 1}, []) != key
    assert reuse_key({**request, "budget_s": 30}, []) != key  # a budget changes what is measured, and how long
    assert reuse_key({**request, "deadline_unix": request["deadline_unix"] + 60}, []) == key  # a later run's deadline
    assert request["planned_train_images"] == 3 * 16  # planned epochs x training images: more epochs, same key
    assert reuse_key({**request, "planned_train_images": 10**6}, []) == key
    first_image = Path(Path(request["data_list"]).read_text().splitlines()[0])
    first_image.write_bytes(first_image.read_bytes() + b"\0")  # this test's own image: a changed file
    assert reuse_key(request, []) != key


def fake_runs(monkeypatch, step_s: float) -> list[str]:
    """The child's measurements replaced by instant ones whose steady step takes ``step_s``; returns what ran."""
    ran = []

    def timed(kind, run, images_per_s):
        ran.append(kind)
        return {**run, "status": "ok", "images_per_s": images_per_s, "steps": 2, "seconds": 2 * step_s}

    monkeypatch.setattr(child, "measure_model_run", lambda model, request, run, *rest: timed("model", run, 40.0))
    monkeypatch.setattr(child, "measure_loader_run", lambda load, request, run, *rest: timed("loader", run, 900.0))
    monkeypatch.setattr(
        child, "measure_stage_run", lambda load, model, request, group, *rest: timed("stage", group, 50.0)
    )
    return ran


def cpu_request(seconds_left: float) -> dict:
    """Two cores, workers 0/1/2 (0 leaves compute 2 threads, 1 and 2 leave 1), batch 16, one stage, auto workers."""
    stage = {
        "img": 128,
        "freeze": 0,
        "batch": 16,
        "workers": "auto",
        "amp": "auto",
        "gpus": 1,
        "nominal_batch": 16,
        "hyp": {},
        "engine": {},
    }
    return {
        "choose": True,
        "batches": [16],
        "thread_counts": [2, 1],
        "min_steps": 10,
        "max_seconds": 3.0,
        "img": 128,
        "largest_img": 128,
        "loader_batch": 16,
        "threads": 2,
        "cores": 2,
        "loader_runs": [{"workers": w, "torch_threads": t} for w, t in ((0, 2), (1, 1), (2, 1))],
        "stages": {"a": stage},
        "budget_s": 15,
        "deadline_unix": time.time() + seconds_left,
        "max_memory_fraction": 0.85,
    }


def test_a_candidate_run_that_would_leave_the_stage_loops_too_little_time_is_not_measured(monkeypatch):
    """The 2-core demo in the machine's slow state: after 7-9 s of imports, timing the model at 1 thread too
    (3 steps at 2x the 2-thread step) would leave the stage loops less than their warm-up and two steps each."""
    ran = fake_runs(monkeypatch, step_s=0.4)  # least time of a stage loop: 4 steps = 1.6 s
    measured = child.measure_all(
        cpu_request(seconds_left=2.0),
        None,
        None,
        32,
        None,
        None,
        cuda=False,
        bf16_supported=None,
        gpu_total_memory_bytes=None,
    )
    assert ran == ["model", "loader", "stage"]  # the 1-thread model run and its loader runs were not
    skipped = [r for r in measured["model"] + measured["loader"] if r.get("status") == "skipped"]
    assert [(r["workers"] if "workers" in r else "model", r["torch_threads"]) for r in skipped] == [
        ("model", 1),
        (1, 1),
        (2, 1),
    ]
    assert all(r["images_per_s"] is None and r["message"].startswith("not measured: ") for r in skipped)
    unusable = [c for c in measured["candidates"] if not c["usable"]]
    assert sorted(c["workers"] for c in unusable) == [1, 2] and all(
        "not measured" in c["excluded_because"] for c in unusable
    )
    assert measured["choice"]["workers"] == 0 and len(measured["stage_runs"]) == 1

    ran.clear()  # with the time, every candidate is measured
    measured = child.measure_all(
        cpu_request(seconds_left=60.0),
        None,
        None,
        32,
        None,
        None,
        cuda=False,
        bf16_supported=None,
        gpu_total_memory_bytes=None,
    )
    assert ran == ["model", "model", "loader", "loader", "loader", "stage"]
    assert all(c["usable"] for c in measured["candidates"])


def measure_cpu(request: dict) -> dict:
    return child.measure_all(
        request, None, None, 32, None, None, cuda=False, bf16_supported=None, gpu_total_memory_bytes=None
    )


def test_after_the_first_model_run_each_part_of_the_rest_is_measured_only_where_it_pays(monkeypatch):
    """The demo's shape on 2 cores: 11 epochs of 256 images at the 40 images/s of the first model run is 70 s of
    training. The four other candidates may save 20 % of it (14.1 s), more than the 7.7 s they are expected to take
    (the 1-thread model run its 2.45-s share of the ~14.7 s left, the loaders 1.5-2 s each, stopping once they
    deliver 3x the model's rate); the two stage loops, which make predictions only, may take 5 % (3.5 s), less than
    their 4.9 s."""
    ran = fake_runs(monkeypatch, step_s=0.4)
    two_stages = cpu_request(seconds_left=15.0)
    two_stages["stages"]["b"] = {**two_stages["stages"]["a"], "freeze": 10}  # trains unlike a: a second loop
    measured = measure_cpu({**two_stages, "planned_train_images": 11 * 256})
    assert ran == ["model", "model", "loader", "loader", "loader"]  # every candidate, no stage loop
    payoff = measured["payoff"]
    assert (payoff["training_s"], payoff["at_images_per_s"]) == (70.4, 40.0)
    assert payoff["candidates"]["measured"] and payoff["candidates"]["worth_s"] == 14.1
    assert payoff["candidates"]["runs"] == 4 and 7.5 < payoff["candidates"]["cost_s"] < 8
    assert not payoff["stage_loops"]["measured"] and payoff["stage_loops"]["worth_s"] == 3.5
    assert payoff["stage_loops"]["runs"] == 2 and 4.5 < payoff["stage_loops"]["cost_s"] < 5
    assert measured["choice"] and measured["stage_runs"] == []  # measured settings, no predictions

    ran.clear()  # a training of 256 images: nothing more could pay
    measured = measure_cpu({**two_stages, "planned_train_images": 256})
    assert ran == ["model"] and measured["choice"] == {} and measured["stage_runs"] == []
    not_run = measured["model"][1:] + measured["loader"]
    assert len(not_run) == 4 and all(r["status"] == "skipped" and child.UNPAID_WHY in r["message"] for r in not_run)

    ran.clear()  # ten times the demo's training: everything pays
    measured = measure_cpu({**two_stages, "planned_train_images": 110 * 256})
    assert ran == ["model", "model", "loader", "loader", "loader", "stage", "stage"]
    assert measured["payoff"]["candidates"]["measured"] and measured["payoff"]["stage_loops"]["measured"]

    ran.clear()  # the same 256 images under a 20-minute recipe_minutes: the training lasts 1200 s, so all pays
    measured = measure_cpu({**two_stages, "planned_train_images": 256, "planned_training_s": 1200.0})
    assert ran == ["model", "model", "loader", "loader", "loader", "stage", "stage"]
    assert (measured["payoff"]["training_s"], measured["payoff"]["training_from"]) == (1200.0, "recipe_minutes")

    ran.clear()  # probe.stop_when_unpaid: false measures everything, unjudged
    measured = measure_cpu({**two_stages, "planned_train_images": 256, "stop_when_unpaid": False})
    assert measured["payoff"] is None and ran[-2:] == ["stage", "stage"]


def test_on_cuda_the_candidates_pay_unless_they_would_outlast_the_whole_training():
    """A GPU that waits on its loader trains at a fraction of its rate, so on CUDA the choice may save all of it."""
    now = [5.0]
    budget = MeasuringBudget(deadline=15.0, runs=6, budget_s=15.0, planned_train_images=2816, clock=lambda: now[0])
    up_to_shares = {"candidates": [math.inf] * 3, "stage_loops": [math.inf] * 2}  # each run takes its whole share
    assert budget.payoff(cuda=True, expected=up_to_shares) is None  # no rate yet: nothing to judge by
    budget.note_rate(400.0)  # 7.04 s of training; 10 s left for 6 runs
    on_gpu = budget.payoff(cuda=True, expected=up_to_shares)
    assert on_gpu["candidates"]["measured"] and on_gpu["candidates"]["cost_s"] == 5.0
    assert not on_gpu["stage_loops"]["measured"] and on_gpu["stage_loops"]["worth_s"] == 0.4
    assert not budget.payoff(cuda=False, expected=up_to_shares)["candidates"]["measured"]  # 1.4 s < 5 s
    # Runs expected to end early are charged what they take, a longer one its share (10/6 s): 0.2 + 0.2 + 1.67.
    quick = budget.payoff(cuda=False, expected={"candidates": [0.2, 0.2, 9.0], "stage_loops": [0.1, 0.1]})
    assert quick["candidates"]["cost_s"] == 2.1 and quick["stage_loops"]["cost_s"] == 0.2
    assert quick["stage_loops"]["measured"] and not quick["candidates"]["measured"]  # 0.4 s >= 0.2; 1.4 < 2.1
    budget.drop(2)  # the loops go with their share: the deadline moves 10 x 2/6 s nearer, the rest keep theirs
    assert budget.deadline == pytest.approx(15.0 - 10 * 2 / 6) and budget.runs_left == 4
    assert budget.next_deadline() == pytest.approx(5.0 + 10 / 6)
    assert MeasuringBudget(deadline=None, runs=2, planned_train_images=2816).payoff(False, up_to_shares) is None


@pytest.mark.exclusive  # the rule's seconds are compared
def test_a_probe_whose_rest_cannot_pay_says_why_predicts_nothing_and_is_not_kept_for_reuse(tmp_path, monkeypatch):
    """The real rule and measuring process on a training of 16 images: no choice could repay the probe."""
    monkeypatch.setattr("stagedyolo.probe.reuse.busy_machine", lambda load: None)
    data = write_demo_dataset(tmp_path / "data", DemoSpec(TARGET_CLASSES, 16, 8, image_size=64))
    (tmp_path / "cache.json").write_text(json.dumps({"mode": "ram"}))
    config = {**CONFIG, "stage_defaults": {**CONFIG["stage_defaults"], "img": 64, "batch": 4}, "stage_order": None}
    config["stages"] = {"a": {"epochs": 1}, "b": {"epochs": 1, "freeze": 10}}
    tuning_out = tmp_path / "run" / "probe" / "tuning.json"
    settings = {**CONFIG["probe"], "batch": [4], "workers": [0, 1], "budget_s": 30}
    run = rule_kwargs(tmp_path, settings, config, planned_epochs={"a": 1, "b": 1})
    probe_for_rule(str(data), **run)
    tuning = json.loads(tuning_out.read_text())

    payoff = tuning["payoff"]
    assert payoff["training_s"] < 5 and not payoff["candidates"]["measured"] and not payoff["stage_loops"]["measured"]
    assert tuning["choice"] == {} and tuning["measurements"]["stages"] == []
    assert [r["status"] for r in tuning["measurements"]["model"]] == ["ok", "skipped"]
    assert all(r["status"] == "skipped" for r in tuning["measurements"]["loader"])
    assert set(tuning["stages"]) == {"a", "b"}
    reasons = [s["reason"] for s in tuning["stages"].values() if s["predicted_images_per_s"] is None]
    assert len(reasons) == 2 and all("did not measure the stage loops" in why for why in reasons)
    unpaid_notes = [note for note in tuning["notes"] if note.startswith("the planned training takes about")]
    assert len(unpaid_notes) == 2 and "no usable candidate" not in " ".join(tuning["notes"])
    assert tuning["budget_s"]["rule_s"] < 20  # the 30-s budget was not spent
    assert tuning["reuse_cache"] == {"kept": False, "reason": unmeasured(tuning)}
    assert not list((tmp_path / "probe_cache").glob("*.json"))
    assert "the other candidates were not measured" in (tmp_path / "probe.log").read_text()
    # A stage reads the reason into its timing.json prediction.
    throughput = {"basis": STEADY_BASIS, "steady_images_per_s": 30.0}
    assert compare_prediction(tuning["stages"]["a"], {}, throughput)["reason"] == tuning["stages"]["a"]["reason"]


def test_auto_workers_are_measured_at_the_cores_the_probe_may_use(tmp_path, monkeypatch):
    """On the 16-core H200 box a fixed [0, 1, 2] could not find the 8-12 workers a 640-px mosaic load needed."""
    monkeypatch.setattr("stagedyolo.stage_plan.available_cores", lambda: 16)
    data = write_demo_dataset(tmp_path / "data", DemoSpec(TARGET_CLASSES, 4, 2, image_size=64))
    plan = dict(
        cache_mode="ram",
        weights=[],
        stage_defaults=CONFIG["stage_defaults"],
        cfg="yolov5n.yaml",
        device="",
        img=64,
        work=tmp_path,
    )
    request = plan_request(str(data), settings={**CONFIG["probe"], "workers": "auto"}, threads=16, **plan)
    runs = [(r["workers"], r["torch_threads"]) for r in request["loader_runs"]]
    assert runs == [(0, 16), (4, 12), (8, 8), (12, 4)]  # each candidate leaves compute the rest of the 16 cores
    granted_8 = plan_request(str(data), settings={**CONFIG["probe"], "workers": "auto"}, threads=8, **plan)
    assert [r["workers"] for r in granted_8["loader_runs"]] == [0, 2, 4, 6]  # --cores 8: a quarter, half, 3/4 of 8


def test_model_runs_on_cuda_time_amp_on_and_off_once_per_batch_and_on_cpu_every_thread_count():
    request = {"batches": [8, 16], "thread_counts": [2, 1], "min_steps": 10}
    cuda_runs = model_runs_for(request, cuda=True)
    assert sorted((r["batch"], r["amp"], r["torch_threads"]) for r in cuda_runs) == [
        (8, False, 1),
        (8, True, 1),
        (16, False, 1),
        (16, True, 1),
    ]
    assert all(r["min_steps"] == 20 for r in cuda_runs)  # the AMP policy's evidence: >= 20 steps per side
    cpu_runs = model_runs_for(request, cuda=False)
    assert sorted((r["batch"], r["amp"], r["torch_threads"]) for r in cpu_runs) == [
        (8, False, 1),
        (8, False, 2),
        (16, False, 1),
        (16, False, 2),
    ]
    assert all(r["min_steps"] == 10 for r in cpu_runs)


def test_a_prediction_is_compared_with_steady_epochs_only_and_names_settings_that_differ():
    from stagedyolo.probe.stages import compare_prediction

    settings = {"img": 128, "freeze": 0, "batch": 16, "workers": 0, "torch_threads": 2, "amp": False}
    prediction = {"predicted_images_per_s": 60.0, "settings": settings}
    steady = {"basis": "epochs after the first", "steady_images_per_s": 45.0}
    compared = compare_prediction(prediction, settings, steady)
    assert (compared["ratio"], compared["within_tolerance"], compared["settings_differ"]) == (0.75, True, {})
    assert (
        compare_prediction(prediction, settings, {**steady, "steady_images_per_s": 44.0})["within_tolerance"] is False
    )
    one_epoch = compare_prediction(prediction, settings, {"basis": "the only epoch", "steady_images_per_s": 30.0})
    assert one_epoch["ratio"] is None and "warm-up" in one_epoch["reason"]  # a first epoch is not steady
    tuned = compare_prediction(prediction, {**settings, "workers": 1}, steady)  # a tune trial kept workers 1
    assert tuned["settings_differ"] == {"workers": {"predicted_at": 0, "ran": 1}}
    assert compare_prediction(None, settings, steady)["reason"] == "no probe ran for this stage"


def test_on_cuda_the_choice_keeps_amp_on_unless_clearly_slower_and_says_why():
    from stagedyolo.probe.choice import decide

    request = {"max_memory_fraction": 0.85, "cores": 16, "img": 640, "largest_img": 640}
    runs = [
        {**model(64, 591.0, amp=False, peak=1 << 30), "steps": 6},  # the H200's short-window evidence
        {**model(64, 411.0, amp=True, peak=1 << 30), "steps": 3},
    ]
    decision = decide(request, [loader(8, 5000.0, 8)], runs, cuda=True, gpu_total_memory_bytes=80 << 30)
    assert decision["choice"]["amp"] is True and "on with CUDA" in decision["choice"]["amp_reason"]
    slower = [{**r, "steps": 40} for r in runs]  # the same figures over 40 steps each: AMP is off, with the figures
    decision = decide(request, [loader(8, 5000.0, 8)], slower, cuda=True, gpu_total_memory_bytes=80 << 30)
    assert decision["choice"]["amp"] is False and "411.0 vs 591.0" in decision["choice"]["amp_reason"]


def test_a_step_shape_warms_up_in_full_once_per_image_size_batch_and_autocast_dtype():
    warm = WarmShapes()
    assert warm.steps(640, 16, "float16") == MODEL_WARMUP_STEPS
    assert warm.steps(640, 16, "float16") == SEEN_SHAPE_WARMUP_STEPS
    assert warm.steps(640, 16, False) == MODEL_WARMUP_STEPS  # fp32: other kernels, tuned anew
    assert warm.steps(640, 16, None) == SEEN_SHAPE_WARMUP_STEPS  # AMP off, however it is spelled
    assert warm.steps(640, 32, False) == warm.steps(320, 16, False) == MODEL_WARMUP_STEPS


def test_a_stage_changed_after_the_probe_measured_it_reports_no_prediction_and_names_what_changed():
    # Without a time budget a change to one stage's speed settings reruns that stage, not the probe (and with it
    # every stage): the probe's figure for it is then of other settings, and the stage says so instead of using it.
    spec = stage_spec(CONFIG, "highres")
    entry = {
        "predicted_images_per_s": 50.0,
        "measured_for": json.loads(json.dumps(probe_stage_specs(CONFIG)["highres"])),
    }
    tuning = {"stages": {"highres": entry}}
    assert prediction_for(tuning, "highres", spec) == entry
    changed = {**spec, "workers": 1, "hyp": {**spec["hyp"], "mosaic": 0.5}}
    stale = prediction_for(tuning, "highres", changed)
    assert stale["predicted_images_per_s"] is None
    assert "hyp.mosaic, workers changed" in stale["reason"] and "--forcerun probe" in stale["reason"]
    assert (
        compare_prediction(stale, {}, {"basis": STEADY_BASIS, "steady_images_per_s": 40.0})["reason"]
        == (stale["reason"])
    )
    # the LR is no speed setting: a new lrf keeps the prediction
    assert prediction_for(tuning, "highres", {**spec, "hyp": {**spec["hyp"], "lrf": 0.5}}) == entry
    assert prediction_for({"stages": {}}, "highres", spec) is None  # no probe figure: nothing to compare
    unrecorded = {"predicted_images_per_s": 50.0}  # a tuning.json from before measured_for: taken as it is
    assert prediction_for({"stages": {"highres": unrecorded}}, "highres", changed) == unrecorded


def test_the_stages_speed_settings_rerun_the_probe_only_under_a_time_budget():
    # Under recipe_minutes every stage sizes itself from the probe's predictions of the stages after it, so those
    # must be current; without it they are only reported, and a stage's own params rerun what changed.
    assert probe_rerun_stages(CONFIG) is None
    budgeted = {**CONFIG, "recipe_minutes": 30}
    assert probe_rerun_stages(budgeted) == probe_stage_specs(budgeted)
    assert set(probe_stage_specs(CONFIG)) == set(stage_names(CONFIG))
