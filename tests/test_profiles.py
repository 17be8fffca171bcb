"""The cluster profiles, driven through real Snakemake and the real executor plugins, where no cluster can show it.

SLURM: what a GPU job asks for (--gpus per stage, one node, one task). The one-host cluster of
tests/test_slurm_cluster.py has no GPU, so there a fake SLURM (tests/stubs) records every sbatch call of the shipped
profile; no job runs. Everything a CPU cluster can show (one job per remote rule, local rules on the submit host,
CPUs, memory and time as the controller records them, the jobs' states) is tested against the real controller.
Kubernetes: a dry run (the plugin needs a cluster to do anything more).
"""

import json
import os
import re
import shlex
import subprocess
import sys

import pytest
import yaml
from snakemake_runner import REPO, make_workdir

STUBS = REPO / "tests" / "stubs"
# Two stages, so that one SLURM submission asks for 1 GPU and the next for 2 (the rule's per-stage gpu resource
# must survive the profile's set-resources). It replaces the default recipe, stage_order included.
CLUSTER_STAGES = {"one": {"epochs": 1, "start_from": "model"}, "two": {"epochs": 1, "gpus": 2, "batch": 16}}


def cluster_workdir(tmp_path):
    workdir = make_workdir(tmp_path)
    config_path = workdir / "config" / "config.yaml"
    config = yaml.safe_load(config_path.read_text())
    cluster = {**config, "run": "cluster", "stage_order": list(CLUSTER_STAGES), "stages": CLUSTER_STAGES}
    config_path.write_text(yaml.safe_dump(cluster, sort_keys=False))
    return workdir


# The SLURM plugin sleeps 5 s before every sbatch, to spare a real slurmctld; the stub has none to spare, and five
# submission rounds would cost 25 s. This runs Snakemake's own CLI with that one sleep made instant.
SNAKEMAKE_WITHOUT_SBATCH_PAUSE = """
import sys, time, types
import snakemake_executor_plugin_slurm as slurm
slurm.time = types.SimpleNamespace(time=time.time, sleep=lambda seconds: None)
from snakemake.cli import main
main()
"""


def run_snakemake(workdir, *args, env=None, timeout=120):
    """Snakemake on the repo's Snakefile in `workdir`, with no --cores of ours (the profiles decide)."""
    argv = [
        sys.executable,
        "-c",
        SNAKEMAKE_WITHOUT_SBATCH_PAUSE,
        "-s",
        str(REPO / "Snakefile"),
        "-d",
        str(workdir),
        *args,
    ]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})


def dry_run_jobs(dry_run_output: str) -> dict[str, dict[str, str]]:
    """{'rule:wildcards' (as sbatch's --target-jobs names a job): {field: value}} from a dry run's job listing."""
    jobs, key, fields = {}, None, {}
    for line in dry_run_output.splitlines() + ["rule end:"]:
        header = re.match(r"(?:local)?rule (\w+):$", line.strip())
        if header or line.startswith("Job stats"):
            if key:
                jobs.setdefault(key + fields.get("wildcards", "").replace(", ", ","), fields)
            key, fields = (f"{header.group(1)}:", {}) if header else (None, {})
        elif key and re.match(r"    \w+: ", line):
            name, value = line.strip().split(": ", 1)
            fields[name] = value
    return jobs


def planned_outputs(jobs: dict[str, dict[str, str]]) -> dict[str, list[str]]:
    """What each job must leave behind for Snakemake to call it done: its outputs and its benchmark file."""
    return {
        key: [f.strip() for field in ("output", "benchmark") if field in job for f in job[field].split(",")]
        for key, job in jobs.items()
    }


