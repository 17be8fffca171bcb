"""A stage across nodes: the srun + torchrun command stagedyolo.launch builds for a SLURM allocation, and two
launcher agents on this host (gloo, CPU), each started as srun starts it on its node, training as one node does."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import psutil
import pytest

from stagedyolo.launch import (
    DDP_TIMEOUT_ENV,
    RDZV_HOST_ENV,
    RDZV_PORT_ENV,
    LaunchError,
    build_stage_command,
    expand_hostlist,
    rendezvous_port,
    slurm_layout,
    thread_budget,
)
from stagedyolo.launch.nodes import RDZV_PORT_BASE, RDZV_PORT_SPAN, srun_command

REPO = Path(__file__).resolve().parents[1]
FAKE_JOB = Path(__file__).with_name("fake_multinode_job.py")
WORKER = ["-m", "stagedyolo.engine.worker", "/runs/a/plan.json"]
# An allocation of two nodes as the stage's job sees it inside Snakemake's job step (one task on the first node).
ALLOCATION = {
    "SLURM_JOB_ID": "4242",
    "SLURM_JOB_NODELIST": "gpu[07-08]",
    "SLURM_NTASKS": "1",
    "SLURM_STEP_ID": "0",
    "OMP_NUM_THREADS": "16",
}


def _option(argv, name):
    return argv[argv.index(name) + 1]


# ----------------------------------------------------------------------------------------------- the command


def test_each_node_runs_one_torchrun_agent_started_by_srun():
    argv, env = build_stage_command(WORKER, 4, 64, nodes=2, python="/py", env=ALLOCATION, ddp_timeout_s=600)

    srun = srun_command(slurm_layout(2, ALLOCATION), cpus_per_node=16)
    assert argv[: len(srun)] == srun
    assert _option(srun, "--nodes") == _option(srun, "--ntasks") == "2"
    assert _option(srun, "--ntasks-per-node") == "1"
    assert _option(srun, "--nodelist") == "gpu07,gpu08"
    assert _option(srun, "--cpus-per-task") == "16"  # the node's cores, split by its ranks below
    agent = argv[len(srun) :]
    assert agent[:3] == ["/py", "-m", "torch.distributed.run"] and agent[-len(WORKER) :] == WORKER
    assert _option(agent, "--nnodes") == "2"
    assert _option(agent, "--nproc-per-node") == "4"
    assert _option(agent, "--rdzv-backend") == "c10d"
    assert _option(agent, "--rdzv-endpoint") == f"gpu07:{RDZV_PORT_BASE + 4242}"  # the first node hosts it
    assert _option(agent, "--rdzv-id") == "4242"
    assert _option(agent, "--max-restarts") == "0"
    assert env["OMP_NUM_THREADS"] == "4"  # 16 cores per node over its 4 ranks
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
    assert env[DDP_TIMEOUT_ENV] == "600"
    # srun would read the job step's settings as its own options (one task): only the job's identity is kept.
    assert env["SLURM_JOB_ID"] == "4242" and "SLURM_NTASKS" not in env and "SLURM_STEP_ID" not in env


def test_the_batch_is_the_total_over_every_rank_of_every_node():
    with pytest.raises(LaunchError, match=r"batch 36 is the total batch over 8 GPUs .*: use 32 or 40"):
        build_stage_command(WORKER, 4, 36, nodes=2, env=ALLOCATION, stage="finetune")


def test_a_stage_across_nodes_needs_a_slurm_allocation_of_that_many_nodes():
    with pytest.raises(LaunchError, match=r"nodes is 2: .* \(SLURM_JOB_ID and SLURM_JOB_NODELIST are unset here\)"):
        build_stage_command(WORKER, 2, 8, nodes=2, env={"OMP_NUM_THREADS": "4"})
    with pytest.raises(LaunchError, match=r"nodes is 3 but the allocation .* has 2: request 3 nodes"):
        build_stage_command(WORKER, 2, 12, nodes=3, env=ALLOCATION)
    with pytest.raises(LaunchError, match="gpus of 1 or more"):
        build_stage_command(WORKER, 0, 8, nodes=2, env=ALLOCATION)


def test_a_larger_allocation_uses_its_first_nodes_so_the_rendezvous_host_runs_an_agent():
    layout = slurm_layout(2, {**ALLOCATION, "SLURM_JOB_NODELIST": "gpu[07-09]"})
    assert layout.hosts == ("gpu07", "gpu08") and layout.endpoint == f"gpu07:{RDZV_PORT_BASE + 4242}"


def test_the_rendezvous_port_is_fixed_by_the_job_id_unless_overridden():
    ports = {rendezvous_port(str(job_id), {}) for job_id in (0, 9999, 10000, 123456789)}
    assert all(RDZV_PORT_BASE <= port < RDZV_PORT_BASE + RDZV_PORT_SPAN for port in ports)
    assert rendezvous_port("10007", {}) == rendezvous_port("7", {}) == RDZV_PORT_BASE + 7
    assert rendezvous_port("4242", {RDZV_PORT_ENV: "31000"}) == 31000
    assert rendezvous_port("4242", {RDZV_PORT_ENV: "31000"}, port=29611) == 29611
    assert RDZV_PORT_BASE <= rendezvous_port("job-a", {}) < RDZV_PORT_BASE + RDZV_PORT_SPAN
    layout = slurm_layout(2, {**ALLOCATION, RDZV_HOST_ENV: "gpu07-ib"})
    assert layout.endpoint == f"gpu07-ib:{RDZV_PORT_BASE + 4242}" and layout.hosts == ("gpu07", "gpu08")


@pytest.mark.parametrize(
    ("nodelist", "hosts"),
    [
        ("node1", ["node1"]),
        ("gpu[01-03,07],login1", ["gpu01", "gpu02", "gpu03", "gpu07", "login1"]),
        ("n[9-11]", ["n9", "n10", "n11"]),
        ("rack[1-2]-gpu[3,5]", ["rack1-gpu3", "rack1-gpu5", "rack2-gpu3", "rack2-gpu5"]),
        ("a-1,b[001-002]", ["a-1", "b001", "b002"]),
    ],
)
def test_a_slurm_host_list_expands_as_scontrol_show_hostnames_does(nodelist, hosts):
    assert expand_hostlist(nodelist) == hosts


# ----------------------------------------------------------------------------------------------- two agents, one host

TOTAL_BATCH = 16
STEPS = 8


def _free_port() -> int:
    """A port for the two agents' rendezvous (on a cluster it comes from the job id; here it must be free now)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _job_args(out: Path) -> list[str]:
    return [str(FAKE_JOB), "--out", str(out), "--total-batch", str(TOTAL_BATCH), "--steps", str(STEPS)]


