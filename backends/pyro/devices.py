"""Which torch device a Pyro-backend fit runs on: names resolved to ``torch.device``, the
one device a process runs, and the devices chains spread over (one worker process each:
:mod:`ppl_bdl.run.process_executor`; each step's data over several devices: :mod:`._torch_dist`).

Example
-------
>>> from ppl_bdl.backends.pyro.devices import resolve, device_name
>>> device_name(resolve("cpu"))
'cpu'
"""

from __future__ import annotations

import torch

from ppl_bdl.backends.base import device_names, parse_device
from ppl_bdl.errors import BackendError


def available_devices() -> list[str]:
    found = ["cpu"]
    if torch.cuda.is_available():
        found += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    return found


def cuda_devices(device) -> list[int]:
    return [device.index or 0] if device.type == "cuda" else []


def device_name(device) -> str:
    return device.type if device.index is None else f"{device.type}:{device.index}"


def chain_devices(device) -> list[str]:
    """The devices a fit's chains spread over, one worker process each: named devices as they
    are (resolved: ``"cuda"`` is ``"cuda:0"``; the CPU may be listed more than once, a process
    each), ``"cuda:*"`` every CUDA device here, ``"cpu:*"`` the CPU once (torch has one CPU
    device, whose cores a process runs as threads)."""
    found = []
    for name in device_names(device, "pyro"):
        if name.endswith(":*"):
            kind = name[:-2].lower()
            if kind == "cpu":
                found.append("cpu")
            elif kind in ("cuda", "gpu") and torch.cuda.is_available():
                found += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
            else:
                raise BackendError(
                    f"device={device!r}: torch finds no {kind!r} devices here (devices: "
                    f"{available_devices()})."
                )
        else:
            found.append(device_name(resolve(name)))
    kinds = sorted({d.split(":")[0] for d in found})
    if len(kinds) > 1:
        raise BackendError(
            f"device={device!r} mixes device kinds ({kinds}); a fit's chains spread over "
            "devices of one kind (e.g. ['cuda:0', 'cuda:1'], or the CPU listed twice)."
        )
    return found


def one_device(device, shard: str):
    """The one device this process runs a fit on: in one process torch runs one stream of
    work. Several devices are refused here, saying what spreads work over them: chains (MCMC,
    ensembles) one worker process per device (``fit`` does it: :meth:`process_devices`), each
    step's data one ``torch.distributed`` process per device (``shard="data"``)."""
    if device is None:
        return None
    names = chain_devices(device)
    if len(names) == 1:
        return names[0]
    raise BackendError(
        f"device={device!r}, shard={shard!r}: the pyro backend runs this fit on one device (one "
        "torch process, one stream of work). MCMC chains and ensemble members spread over a "
        "device list by themselves (one worker process per device); VI's num_chains fits and "
        "method='cavi' do not: name one device ('cpu', 'cuda:1'), or run fits in separate "
        "processes. To split each step's minibatch over several devices, pass shard='data' "
        "with the device list and start one process per device (torchrun): docs/scale.md."
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
