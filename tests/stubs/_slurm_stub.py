"""A fake SLURM for tests: sbatch, sacct, scontrol and sinfo are wrappers that call this script.

Every call is appended as one JSON line {"cmd", "argv", "stdin"} to $SLURM_STUB_LOG. No job ever runs: sbatch
prints a job id and, to let the workflow move on, creates the outputs the submitted job declares, looked up by
its `--target-jobs` value in the JSON map $SLURM_STUB_OUTPUTS ({"rule:wildcards": [paths]}, relative to the
job's -D directory). sacct then reports every submitted job COMPLETED.
"""

import json
import os
import re
import sys
from pathlib import Path

LOG = Path(os.environ["SLURM_STUB_LOG"])
FIRST_JOB_ID = 1000


def submitted_ids():
    if not LOG.exists():
        return []
    calls = [json.loads(line) for line in LOG.read_text().splitlines() if line.strip()]
    return [FIRST_JOB_ID + i for i, call in enumerate(c for c in calls if c["cmd"] == "sbatch")]


def log(cmd, argv, stdin=None):
    with LOG.open("a") as f:
        f.write(json.dumps({"cmd": cmd, "argv": argv, "stdin": stdin}) + "\n")


def sbatch(argv):
    stdin = None if sys.stdin.isatty() else sys.stdin.read() or None
    job_id = FIRST_JOB_ID + len(submitted_ids())
    log("sbatch", argv, stdin)
    script = " ".join(a for a in argv if a.startswith("--wrap=")) or stdin or ""
    target = re.search(r"--target-jobs\s+'?([^'\s]+)'?", script)
    workdir = Path(argv[argv.index("-D") + 1]) if "-D" in argv else Path.cwd()
    outputs = (
        json.loads(Path(os.environ["SLURM_STUB_OUTPUTS"]).read_text()) if "SLURM_STUB_OUTPUTS" in os.environ else {}
    )
    for path in outputs.get(target.group(1), []) if target else []:
        out = workdir / path
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(f"placeholder written by the sbatch stub for job {job_id}\n")
    print(job_id)  # what `sbatch --parsable` prints


def sacct(argv):
    log("sacct", argv)
    if "--name" in argv:  # the plugin's status query: JobIdRaw|State, one line per job
        for job_id in submitted_ids():
            print(f"{job_id}|COMPLETED")
    # anything else (the plugin guessing an account from `sacct -nu USER`): no account, which it accepts


def scontrol(argv):
    log("scontrol", argv)
    if argv[:2] == ["show", "config"]:
        print("MaxArraySize            = 1001\nMinJobAge               = 300 sec")


def sinfo(argv):
    log("sinfo", argv)
    print("PARTITION\ngpu*\ncpu")  # `*` marks the default partition


if __name__ == "__main__":
    # argv: the command's name (from its wrapper script), then the command's own arguments
    {"sbatch": sbatch, "sacct": sacct, "scontrol": scontrol, "sinfo": sinfo}[sys.argv[1]](sys.argv[2:])
