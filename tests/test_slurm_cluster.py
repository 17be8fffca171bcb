"""The SLURM profile against a real one-host SLURM cluster (tests/cluster/slurm_up.sh): real sbatch, slurmctld,
slurmd and the accounting database that sacct reads.

One module, so the cluster comes up once: the tiny pipeline end to end through the controller, then faults on a
training stage of that finished run (scancel mid-epoch, scontrol requeue) and a job that outlives its time limit.
Where the cluster cannot start (not root, no packages, a daemon that will not run), every test here is skipped with
the reason slurm_up.sh gave.
"""

import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import yaml
from snakemake_runner import REPO, make_workdir

pytestmark = pytest.mark.e2e

CLUSTER_SCRIPTS = REPO / "tests" / "cluster"
STATE = Path(os.environ.get("STAGEDYOLO_SLURM_STATE", "/tmp/stagedyolo-slurm"))
TINY = REPO / "tests" / "configs" / "tiny.yaml"
STAGES = {"smoke": 1, "frozen": 2, "finetune": 2, "highres": 1}  # tiny.yaml's stages and their epochs
FAULTY_STAGE = "finetune"  # two epochs: a checkpoint after the first, one more to resume
STAGE_TARGET = f"results/tiny/stages/{FAULTY_STAGE}/timing.json"
# What the test profile (tests/cluster/profile.yaml) asks for: {rule: (CPUs, memory)}; every job gets 10 minutes.
REQUESTS = {
    "demo_dataset": ("1", "1000M"),
    "demo_pretrain": ("1", "3000M"),
    "prepare_dataset": ("1", "1000M"),
    "cache_dataset": ("1", "1000M"),
    "probe": ("1", "3000M"),
    "train_stage": ("1", "3000M"),
    "evaluate_test": ("1", "2000M"),
    "export": ("1", "1000M"),
}

# The plugin sleeps 5 s before every sbatch and lengthens its status polls by 10 s whenever no job has finished
# (40 s first); both spare a busy production controller. This one answers at once: submit without the pause and
# poll every second, or the tiny pipeline's 11 jobs would wait minutes on the clock.
SNAKEMAKE_WITH_FAST_POLLING = """
import sys, time, types
import snakemake_executor_plugin_slurm as slurm
slurm.time = types.SimpleNamespace(time=time.time, sleep=lambda seconds: None)
slurm.Executor.next_seconds_between_status_checks = property(lambda self: 1, lambda self, value: None)
from snakemake.cli import main
main()
"""


@pytest.fixture(scope="module")
def cluster():
    """The cluster's environment; up once for the module, down after it unless it was already up before."""
    started = subprocess.run(
        ["bash", str(CLUSTER_SCRIPTS / "slurm_up.sh"), str(STATE)], capture_output=True, text=True, timeout=900
    )
    if started.returncode != 0:
        reason = [line for line in started.stderr.splitlines() if "FAILED" in line] or started.stderr.splitlines()[-1:]
        stop_cluster()
        pytest.skip(f"the one-host SLURM cluster did not start: {' '.join(reason) or 'slurm_up.sh gave no reason'}")
    yield {**os.environ, "SLURM_CONF": str(STATE / "etc" / "slurm.conf")}
    if "already up" not in started.stdout:  # a cluster a developer brought up stays up
        stop_cluster()


def stop_cluster() -> None:
    subprocess.run(["bash", str(CLUSTER_SCRIPTS / "slurm_down.sh"), str(STATE)], capture_output=True, timeout=120)


def write_profile(folder: Path, **set_resources) -> Path:
    """profiles/slurm with tests/cluster/profile.yaml merged in (and `set_resources` per rule on top)."""
    profile = yaml.safe_load((REPO / "profiles" / "slurm" / "profile.yaml").read_text())
    profile = merged(profile, yaml.safe_load((CLUSTER_SCRIPTS / "profile.yaml").read_text()))
    profile = merged(profile, {"set-resources": set_resources})
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "profile.yaml").write_text(yaml.safe_dump(profile, sort_keys=False))
    return folder


def merged(base: dict, override: dict) -> dict:
    out = dict(base)
    for key, value in override.items():
        both_dicts = isinstance(value, dict) and isinstance(base.get(key), dict)
        out[key] = merged(base[key], value) if both_dicts else value
    return out


