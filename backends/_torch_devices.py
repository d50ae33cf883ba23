"""Which torch device a Pyro-backend fit runs on: names resolved to ``torch.device``, and the
one device a process runs (several devices are one process each: :mod:`._torch_dist`).

Example
-------
>>> from ppl_bdl.backends._torch_devices import resolve, device_name
>>> device_name(resolve("cpu"))
'cpu'
"""

from __future__ import annotations

import torch

from ..errors import BackendError
from .base import device_names, parse_device


def available_devices() -> list[str]:
    found = ["cpu"]
    if torch.cuda.is_available():
        found += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    return found


def cuda_devices(device) -> list[int]:
    return [device.index or 0] if device.type == "cuda" else []


def device_name(device) -> str:
    return device.type if device.index is None else f"{device.type}:{device.index}"


def one_device(device, shard: str):
    """The one device this process runs a fit on: in one process torch runs one stream of
    work, so several devices split chains (or a list of one device split data) is refused,
    saying what runs work on several devices. (A data-parallel fit's process passes its own
    device, ``shard="data"``.)"""
    if device is None:
        return None
    names = device_names(device, "pyro")
    if len(names) == 1 and not names[0].endswith(":*"):
        return names[0]
    raise BackendError(
        f"device={device!r}, shard={shard!r}: the pyro backend runs a fit's chains on one "
        "device (one torch process, one stream of work). Name one device ('cpu', 'cuda:1'). "
        "For chains on several devices, run groups of chains in separate processes (fit(..., "
        "chain_ids=[...], device='cuda:1') per process, or the Ray executor); the numpyro "
        "backend splits chains over a device list in one program. To split each step's "
        "minibatch over several devices on torch, pass shard='data' with the device list and "
        "start one process per device (torchrun): docs/scale.md."
    )


def resolve(device: str | None) -> torch.device:
    """The torch device named ``device`` (None: torch's default device)."""
    if device is None:
        return torch.get_default_device()
    available = available_devices()
    kind, index = parse_device(device, "pyro", available)
    if kind == "gpu":
        kind = "cuda"
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise BackendError(
                f"device={device!r}: torch finds no CUDA device here (devices: {available}). "
                "Install a CUDA build of torch, or use device='cpu'."
            )
        if index is not None and index >= torch.cuda.device_count():
            raise BackendError(
                f"device={device!r}: there are {torch.cuda.device_count()} CUDA device(s) here "
                f"({available[1:]})."
            )
        return torch.device("cuda", index or 0)
    if kind != "cpu":
        raise BackendError(
            f"unknown device kind {kind!r} in device={device!r}; expected 'cpu' or 'cuda', "
            f"optionally with an index ('cuda:1'). Devices here: {available}."
        )
    return torch.device("cpu")
