"""Run the real workflow with real Snakemake in a throwaway working directory (tests only)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))


def make_workdir(tmp: Path, *configs: str | Path) -> Path:
    """A working directory with the default config (Snakemake resolves `configfile:` against it)."""
    (tmp / "config").mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / "config" / "config.yaml", tmp / "config" / "config.yaml")
    for config in configs:
        shutil.copy(config, tmp / Path(config).name)
    return tmp


def run_overlay(project: Path, overlay: dict, dataset: Path) -> Path:
    """Run the whole workflow on ``dataset`` with ``overlay`` (its `run` names it) over the default config, in a
    fresh working directory ``project``; returns the run's results folder."""
    workdir = make_workdir(project)
    path = workdir / f"{overlay['run']}.yaml"
    path.write_text(yaml.safe_dump({**overlay, "dataset": str(dataset)}))
    snakemake(workdir, configfiles=[path])
    return workdir / "results" / overlay["run"]


def snakemake(
    workdir: Path,
    *args: str,
    configfiles=(),
    timeout: int = 900,
    check: bool = True,
    net_log=None,
    env: dict | None = None,
):
    """Run snakemake on the repo's Snakefile in `workdir`. With `net_log`, every Python process it starts records
    its network attempts there (tests/netguard/sitecustomize.py)."""
    argv = [SNAKEMAKE, "-s", str(REPO / "Snakefile"), "-d", str(workdir), "--cores", "2", *args]
    if configfiles:
        argv += ["--configfile", *map(str, configfiles)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    if net_log:
        env["PYTHONPATH"] = os.pathsep.join([str(REPO / "tests" / "netguard"), env.get("PYTHONPATH", "")])
        env["STAGEDYOLO_NET_LOG"] = str(net_log)
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    if check and result.returncode != 0:
        raise AssertionError(
            f"snakemake {' '.join(args)} failed ({result.returncode}):\n{result.stdout[-4000:]}\n"
            f"{result.stderr[-8000:]}"
        )
    return result


def planned_jobs(dry_run_output: str) -> dict[str, int]:
    """The 'Job stats' table of a dry run, as {rule: count}."""
    jobs, in_table = {}, False
    for line in dry_run_output.splitlines():
        if line.startswith("job ") and "count" in line:
            in_table = True
            continue
        if in_table:
            parts = line.split()
            if not parts or parts[0] == "total":
                break
            if parts[0].startswith("-"):
                continue
            jobs[parts[0]] = int(parts[1])
    return jobs
