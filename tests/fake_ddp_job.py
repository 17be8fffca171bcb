"""A tiny torch.distributed job (gloo, CPU) standing in for a YOLOv5 DDP stage in tests/test_distributed.py.

Each rank starts a child process in its own process group, as a dataloader worker would, writes
``<pid-dir>/rank<N>.json`` with both PIDs, then all-reduces in a loop. Options make one rank die or hang.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from stagedyolo.launch import bound_init_process_group_timeout, exit_when_parent_dies

# The worst case for a supervisor: a worker that ignores SIGTERM. Real DataLoader workers also poll their
# parent and leave when it is gone; --loader-watches-parent turns that on.
LOADER_SOURCE = """
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
parent = os.getppid()
print("ready", flush=True)
while not (sys.argv[1] == "watch" and os.getppid() != parent):
    time.sleep(0.2)
"""


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pid-dir", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=10**6)
    parser.add_argument("--step-s", type=float, default=0.05)
    parser.add_argument("--die-rank", type=int, default=-1, help="this rank exits with 7 at step 3")
    parser.add_argument("--hang-rank", type=int, default=-1, help="this rank stops taking part at step 3")
    parser.add_argument("--loader-watches-parent", action="store_true")
    return parser.parse_args()


def write_pids(pid_dir: Path, rank: int, loader_pid: int) -> None:
    target = pid_dir / f"rank{rank}.json"
    partial = target.with_suffix(".partial")
    partial.write_text(json.dumps({"rank": os.getpid(), "loader": loader_pid}))
    os.replace(partial, target)  # readers never see half a file


def main() -> int:
    args = parse_args()
    exit_when_parent_dies(poll_s=0.2, grace_s=1.0)
    bound_init_process_group_timeout()  # from STAGEDYOLO_DDP_TIMEOUT_S, as the real worker does
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    watch = "watch" if args.loader_watches_parent else "ignore"
    loader = subprocess.Popen([sys.executable, "-c", LOADER_SOURCE, watch], stdout=subprocess.PIPE, text=True)
    loader.stdout.readline()  # it ignores SIGTERM from now on: only then may the test stop the stage
    write_pids(args.pid_dir, rank, loader.pid)
    for step in range(args.steps):
        if step == 3 and rank == args.die_rank:
            os._exit(7)
        while step == 3 and rank == args.hang_rank:
            time.sleep(1)
        total = torch.ones(1)
        dist.all_reduce(total)
        assert total.item() == world_size
        time.sleep(args.step_s)
    dist.destroy_process_group()
    loader.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
