"""``scan``: a loop over time that every runtime can run, with one stacked site per name.

``bdl.scan(f, init, xs)`` is ``lax.scan``'s contract: ``f(carry, x) -> (carry, y)`` runs once per
leading entry of ``xs`` (or ``length`` times), and the ``y`` are stacked. A site that ``f``
samples is one site of the model whose value has a leading time axis: ``sample("y", ...)`` at
each of T steps is the site ``y`` of shape ``(T, ...)`` in the posterior, in ArviZ (its first
dim is named after the scan, ``name="time"`` by default) and in prediction.

What a loop becomes is up to the runtime at the bottom of the stack:

- the core's :class:`~ppl_bdl.trace.interpreter.Evaluator` (the log density NUTS, VI and SG-MCMC
  differentiate, the pointwise log-likelihood, prediction) runs one compiled loop whose step is
  traced once (``lax.scan`` on NumPyro: T = 10,000 compiles as fast as T = 10); each site reads
  its value at step t from the stacked values, and the steps' log densities are summed after
  the loop (:mod:`ppl_bdl.trace.compiled_scan`). On Pyro the step is traced once to a graph
  whose inputs include the tensors it closes over (the latents), called at every step
  (:mod:`ppl_bdl.backends.pyro.scan`; a step it cannot follow runs as Python at every step,
  with the same values and no warning). Where a step cannot be
  compiled it runs as a Python loop, with a warning, which a compiled log density unrolls (slow
  to compile for long series): a step that samples different sites at different steps, Python
  control flow on a value or on the step index (``if t == 0:``; write ``bdl.math.where``), data
  held in a NumPy array indexed by the step, a carry that changes shape or dtype. Discrete
  latent sites in the loop are summed out by the lowered model below, not by this loop;
- a model lowered to NumPyro calls ``numpyro.contrib.control_flow.scan``; lowered to Pyro it is a
  Python loop under ``pyro.markov`` whose step t names its sites ``{name}_{t}`` (Pyro's
  convention), so discrete sites in the loop are enumerated with a dependency on the step before
  only (an HMM: the forward algorithm's cost, not K^T).

Example
-------
>>> import numpy as np, ppl_bdl as bdl
>>> from ppl_bdl import dist
>>> @bdl.model
... def random_walk(y):
...     sigma = bdl.sample("sigma", dist.HalfNormal(1.0))
...     def step(prev, y_t):
...         bdl.sample("y", dist.Normal(prev, sigma), obs=y_t)
...         return y_t, None
...     bdl.scan(step, 0.0, y)
>>> from ppl_bdl.trace.layout import trace_model
>>> sites = trace_model(random_walk(np.array([0.1, 0.3, 0.2])), bdl.backends.get("numpyro"))
>>> sites["y"].value.shape, sites["y"].log_prob.shape   # one stacked site
((3,), (3,))
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

import numpy as np

from ppl_bdl.dsl.effects import current_runtime
from ppl_bdl.errors import ModelError


def scan(
    f: Callable[[Any, Any], tuple[Any, Any]],
    init: Any,
    xs: Any = None,
    length: int | None = None,
    name: str = "time",
):
    """Run ``f(carry, x) -> (carry, y)`` over the leading axis of ``xs``; return ``(carry, ys)``.

    Parameters
    ----------
    f : callable
        One step: takes the carry and this step's slice of ``xs``, returns the new carry and
        an output (or None). It may call ``sample``, ``deterministic``, ``factor`` and ``plate``;
        each site it samples is one site of the model stacked over the steps.
    init : array or pytree
        The carry before the first step.
    xs : array or pytree of arrays, optional
        Sliced along their leading axis, one slice per step.
    length : int, optional
        The number of steps when ``xs`` is None (else it must match ``xs``).
    name : str
        The name of the time axis (the first dim of the stacked sites in ArviZ).

    Returns
    -------
    carry, ys
        The last carry and the outputs stacked along a new leading axis (None when ``f``
        returns None).

    Example
    -------
    >>> import numpy as np, ppl_bdl as bdl
    >>> from ppl_bdl import dist
    >>> @bdl.model
    ... def ar1(y):
    ...     rho = bdl.sample("rho", dist.Uniform(-1.0, 1.0))
    ...     sigma = bdl.sample("sigma", dist.HalfNormal(1.0))
    ...     def step(prev, t):
    ...         bdl.sample("y", dist.Normal(rho * prev, sigma), obs=y[t])
    ...         return y[t], None
    ...     bdl.scan(step, y[0], np.arange(1, len(y)))
    >>> native = ar1(np.array([0.0, 0.5, 0.2])).lower("numpyro")
    """
    runtime = current_runtime()
    if runtime is None:
        raise ModelError("bdl.scan was called outside a model run.")
    if not callable(f):
        raise ModelError(f"bdl.scan: f must be a function (carry, x) -> (carry, y), got {f!r}.")
    if not isinstance(name, str) or not name:
        raise ModelError(f"bdl.scan: name must be a non-empty string, got {name!r}.")
    # NumPy arrays in xs stay NumPy in loops the core runs: a step's slice is then a constant,
    # which may index data even where the loop is traced (torch).
    steps = _length(xs, length)
    return runtime.scan(f, init, xs, steps, name)


def tree_to_backend(xs: Any, backend) -> Any:
    """``xs`` with its NumPy arrays as ``be`` arrays."""
    if isinstance(xs, dict):
        return {k: tree_to_backend(v, backend) for k, v in xs.items()}
    if isinstance(xs, tuple | list):
        return type(xs)(tree_to_backend(v, backend) for v in xs)
    if xs is None or backend.is_array(xs):
        return xs
    return backend.asarray(np.asarray(xs))


def _leaves(tree: Any) -> list:
    if isinstance(tree, dict):
        return [leaf for v in tree.values() for leaf in _leaves(v)]
    if isinstance(tree, tuple | list):
        return [leaf for v in tree for leaf in _leaves(v)]
    return [] if tree is None else [tree]


def _length(xs: Any, length: int | None) -> int:
    leaves = _leaves(xs)
    if any(not hasattr(leaf, "shape") for leaf in leaves):
        raise ModelError(
            "bdl.scan: xs must hold arrays (NumPy or the backend's), with a time axis."
        )
    sizes = {int(leaf.shape[0]) for leaf in leaves if len(leaf.shape) > 0}
    if any(len(leaf.shape) == 0 for leaf in leaves):
        raise ModelError("bdl.scan: every array in xs needs a leading (time) axis; got a scalar.")
    if len(sizes) > 1:
        raise ModelError(f"bdl.scan: the arrays in xs have different lengths {sorted(sizes)}.")
    if length is not None:
        if isinstance(length, bool) or not isinstance(length, int | np.integer) or length < 1:
            raise ModelError(f"bdl.scan: length must be a positive int, got {length!r}.")
        if sizes and sizes != {int(length)}:
            raise ModelError(f"bdl.scan: length={length} but xs has {sizes.pop()} steps.")
        return int(length)
    if not sizes:
        raise ModelError("bdl.scan: give xs (arrays with a leading time axis) or length=.")
    return sizes.pop()


def index_tree(tree: Any, t: int) -> Any:
    """Step ``t``'s slice of every array in ``tree``."""
    if isinstance(tree, dict):
        return {k: index_tree(v, t) for k, v in tree.items()}
    if isinstance(tree, tuple | list):
        return type(tree)(index_tree(v, t) for v in tree)
    return None if tree is None else tree[t]


