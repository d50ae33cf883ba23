"""Data-parallel steps on torch: ``fit(..., backend="pyro", device=[...], shard="data")``.

One process per device, all running the same script (``torchrun --nproc_per_node=N``, or any
launcher that sets ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``; or a process
group the script made itself with :func:`torch.distributed.init_process_group`). Every process
runs the whole fit with the same seed, so each has the same keys, the same minibatch order and
the same state; what differs is each step's minibatch:

- each process takes its block of every minibatch's indices (:meth:`DataParallel.slice`, the
  seam the driver already has: ``Backend.place`` of the indices with their batch axis named),
  so its potential (or VI loss) is the minibatch estimate on B / N_proc points, scaled by
  N / (B / N_proc) (Eq. 2.8 of "Bayesian Computation in Deep Learning" with its own batch);
- the value and gradient of every ``value_and_grad`` are all-reduced (summed, one collective
  per call over one flat buffer) and divided by the number of processes: the mean of the
  processes' estimates is the prior term plus N / B times the whole minibatch's sum, the
  unsharded estimate, to float rounding (:meth:`DataParallel.mean`).

The kernels and the VI step in the core see one gradient, as on one device; every process
ends with the same draws. A traced step (:meth:`PyroBackend.trace`) is traced at the
process's own block, without the all-reduce, which runs after the traced graph. The process group is torch's own (gloo on the CPU, NCCL on CUDA
devices); it is made here only when none exists, and left to the script (or launcher) to end.

Example
-------
>>> import torch
>>> from ppl_bdl.backends.pyro.data_parallel import DataParallel
>>> one = DataParallel.local()  # a process group of one: slices and means are the identity
>>> one.slice(torch.arange(8).reshape(2, 4), axis=1).tolist()
[[0, 1, 2, 3], [4, 5, 6, 7]]
>>> one.mean((torch.tensor(2.0), {"w": torch.ones(2)}))[0].item()
2.0
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch.utils import _pytree as pytree

from ppl_bdl.errors import BackendError

#: What a launcher sets for every process (torchrun does).
LAUNCH_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


class DataParallel:
    """This process's part of a data-parallel fit: its rank among ``world`` processes and its
    device (``devices[rank]``)."""

    def __init__(self, rank: int, world: int, device: str):
        self.rank, self.world, self.device = rank, world, device

    @classmethod
    def local(cls) -> DataParallel:
        """One process alone (no process group): every operation is the identity."""
        return cls(0, 1, "cpu")

    @classmethod
    def join(cls, devices: list[str], given) -> DataParallel:
        """This process's part, joining (or making) torch's process group over ``devices``
        (one process per device; ``given``: the ``device=`` argument, for the errors)."""
        if not dist.is_available():
            raise BackendError(
                f"device={given!r}, shard='data': this torch build has no torch.distributed. "
                "Install a build with it (the PyPI wheels have it), or use one device."
            )
        if not dist.is_initialized():
            missing = [v for v in LAUNCH_VARS if v not in os.environ]
            if missing:
                raise BackendError(
                    f"device={given!r}, shard='data' on the pyro backend runs one process per "
                    f"device ({len(devices)}), each running this script, joined by "
                    "torch.distributed; this process is not one of them (no process group, and "
                    f"{', '.join(missing)} not set). Start the script with `torchrun "
                    f"--nproc_per_node={len(devices)} script.py`, or call "
                    "torch.distributed.init_process_group(...) before fit; for one process, "
                    "use one device (or the numpyro backend, which splits a minibatch over "
                    "devices in one process): docs/scale.md."
                )
            cuda = any(d.startswith("cuda") for d in devices)
            dist.init_process_group(backend="nccl" if cuda else "gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
        if world != len(devices):
            raise BackendError(
                f"device={given!r}, shard='data': {len(devices)} devices named, but the process "
                f"group has {world} processes. Name one device per process (e.g. "
                f"{['cpu'] * world!r} or 'cuda:*' with one GPU per process), or start "
                f"{len(devices)} processes (torchrun --nproc_per_node={len(devices)})."
            )
        return cls(rank, world, devices[rank])

    def slice(self, tensor, axis: int):
        """This process's block of ``tensor`` along ``axis`` (a minibatch's indices)."""
        size = tensor.shape[axis]
        if size % self.world:
            raise BackendError(
                f"a minibatch of {size} points cannot be split evenly over {self.world} "
                f"processes: shard='data' needs a batch_size divisible by {self.world}."
            )
        block = size // self.world
        return tensor.narrow(axis, self.rank * block, block)

    def mean(self, tree):
        """The mean over the processes of every tensor in ``tree``, in one all-reduce (other
        leaves, the same in every process, as they are)."""
        if self.world == 1:
            return tree
        leaves, spec = pytree.tree_flatten(tree)
        at = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
        flat = torch.cat([leaves[i].detach().reshape(-1) for i in at])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        flat = flat / self.world
        start = 0
        for i in at:
            size = leaves[i].numel()
            leaves[i] = flat[start : start + size].reshape(leaves[i].shape).to(leaves[i].dtype)
            start += size
        return pytree.tree_unflatten(leaves, spec)

    def reduced(self, value_and_grad):
        """``value_and_grad`` whose value and gradient are the mean over the processes."""

        def wrapped(*args):
            return self.mean(value_and_grad(*args))

        return wrapped


def data_devices(names: list[str], given) -> list[str]:
    """The devices of a data-parallel fit, one per process: ``"cuda:*"`` is every CUDA device
    here, ``"cpu:*"`` the CPU once per process of the group; named devices as they are."""
    if len(names) == 1 and names[0].endswith(":*"):
        kind = names[0][:-2].lower()
        if kind == "cuda" and torch.cuda.is_available():
            return [f"cuda:{i}" for i in range(torch.cuda.device_count())]
        if kind == "cpu":
            world = dist.get_world_size() if dist.is_initialized() else _env_world(given)
            return ["cpu"] * world
        raise BackendError(f"device={given!r}: torch finds no {kind!r} devices here.")
    return list(names)


def _env_world(given) -> int:
    world = os.environ.get("WORLD_SIZE")
    if world is None or not world.isdigit():
        raise BackendError(
            f"device={given!r}, shard='data': 'cpu:*' means the CPU once per process, but this "
            "process is in no process group (WORLD_SIZE not set). Start it with torchrun, or "
            "name the devices (['cpu', 'cpu'])."
        )
    return int(world)
