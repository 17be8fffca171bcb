"""A tiny deterministic DDP training job (gloo, CPU) standing in for a YOLOv5 stage in tests/test_multinode.py.

yolov5's train.py asserts CUDA under DDP, so the launcher's multi-node rendezvous, ranks and batch split are checked
with this job instead: a fixed-seed two-layer net, a DistributedSampler over fixed data, SGD. Each rank splits the
total batch as yolov5 does (total // WORLD_SIZE) and writes ``<out>/rank<RANK>.json`` with what the launcher gave it;
rank 0 also writes ``<out>/losses.json``: each step's loss over the whole total batch, which does not depend on how
the ranks are spread over nodes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from stagedyolo.launch import bound_init_process_group_timeout, exit_when_parent_dies

LAUNCH_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "OMP_NUM_THREADS")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--total-batch", type=int, required=True)
    parser.add_argument("--steps", type=int, default=8)
    return parser.parse_args()


def fixed_data(samples: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randn(samples, 16, generator=generator)
    targets = inputs @ torch.randn(16, 1, generator=generator) + 0.1 * torch.randn(samples, 1, generator=generator)
    return TensorDataset(inputs, targets)


def write_json(path: Path, value) -> None:
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(value))
    os.replace(partial, path)  # readers never see half a file


def train(args: argparse.Namespace, rank: int, world_size: int) -> list[float]:
    torch.manual_seed(0)  # every rank builds the same net; DDP also broadcasts rank 0's
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    model = DistributedDataParallel(net)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    per_rank = args.total_batch // world_size  # as yolov5 splits --batch-size under DDP
    data = fixed_data(args.total_batch * args.steps)
    sampler = DistributedSampler(data, num_replicas=world_size, rank=rank, shuffle=False)
    losses = []
    for inputs, targets in DataLoader(data, batch_size=per_rank, sampler=sampler):
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()  # DDP averages the gradients: the step of one process over the whole total batch
        optimizer.step()
        whole_batch = loss.detach().clone()
        dist.all_reduce(whole_batch)
        losses.append(whole_batch.item() / world_size)
    return losses


def main() -> int:
    args = parse_args()
    exit_when_parent_dies(poll_s=0.2, grace_s=1.0)
    bound_init_process_group_timeout()  # from STAGEDYOLO_DDP_TIMEOUT_S, as the real worker does
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    launch = {name: os.environ.get(name) for name in LAUNCH_ENV}
    launch.update(node=os.environ.get("SLURM_NODEID"), batch=args.total_batch // world_size)
    write_json(args.out / f"rank{rank}.json", launch)
    losses = train(args, rank, world_size)
    if rank == 0:
        write_json(args.out / "losses.json", losses)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
