"""What the driver reads back from a finished chunk: the kept draws and infos per chain, and
after a failure, which chains failed and the draw to drop.

Example
-------
>>> import numpy as np
>>> from ppl_bdl.inference.chunk_readback import failed_chains
>>> failed_chains({"potential": np.array([[0.5, 1.0], [np.nan, 2.0]])}, 1, vectorised=True)
[0]
"""

from __future__ import annotations

import numpy as np


def read_chunk(be, chunk, plan, failed_at, kept, vectorised, draws, infos, traced):
    """Append the chunk's kept draws and their infos (and every step's infos to ``traced``),
    per chain."""
    end = chunk.steps if failed_at < 0 else failed_at
    keep = plan.keep[chunk.start : chunk.start + end]
    if chunk.result.infos is None or (kept == 0 and traced is None):
        return
    step_infos = {k: np.asarray(be.to_numpy(v))[:end] for k, v in chunk.result.infos.items()}

    def per_chain(values: dict, i: int) -> dict:
        return {k: (v[:, i] if vectorised else v) for k, v in values.items()}

    if traced is not None:
        for i in range(len(traced)):
            traced[i].append(per_chain(step_infos, i))
    if kept == 0 or chunk.result.rows is None:
        return
    rows = np.asarray(be.to_numpy(chunk.result.rows))[:kept]
    kept_infos = {k: v[keep] for k, v in step_infos.items()}
    for i in range(len(draws)):
        draws[i].append(rows[:, i] if vectorised else rows)
        infos[i].append(per_chain(kept_infos, i))


def drop_last_draw(draws: list, infos: list) -> None:
    """Drop each chain's last kept draw (and its infos), skipping chunks that kept none."""
    for chain_draws, chain_infos in zip(draws, infos, strict=True):
        while chain_draws and len(chain_draws[-1]) == 0:
            chain_draws.pop()
            chain_infos.pop()
        if chain_draws:
            chain_draws[-1] = chain_draws[-1][:-1]
            chain_infos[-1] = {k: v[:-1] for k, v in chain_infos[-1].items()}


def failed_chains(step_infos: dict, failed_at: int, vectorised: bool) -> list[int]:
    """The chains whose info is not finite at the failed step."""
    bad = None
    for value in step_infos.values():
        if not np.issubdtype(value.dtype, np.floating):
            continue
        row = value[failed_at]
        row = row.reshape(row.shape[0], -1) if vectorised else row.reshape(1, -1)
        finite = np.isfinite(row).all(axis=1)
        bad = ~finite if bad is None else bad | ~finite
    return [] if bad is None else [int(i) for i in np.flatnonzero(bad)]