def stack_outputs(backend, ys: list) -> Any:
    """Per-step outputs stacked along a new leading axis (None when every output is None)."""
    if all(y is None for y in ys):
        return None
    return backend.tree_map(lambda *parts: backend.math.stack(list(parts)), *ys)


def python_loop(backend, f, init, xs, length: int, step: Callable[[int], Any]):
    """``lax.scan`` as a Python loop; ``step(t)`` is a context manager entered around step t."""
    carry, ys = init, []
    for t in range(length):
        with step(t):
            out = f(carry, index_tree(xs, t))
        if not (isinstance(out, tuple) and len(out) == 2):
            raise ModelError(
                "bdl.scan: the step function must return a pair (carry, y) (y may be None), got "
                f"{type(out).__name__}."
            )
        carry, y = out
        ys.append(y)
    return carry, stack_outputs(backend, ys)


@contextmanager
def no_nesting(active: bool):
    if active:
        raise ModelError(
            "bdl.scan inside another bdl.scan is not supported: write the inner loop as "
            "vectorised code (or a plate), or flatten the two loops into one."
        )
    yield


class StackedNative:
    """The per-step native distributions of a stacked site, seen as one: the support of the
    first step, and moments stacked along the time axis (for prediction's summaries)."""

    def __init__(self, backend, natives: list):
        self._be, self._natives = backend, natives
        first = natives[0]
        self.support = first.support
        self.event_shape = tuple(first.event_shape)
        self.batch_shape = (len(natives),) + tuple(first.batch_shape)
        self.has_enumerate_support = getattr(first, "has_enumerate_support", False)

    def _stack(self, attribute: str):
        backend = self._be
        parts = [getattr(n, attribute) for n in self._natives]
        shape = np.broadcast_shapes(*(tuple(p.shape) for p in parts))
        return backend.math.stack([p + backend.math.zeros(shape) for p in parts])

    @property
    def mean(self):
        return self._stack("mean")

    @property
    def variance(self):
        return self._stack("variance")

    @property
    def probs(self):
        return self._stack("probs")
