"""The kernel contract, after BlackJAX: two pure functions built by a small factory."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

#: ``value_and_grad(position, minibatch) -> (Ũ, ∇Ũ)``: the minibatch potential of Eq. 2.8
#: of "Bayesian Computation in Deep Learning" and its gradient (of the position's shape) at a position: one flat array, or a tuple
#: of per-site blocks (:mod:`ppl_bdl.inference.mcmc.blocks`). The driver builds it from the model and passes it
#: to the kernel's factory (as BlackJAX passes its gradient estimator).
ValueAndGrad = Callable[[Any, Any], tuple[Any, Any]]


class Kernel(NamedTuple):
    """``init(position) -> state`` and ``step(rng_key, state, minibatch, step_size) -> (state,
    info)``.

    ``state`` is a dict holding at least ``"position"``: the unconstrained parameters, one flat
    array or (in ``fit``'s loop) a tuple of per-site blocks, which kernels treat alike with
    :mod:`ppl_bdl.inference.mcmc.blocks`;
    ``info`` is a dict of scalars that go to ArviZ's ``sample_stats`` (by convention
    ``potential``, the minibatch Ũ at the step's start, and ``grad_norm``); a non-finite number in
    it stops the run there. The factory that builds a kernel takes ``value_and_grad`` (see
    :data:`ValueAndGrad`) and the kernel's own settings.
    """

    init: Callable[[Any], dict]
    step: Callable[[Any, dict, Any, Any], tuple[dict, dict]]
