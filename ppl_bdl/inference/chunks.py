"""Compiled chunks of steps, queued ahead of the one being read.

The VI and SG-MCMC drivers run their steps as chunks of one compiled call each. On a backend
whose compiled calls return before they finish (JAX), reading a chunk's results blocks the host
while the device idles until the host has read them, made the next chunk's inputs (minibatch
indices, keys) and queued it. :func:`run_ahead` queues chunk k+1, its carry being chunk k's
(still running) result, before the driver reads chunk k, so the device never waits for the host.
A driver that stops early (a non-finite step, Ctrl-C) drops the chunks still queued.

Example
-------
>>> calls = []
>>> def dispatch(start, previous):
...     calls.append(start)
...     return start, (0 if previous is None else previous[1]) + 1
>>> for start, count in run_ahead(dispatch, [0, 10, 20], ahead=1):
...     print(start, count, calls)
0 1 [0, 10]
10 2 [0, 10, 20]
20 3 [0, 10, 20]
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

Chunk = TypeVar("Chunk")


def run_ahead(
    dispatch: Callable[[int, Chunk | None], Chunk], starts: Iterable[int], ahead: int
) -> Iterator[Chunk]:
    """Yield ``dispatch(start, previous chunk)`` for each start, in order, with up to ``ahead``
    later chunks already dispatched when one is yielded. ``dispatch`` is called in start order
    (it may draw the chunk's minibatches and keys from stateful streams)."""
    queue: deque = deque()
    previous = None
    for start in starts:
        previous = dispatch(start, previous)
        queue.append(previous)
        if len(queue) > ahead:
            yield queue.popleft()
    yield from queue


def chunks_ahead(backend) -> int:
    """How many chunks to queue ahead on ``backend``: one where compiled calls run
    asynchronously, none where a call returns only when its chunk is done (queueing there
    would only run a chunk that an early stop then throws away)."""
    return 1 if backend.asynchronous_calls else 0
