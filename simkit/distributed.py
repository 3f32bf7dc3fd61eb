"""torch.distributed when launched by torchrun, a single process otherwise. No cluster code of our own.

Accumulators are sums, so combining ranks is one ``all_reduce``; rank 0 writes files.
"""

from __future__ import annotations

import atexit
import os

import torch
import torch.distributed as dist


def launched_by_torchrun() -> bool:
    """True when torchrun started this process with a world size above 1."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and int(os.environ["WORLD_SIZE"]) > 1


def init_if_launched(device: str = "cpu") -> bool:
    """Join the process group torchrun prepared (gloo on CPU, nccl on CUDA); True when distributed.

    The group is left by :func:`shutdown` (the CLI's command wrapper calls it on every rank, on success
    and on error; an ``atexit`` hook is the backstop for Python callers)."""
    if not launched_by_torchrun():
        return False
    if not dist.is_initialized():
        # torch._dynamo first: imported after the group exists (the first optimizer step imports it), it
        # keeps the group alive past destroy_process_group, so gloo's worker threads outlive it into
        # interpreter finalisation; a worker that then drops a finished all_reduce whose tensor's Python
        # object it owns needs the GIL, and taking the GIL while the interpreter finalises ends the thread
        # inside C++ -> "terminate called without an active exception" (exit -6), about 1 run in 15-6.
        import torch._dynamo  # noqa: F401

        backend = "nccl" if device.startswith("cuda") else "gloo"
        dist.init_process_group(backend=backend)
        atexit.register(shutdown)  # the backstop; the CLI leaves the group before its command returns
    return True


def shutdown(ok: bool = True) -> None:
    """Leave the process group (a no-op when not in one), on every rank: ``ok`` (the run succeeded on
    this rank): a barrier first, so that no rank leaves while another still talks to it; then the group
    is destroyed, which waits for gloo's workers to finish and release their work. On an error path
    (``ok`` False) there is no barrier: another rank may be inside a collective this rank never joins."""
    if not (dist.is_available() and dist.is_initialized()):
        return
    try:
        if ok and dist.get_world_size() > 1:
            dist.barrier()
    except RuntimeError:  # a rank that is gone (DistBackendError is a RuntimeError): leave all the same
        pass
    finally:
        dist.destroy_process_group()


def is_distributed() -> bool:
    """True inside an initialised process group of more than one rank."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    """This process's rank in the group (0 in one process)."""
    return dist.get_rank() if is_distributed() else 0


def world_size() -> int:
    """Number of ranks in the group (1 in one process)."""
    return dist.get_world_size() if is_distributed() else 1


def is_main_process() -> bool:
    """True on rank 0 (the rank that writes files), and in one process."""
    return rank() == 0


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum ``tensor`` over ranks in place (a no-op in one process) and return it."""
    if is_distributed():
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def barrier() -> None:
    """Wait until every rank gets here (a no-op in one process)."""
    if is_distributed():
        dist.barrier()


def all_gather_objects(obj):
    """Every rank's ``obj`` (picklable), in rank order; ``[obj]`` in one process."""
    if not is_distributed():
        return [obj]
    out = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out