def _base_env(cores: int) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items() if not name.startswith(("SLURM_", "CUDA_VISIBLE"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["OMP_NUM_THREADS"] = str(cores)
    return env


def _srun_task_env(env: dict[str, str], hosts: tuple[str, ...], node: int) -> dict[str, str]:
    """What srun adds to a task's environment on the ``node``-th node of its step (one task per node)."""
    return {
        **env,
        "SLURM_NODEID": str(node),
        "SLURM_PROCID": str(node),
        "SLURM_LOCALID": "0",
        "SLURMD_NODENAME": hosts[node],
        "SLURM_NNODES": str(len(hosts)),
        "SLURM_NTASKS": str(len(hosts)),
        "SLURM_STEP_NODELIST": ",".join(hosts),
    }


def _run_all(commands: list[tuple[list[str], dict[str, str]]], within_s: float) -> None:
    """Run the commands side by side (as srun runs its tasks); each must exit 0."""
    started = [subprocess.Popen(argv, env=env, start_new_session=True) for argv, env in commands]
    try:
        for process in started:
            assert process.wait(timeout=within_s) == 0
    finally:
        for process in started:
            _kill_tree(process)


def _kill_tree(process: subprocess.Popen) -> None:
    """Test hygiene: no agent or rank outlives a failed test."""
    try:
        leftovers = [process, *psutil.Process(process.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for each in leftovers:
        try:
            each.kill()
        except psutil.NoSuchProcess:
            pass
    process.wait()


def _ranks(out: Path) -> list[dict]:
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(4)]


def _two_nodes(out: Path) -> list[tuple[list[str], dict[str, str]]]:
    """2 nodes x 2 ranks: the stage's srun command, its agent started twice as srun would, once per "node"."""
    allocation = {
        **_base_env(cores=4),
        "SLURM_JOB_ID": "777",
        "SLURM_JOB_NODELIST": "node[1-2]",
        RDZV_HOST_ENV: "127.0.0.1",  # both "nodes" are this host
        RDZV_PORT_ENV: str(_free_port()),
    }
    argv, env = build_stage_command(
        _job_args(out), 2, TOTAL_BATCH, nodes=2, env=allocation, rank_shutdown_s=2, log_dir=out / "torchrun"
    )
    layout = slurm_layout(2, allocation)
    srun = srun_command(layout, thread_budget(allocation))
    assert argv[: len(srun)] == srun
    agent = argv[len(srun) :]
    return [(agent, _srun_task_env(env, layout.hosts, node)) for node in range(2)]


def _one_node(out: Path) -> list[tuple[list[str], dict[str, str]]]:
    """1 node x 4 ranks, as a stage with gpus: 4 launches today."""
    return [
        build_stage_command(
            _job_args(out), 4, TOTAL_BATCH, env=_base_env(cores=8), rank_shutdown_s=2, log_dir=out / "torchrun"
        )
    ]


@pytest.mark.e2e
def test_two_nodes_train_with_the_same_per_step_losses_as_one_node_at_the_same_total_batch(tmp_path):
    (tmp_path / "two").mkdir()
    (tmp_path / "one").mkdir()
    # Side by side: most of the time is each process importing torch and waiting for its peers.
    _run_all([*_two_nodes(tmp_path / "two"), *_one_node(tmp_path / "one")], within_s=120)
    two_ranks, one_ranks = _ranks(tmp_path / "two"), _ranks(tmp_path / "one")

    for ranks, per_node in ((two_ranks, 2), (one_ranks, 4)):
        assert {rank["WORLD_SIZE"] for rank in ranks} == {"4"}
        assert {rank["LOCAL_WORLD_SIZE"] for rank in ranks} == {str(per_node)}
        assert {rank["batch"] for rank in ranks} == {TOTAL_BATCH // 4}
        assert {rank["OMP_NUM_THREADS"] for rank in ranks} == {"2"}  # the node's cores over its ranks, per node
    # Each agent's ranks are one node: local ranks 0 and 1 under one node rank, the two nodes told apart.
    by_node = {node: [rank for rank in two_ranks if rank["node"] == node] for node in ("0", "1")}
    assert [sorted(rank["LOCAL_RANK"] for rank in ranks) for ranks in by_node.values()] == [["0", "1"], ["0", "1"]]
    assert sorted({ranks[0]["GROUP_RANK"] for ranks in by_node.values()}) == ["0", "1"]
    assert all(len({rank["GROUP_RANK"] for rank in ranks}) == 1 for ranks in by_node.values())

    two = json.loads((tmp_path / "two" / "losses.json").read_text())
    one = json.loads((tmp_path / "one" / "losses.json").read_text())
    assert len(two) == len(one) == STEPS and two[-1] < two[0]  # it trained
    differences = [abs(a - b) for a, b in zip(two, one)]
    print(f"per-step losses, two nodes: {two}\none node: {one}\nmax abs difference: {max(differences):.3g}")
    assert max(differences) <= 1e-5 * max(one)
