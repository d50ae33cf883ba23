"""The kernel contract, after BlackJAX: two pure functions built by a small factory."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple


class Kernel(NamedTuple):
    """``init(position) -> state`` and ``step(rng_key, state, grad_fn, step_size) -> (state, info)``.

    ``state`` is a dict holding at least ``"position"`` (the flat unconstrained parameter vector);
    ``info`` is a dict of scalars that go to ArviZ's ``sample_stats``. ``grad_fn(position)`` returns
    the minibatch gradient of the potential Ũ(θ) (the chapter's Eq. 2.8).
    """

    init: Callable[[Any], dict]
    step: Callable[[Any, dict, Callable, Any], tuple[dict, dict]]
