"""torch.distributed when launched by torchrun, a single process otherwise. No cluster code of our own.

Accumulators are sums, so combining ranks is one ``all_reduce``; rank 0 writes files.
"""

from __future__ import annotations

import atexit
import os

import torch
import torch.distributed as dist


def launched_by_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and int(os.environ["WORLD_SIZE"]) > 1


def init_if_launched(device: str = "cpu") -> bool:
    """Join the process group torchrun prepared (gloo on CPU, nccl on CUDA); True when distributed."""
    if not launched_by_torchrun():
        return False
    if not dist.is_initialized():
        backend = "nccl" if device.startswith("cuda") else "gloo"
        dist.init_process_group(backend=backend)
        atexit.register(_shutdown)  # leave the group before the interpreter tears its threads down
    return True


def _shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def is_main_process() -> bool:
    return rank() == 0


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum ``tensor`` over ranks in place (a no-op in one process) and return it."""
    if is_distributed():
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def barrier() -> None:
    if is_distributed():
        dist.barrier()


def all_gather_objects(obj):
    """Every rank's ``obj`` (picklable), in rank order; ``[obj]`` in one process."""
    if not is_distributed():
        return [obj]
    out = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out