@pytest.fixture(scope="module")
def slurm_run(tmp_path_factory):
    workdir = cluster_workdir(tmp_path_factory.mktemp("slurm"))
    profile = ["--workflow-profile", str(REPO / "profiles" / "slurm")]

    dry = run_snakemake(workdir, *profile, "-n")
    assert dry.returncode == 0, dry.stderr[-4000:]
    jobs = planned_outputs(dry_run_jobs(dry.stdout + dry.stderr))
    (workdir / "outputs.json").write_text(json.dumps(jobs))

    env = {
        "PATH": f"{STUBS}{os.pathsep}{os.environ['PATH']}",
        "SLURM_STUB_LOG": str(workdir / "slurm_calls.jsonl"),
        "SLURM_STUB_OUTPUTS": str(workdir / "outputs.json"),
        "SLURM_STUB_PYTHON": sys.executable,
    }
    # Poll every second instead of the plugin's 40 s: the stub's jobs are done when sbatch returns.
    real = run_snakemake(
        workdir,
        *profile,
        "--slurm-init-seconds-before-status-checks",
        "1",
        "--seconds-between-status-checks",
        "1",
        "--latency-wait",
        "1",
        env=env,
    )
    calls = [json.loads(line) for line in (workdir / "slurm_calls.jsonl").read_text().splitlines()]
    return workdir, dry, real, jobs, calls


def submissions(calls) -> dict[str, list[str]]:
    """{'rule:wildcards': sbatch argv} for every sbatch call."""
    out = {}
    for call in (c for c in calls if c["cmd"] == "sbatch"):
        wrap = next(a for a in call["argv"] if a.startswith("--wrap="))
        target = shlex.split(wrap.removeprefix("--wrap="))
        out[target[target.index("--target-jobs") + 1]] = call["argv"]
    return out


def test_gpu_jobs_ask_slurm_for_their_gpus(slurm_run):
    _, _, real, _, calls = slurm_run
    assert real.returncode == 0, real.stderr[-4000:]
    submitted = submissions(calls)
    expected_gpus = {
        "train_stage:stage=one": 1,
        "train_stage:stage=two": 2,
        "probe:": 1,
        "demo_pretrain:": 1,
        "evaluate_test:": 1,
    }
    for job, gpus in expected_gpus.items():
        argv = submitted[job]
        assert [a for a in argv if a.startswith(("--gpus", "--gres"))] == [f"--gpus={gpus}"], (job, argv)
        assert any(a.startswith("--cpus-per-gpu=") for a in argv), (job, argv)
        assert "--mem" in argv and "-t" in argv, (job, argv)
        # One node, one task owning all the job's GPUs (torch.distributed.run starts the ranks inside it).
        assert "--nodes=1" in argv and not [a for a in argv if a.startswith("--ntasks")], (job, argv)
    stage = submitted["train_stage:stage=two"]
    assert "--cpus-per-gpu=8" in stage and stage[stage.index("--mem") + 1] == "64000"
    assert stage[stage.index("-t") + 1] == "720"
    # The job itself runs the stage with the threads the profile set (OMP_NUM_THREADS, the DDP thread split).
    wrap = next(a for a in stage if a.startswith("--wrap="))
    assert "--set-threads" in wrap


KUBERNETES_STORAGE = ["--default-storage-provider", "fs", "--default-storage-prefix"]


def test_the_kubernetes_profile_dry_runs_with_local_storage(tmp_path):
    workdir = cluster_workdir(tmp_path)
    profile = yaml.safe_load((REPO / "profiles" / "kubernetes" / "profile.yaml").read_text())
    assert profile["executor"] == "kubernetes" and profile["default-storage-provider"] == "fs"
    # The profile's storage prefix is a cluster volume; a dry run here points the fs plugin at a temp folder.
    result = run_snakemake(
        workdir,
        "--workflow-profile",
        str(REPO / "profiles" / "kubernetes"),
        "-n",
        *KUBERNETES_STORAGE,
        str(tmp_path / "storage"),
    )
    assert result.returncode == 0, result.stderr[-4000:]
    jobs = dry_run_jobs(result.stdout + result.stderr)
    for job, gpus in {"train_stage:stage=one": 1, "train_stage:stage=two": 2, "probe:": 1, "demo_pretrain:": 1}.items():
        resources = dict(r.split("=", 1) for r in jobs[job]["resources"].split(", "))
        # The plugin refuses a GPU job without gpu_manufacturer; scale=0 turns the GPU request into a limit.
        assert (resources["gpu"], resources["gpu_manufacturer"], resources["scale"]) == (str(gpus), "nvidia", "0"), job
    assert "gpu" not in jobs["prepare_dataset:"]["resources"]
    assert "(send to storage)" in jobs["train_stage:stage=two"]["output"]  # outputs go through the fs storage
