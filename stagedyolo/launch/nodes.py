"""A stage across several nodes of one SLURM allocation: which hosts, which rendezvous endpoint, and the srun that
starts one torch.distributed.run agent on each node (see docs/ddp.md)."""

from __future__ import annotations

import itertools
import re
import zlib
from collections.abc import Mapping
from dataclasses import dataclass

from .errors import LaunchError

# Overrides for a cluster where the defaults do not fit: the port, and the address the other nodes reach the first
# node at (when its SLURM node name is not that address, e.g. the fast network has its own host names).
RDZV_PORT_ENV = "STAGEDYOLO_RDZV_PORT"
RDZV_HOST_ENV = "STAGEDYOLO_RDZV_HOST"
# A multi-node rendezvous cannot bind port 0: every node must know the port before the store listens. It is derived
# from the job id, so two stages sharing a first node rarely collide, and lies above the privileged ports and below
# Linux's ephemeral range (32768-60999), which the OS hands out to outgoing connections.
RDZV_PORT_BASE = 20000
RDZV_PORT_SPAN = 10000
# What the launching srun keeps of the stage's SLURM_* variables: which job it is. The rest describe the job step
# the stage may run in (Snakemake's job step executor wraps a rule in `srun -n1`: one task, one node) and srun would
# read them as its own options; the plugin strips the same set before its own nested srun.
SLURM_IDENTITY = (
    "SLURM_JOB_ID",
    "SLURM_JOBID",
    "SLURM_ARRAY_JOB_ID",
    "SLURM_ARRAY_TASK_ID",
    "SLURM_CLUSTER_NAME",
    "SLURM_SUBMIT_DIR",
    "SLURM_SUBMIT_HOST",
)


@dataclass(frozen=True)
class NodeLayout:
    """Where a multi-node stage runs: one agent on each of ``hosts``, meeting at ``rdzv_host``:``port``."""

    hosts: tuple[str, ...]
    rdzv_host: str
    port: int
    job_id: str

    @property
    def nodes(self) -> int:
        return len(self.hosts)

    @property
    def endpoint(self) -> str:
        return f"{self.rdzv_host}:{self.port}"


def expand_hostlist(expression: str) -> list[str]:
    """The host names of a SLURM host list, as ``scontrol show hostnames`` prints them: ``gpu[01-03,07],login1``.

    In-process rather than through scontrol, which needs the cluster's configuration wherever it runs.
    """
    hosts: list[str] = []
    for item in re.findall(r"(?:[^,\[]|\[[^\]]*\])+", expression):
        parts = re.split(r"\[([^\]]*)\]", item)  # text, ranges, text, ranges, ..., text
        choices = [[text] if index % 2 == 0 else _expand_ranges(text) for index, text in enumerate(parts)]
        hosts.extend("".join(combination) for combination in itertools.product(*choices))
    return hosts


def _expand_ranges(ranges: str) -> list[str]:
    names: list[str] = []
    for part in ranges.split(","):
        low, _, high = part.partition("-")
        width = len(low)  # "01-10": zero-padded to the lower bound's width, as SLURM writes it
        names.extend(f"{number:0{width}d}" for number in range(int(low), int(high or low) + 1))
    return names


def rendezvous_port(job_id: str, env: Mapping[str, str], port: int | None = None) -> int:
    """The caller's port, else $STAGEDYOLO_RDZV_PORT, else one derived from the job id (the same on every node)."""
    if port:
        return int(port)
    if env.get(RDZV_PORT_ENV):
        return int(env[RDZV_PORT_ENV])
    number = int(job_id) if job_id.isdigit() else zlib.crc32(job_id.encode())
    return RDZV_PORT_BASE + number % RDZV_PORT_SPAN


def slurm_layout(nodes: int, env: Mapping[str, str], stage: str = "<stage>", port: int | None = None) -> NodeLayout:
    """The first ``nodes`` nodes of the SLURM allocation the stage runs in; the first of them hosts the rendezvous."""
    job_id, nodelist = env.get("SLURM_JOB_ID", ""), env.get("SLURM_JOB_NODELIST", "")
    if not job_id or not nodelist:
        raise LaunchError(
            f"stages.{stage}.nodes is {nodes}: a stage across nodes runs inside one SLURM allocation of {nodes} "
            "nodes (SLURM_JOB_ID and SLURM_JOB_NODELIST are unset here); submit it with --nodes "
            f"{nodes}, or set nodes: 1"
        )
    hosts = expand_hostlist(nodelist)
    if len(hosts) < nodes:
        raise LaunchError(
            f"stages.{stage}.nodes is {nodes} but the allocation SLURM_JOB_NODELIST={nodelist!r} has "
            f"{len(hosts)}: request {nodes} nodes from the scheduler (Snakemake: resources nodes={nodes})"
        )
    hosts = hosts[:nodes]
    rdzv_host = env.get(RDZV_HOST_ENV) or hosts[0]
    return NodeLayout(tuple(hosts), rdzv_host, rendezvous_port(job_id, env, port), job_id)


def srun_command(layout: NodeLayout, cpus_per_node: int) -> list[str]:
    """The srun options that start one agent on each node of ``layout``; the agent's argv follows them."""
    return [
        "srun",
        "--nodes",
        str(layout.nodes),
        "--ntasks",
        str(layout.nodes),
        "--ntasks-per-node",
        "1",
        # Named, so the first node (the rendezvous host) is among them when the allocation has more nodes.
        "--nodelist",
        ",".join(layout.hosts),
        # Each agent's ranks split these cores (threads_per_rank); srun would otherwise give the task one core.
        "--cpus-per-task",
        str(cpus_per_node),
        # The stage itself may run in a job step that holds the first node's cores (Snakemake's job step executor).
        "--overlap",
        # A node whose agent fails ends the others now rather than after the rendezvous or collective timeout.
        "--kill-on-bad-exit=1",
    ]


def srun_environment(env: Mapping[str, str]) -> dict[str, str]:
    """The stage's environment without the SLURM_*/SRUN_*/SBATCH_* settings srun would take for its own options."""
    return {
        name: value
        for name, value in env.items()
        if name in SLURM_IDENTITY or not name.startswith(("SLURM_", "SRUN_", "SBATCH_"))
    }