def snakemake_argv(workdir: Path, profile: Path, *args: str) -> list[str]:
    return [
        sys.executable,
        "-c",
        SNAKEMAKE_WITH_FAST_POLLING,
        "-s",
        str(REPO / "Snakefile"),
        "-d",
        str(workdir),
        "--workflow-profile",
        str(profile),
        "--configfile",
        str(workdir / TINY.name),
        "--latency-wait",
        "5",
        *args,
    ]


def run_workflow(workdir, profile, *args, env, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run(
        snakemake_argv(workdir, profile, *args), capture_output=True, text=True, timeout=timeout, env=env
    )


def start_workflow(workdir, profile, *args, env) -> subprocess.Popen:
    """Snakemake in the background; its console goes to the file named by the process's `console` attribute."""
    console = workdir / f"console-{time.time_ns()}.txt"
    with console.open("w") as out:
        process = subprocess.Popen(
            snakemake_argv(workdir, profile, *args), stdout=out, stderr=subprocess.STDOUT, text=True, env=env
        )
    process.console = console
    return process


def run_uuid(console: str) -> str:
    """The run's SLURM job name: the plugin names every job of one Snakemake run after it."""
    return next(line.split(": ", 1)[1].strip() for line in console.splitlines() if "SLURM run ID:" in line)


def sacct_jobs(env, *selection: str) -> list[dict[str, str]]:
    """One row per job (its allocation, not its steps), as the accounting database has it.

    sacct's window opens at midnight today unless told otherwise: a run that crosses midnight would lose the jobs
    that started before it (as the plugin does, open the window two days back)."""
    fields = ["JobID", "State", "ReqCPUS", "ReqMem", "Timelimit", "Comment"]
    since = f"{datetime.now() - timedelta(days=2):%Y-%m-%dT%H:00}"
    out = subprocess.run(
        ["sacct", "-X", "-P", "-n", "--starttime", since, "-o", ",".join(f + "%200" for f in fields), *selection],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
        check=True,
    ).stdout
    return [dict(zip(fields, line.split("|"))) for line in out.splitlines() if line.strip()]


def rule_of(comment: str) -> str:
    """'rule_train_stage_wildcards_smoke' -> 'train_stage' (the plugin's --comment)."""
    return comment.removeprefix("rule_").split("_wildcards_")[0]


def stage_job_id(env, stage: str, timeout=120) -> str:
    """The SLURM job id of the running train_stage job for `stage`."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        out = subprocess.run(["squeue", "-h", "-o", "%i|%k"], capture_output=True, text=True, env=env).stdout
        for line in out.splitlines():
            job_id, comment = line.split("|", 1)
            if rule_of(comment) == "train_stage" and comment.endswith(stage):
                return job_id
        time.sleep(0.5)
    raise AssertionError(f"no train_stage job for {stage} in squeue")


def wait_for_checkpoint(work: Path, process: subprocess.Popen, timeout=300) -> None:
    """Until the stage has saved an epoch in its work folder since the call (yolov5 writes last.pt at every epoch's
    end); a checkpoint an earlier, interrupted run left there does not count."""
    since = time.time()
    deadline = since + timeout
    last = work / "weights" / "last.pt"
    while not (last.exists() and last.stat().st_mtime >= since):
        assert process.poll() is None, "Snakemake ended before the stage saved an epoch"
        assert time.time() < deadline, "the stage never saved an epoch"
        time.sleep(0.2)


def stage_epochs(run: Path, stage: str) -> list[int]:
    lines = (run / "stages" / stage / "results.csv").read_text().splitlines()[1:]
    return [int(line.split(",")[0]) for line in lines]


@pytest.fixture(scope="module")
def timeout_run(cluster, tmp_path_factory):
    """A demo pretraining far longer than the 1 minute its job may run, started at once so that it times out while
    the tiny pipeline runs beside it (the node has a CPU for each)."""
    workdir = make_workdir(tmp_path_factory.mktemp("timeout"), TINY)
    config = yaml.safe_load((workdir / TINY.name).read_text())
    config["demo"]["pretrain"]["epochs"] = 1000
    (workdir / TINY.name).write_text(yaml.safe_dump(config))
    profile = write_profile(workdir / "profile", demo_pretrain={"runtime": 1})
    process = start_workflow(workdir, profile, "results/tiny/demo/pretrained.pt", env=cluster)
    yield workdir, process
    if process.poll() is None:
        process.kill()


@pytest.fixture(scope="module")
def finished_run(cluster, timeout_run, tmp_path_factory):
    """The tiny pipeline (.test/config/config.yaml) through the real controller, every non-local job one sbatch."""
    workdir = make_workdir(tmp_path_factory.mktemp("tiny"), TINY)
    profile = write_profile(workdir / "profile")
    result = run_workflow(workdir, profile, env=cluster, timeout=900)
    console = result.stdout + result.stderr
    (workdir / "console.txt").write_text(console)
    assert result.returncode == 0, console[-6000:]
    return workdir, profile, console


def test_the_tiny_pipeline_runs_as_one_slurm_job_per_remote_rule(cluster, finished_run):
    _, _, console = finished_run
    jobs = sacct_jobs(cluster, "--name", run_uuid(console))
    expected = {rule: 1 for rule in REQUESTS} | {"train_stage": len(STAGES)}
    counted = {}
    for job in jobs:
        counted[rule_of(job["Comment"])] = counted.get(rule_of(job["Comment"]), 0) + 1
    assert counted == expected, jobs  # verify_env, report, all stay on the submit host
    assert sorted(j["Comment"].rsplit("_", 1)[-1] for j in jobs if rule_of(j["Comment"]) == "train_stage") == sorted(
        STAGES
    )
    for job in jobs:
        cpus, memory = REQUESTS[rule_of(job["Comment"])]
        assert (job["State"], job["ReqCPUS"], job["ReqMem"], job["Timelimit"]) == (
            "COMPLETED",
            cpus,
            memory,
            "00:10:00",
        ), job
    assert "localrule verify_env:" in console and "localrule report:" in console


def test_the_cluster_run_leaves_what_a_local_run_would(cluster, finished_run):
    workdir, _, _ = finished_run
    run = workdir / "results" / "tiny"
    for stage, epochs in STAGES.items():
        assert stage_epochs(run, stage) == list(range(epochs)), stage
        assert not (run / "work" / stage).exists(), "a finished stage leaves no work folder behind"
    assert json.loads((run / "export" / "export.json").read_text())
    assert all(f"| {stage} " in (run / "report" / "summary.md").read_text() for stage in STAGES)
    # The local profile (profiles/default) finds nothing to redo: same outputs, parameters and code as it would make.
    local = subprocess.run(
        [str(Path(sys.executable).with_name("snakemake")), "-s", str(REPO / "Snakefile"), "-d", str(workdir)]
        + ["--cores", "2", "--configfile", str(workdir / TINY.name), "-n"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert local.returncode == 0 and "Nothing to be done" in local.stdout + local.stderr, local.stdout[-4000:]


def test_a_cancelled_stage_resumes_from_its_checkpoint_on_the_rerun(cluster, finished_run):
    workdir, profile, _ = finished_run
    run = workdir / "results" / "tiny"
    slow = {**cluster, "STAGEDYOLO_TEST_FAULT": "sleep@1.0"}  # ~4 s per epoch: time to cancel between two
    process = start_workflow(workdir, profile, "--forcerun", STAGE_TARGET, "--", STAGE_TARGET, env=slow)
    try:
        job_id = stage_job_id(cluster, FAULTY_STAGE)
        wait_for_checkpoint(run / "work" / FAULTY_STAGE, process)
        subprocess.run(["scancel", job_id], check=True, env=cluster, timeout=30)
        wait_for_state(cluster, job_id, "CANCELLED")
        stop_waiting_snakemake(process)
    finally:
        unlock_if_killed(process, workdir, profile, cluster)

    rerun = run_workflow(workdir, profile, "--", STAGE_TARGET, env=cluster)

    assert rerun.returncode == 0, (rerun.stdout + rerun.stderr)[-6000:]
    assert_resumed(run)


def wait_for_state(env, job_id: str, state: str, timeout=60) -> None:
    deadline = time.time() + timeout
    while not sacct_jobs(env, "-j", job_id)[0]["State"].startswith(state):
        assert time.time() < deadline, f"job {job_id} never reached {state}: {sacct_jobs(env, '-j', job_id)}"
        time.sleep(0.5)


def stop_waiting_snakemake(process: subprocess.Popen) -> None:
    """What a user does after scancel: the plugin (2.6 to 2.8) reads sacct's "CANCELLED by <uid>" as a job still
    running, so Snakemake would wait for it forever. Ctrl-C (SIGINT) makes it give up the job and release its lock;
    under load one Ctrl-C has gone unanswered for minutes (a CI run), so as a user would, press it again."""
    time.sleep(3)  # three status polls: time to notice the cancel, for a plugin that can
    for _ in range(3):
        if process.poll() is not None:
            break
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            continue
    if process.poll() is None:
        # A CI run saw all three go unanswered for 4 minutes while the plugin waited on the cancelled job: the user
        # then kills it, and unlock_if_killed unlocks the folder. The rerun below is what the test is about.
        return
    assert process.returncode != 0, "Snakemake took a cancelled stage for a finished one"


def unlock_if_killed(process: subprocess.Popen, workdir: Path, profile: Path, env) -> None:
    """A Snakemake the test had to kill leaves its lock, which would fail every later run in the work folder."""
    if process.poll() is None:
        process.kill()
        process.wait(timeout=30)
        run_workflow(workdir, profile, "--unlock", env=env, timeout=120)


def assert_resumed(run: Path) -> None:
    """The stage took up its work folder's checkpoint and finished its epochs once each (as tests/test_resume_e2e)."""
    log = (run / "logs" / "stages" / f"{FAULTY_STAGE}.log").read_text()
    assert "resuming" in log and "Resuming training from" in log, log[-3000:]
    assert stage_epochs(run, FAULTY_STAGE) == list(range(STAGES[FAULTY_STAGE]))
    attempts = json.loads((run / "stages" / FAULTY_STAGE / "stage.json").read_text())["attempts"]
    assert attempts[-1]["resumed_from"] and attempts[-1]["status"] == "ok", attempts
    assert not (run / "work" / FAULTY_STAGE).exists()


def test_a_requeued_stage_resumes_in_its_own_work_folder(cluster, finished_run):
    """scontrol requeue kills the running job and starts it again under the same id: the new start must find the
    work folder as the killed one left it, and resume."""
    workdir, profile, _ = finished_run
    run = workdir / "results" / "tiny"
    slow = {**cluster, "STAGEDYOLO_TEST_FAULT": "sleep@1.0"}
    process = start_workflow(workdir, profile, "--forcerun", STAGE_TARGET, "--", STAGE_TARGET, env=slow)
    try:
        job_id = stage_job_id(cluster, FAULTY_STAGE)
        wait_for_checkpoint(run / "work" / FAULTY_STAGE, process)
        subprocess.run(["scontrol", "requeue", job_id], check=True, env=cluster, timeout=30)
        assert process.wait(timeout=300) == 0, process.console.read_text()[-3000:]
    finally:
        unlock_if_killed(process, workdir, profile, cluster)
    runs = sacct_jobs(cluster, "--duplicates", "-j", job_id)  # one row for each time the job ran
    assert [run["State"] for run in runs] == ["REQUEUED", "COMPLETED"], runs
    assert_resumed(run)


def test_a_job_past_its_time_limit_is_reported_as_timeout_with_its_logs(cluster, timeout_run, finished_run):
    """SLURM ends the job TIMEOUT; Snakemake's error names the state, the rule's log and the job's SLURM log, which
    says why. Neither names the resource to raise (`runtime`): docs/cluster.md does."""
    workdir, process = timeout_run
    assert process.wait(timeout=300) != 0
    console = process.console.read_text()
    (job,) = [j for j in sacct_jobs(cluster, "--name", run_uuid(console)) if rule_of(j["Comment"]) == "demo_pretrain"]
    assert (job["State"], job["Timelimit"]) == ("TIMEOUT", "00:01:00"), job
    assert "SLURM status is: 'TIMEOUT'" in console, console[-4000:]
    error = console[console.index("Error in rule demo_pretrain:") :]
    assert "results/tiny/logs/demo_pretrain.log" in error  # the rule's own log
    slurm_log = Path(error.split("log: ", 1)[1].split(", ")[1].split(" ")[0])
    assert "DUE TO TIME LIMIT" in slurm_log.read_text()  # SLURM's own line, in the job's SLURM log
