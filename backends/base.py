"""The Backend interface: everything the core needs from Pyro/torch or NumPyro/jax.

A backend supplies arrays and math, native distributions and bijections, random keys, automatic
differentiation, compiled loops, optimizers and native NUTS/HMC. It supplies no algorithm: guides,
objectives, SG-MCMC kernels and schedules are written once in the core against this interface.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, ClassVar

from ..runtime import use_backend

Array = Any


@dataclass
class NativeSettings:
    """Settings for the backend's native NUTS / HMC."""

    method: str
    num_warmup: int
    num_samples: int
    num_chains: int
    thinning: int
    target_accept: float
    max_tree_depth: int
    num_steps: int | None
    step_size: float | None
    dense_mass: bool
    progress: bool
    #: NumPyro only: "sequential" (each chain compiles its own step), "vectorized" (one compile,
    #: chains in lockstep) or "parallel" (one device per chain). Pyro runs chains one by one.
    chain_method: str = "sequential"


class LoopResult:
    """What a compiled loop returns: final carry, per-step outputs (stacked) and where it stopped.

    ``stopped_at`` is the index of the first step whose check failed (its update was not applied),
    or ``None`` when every step ran. It may be given as a function that waits for the loop: a
    backend that runs loops asynchronously returns at once, and the caller prepares the next
    chunk's inputs while the loop runs, reading ``stopped_at`` (and the outputs) after.
    """

    def __init__(self, carry: Any, outputs: Any, stopped_at: int | None | Callable[[], int | None]):
        self.carry, self.outputs = carry, outputs
        self._stopped_at = stopped_at

    @property
    def stopped_at(self) -> int | None:
        if callable(self._stopped_at):
            self._stopped_at = self._stopped_at()
        return self._stopped_at


class Backend:
    """Base class of the backends. See :mod:`ppl_bdl.backends.numpyro` for a full example."""

    name: ClassVar[str]
    #: The pip extra that installs this backend.
    extra: ClassVar[str]
    #: Whether compiled loops should pre-draw a chunk's standard normals in bulk
    #: (:mod:`ppl_bdl.prefetch`); with it the backend also provides ``eval_shape(fn, *args)``.
    prefetch_normals: ClassVar[bool] = False
    #: Whether a compiled call returns before its work is done (results are futures): drivers
    #: then queue the next chunk before reading one (:mod:`ppl_bdl.inference.chunks`).
    asynchronous_calls: ClassVar[bool] = False
    #: Optional: ``split_index_work(fn, state, idx)``, a minibatch step ``fn`` split into the part
    #: that depends on the indices alone (run in bulk before a loop) and the rest, or None; see
    #: :mod:`ppl_bdl.backends._jax_index_work`. None here: the step stays whole.
    split_index_work: ClassVar[Any] = None

    def __init__(self, precision: str = "float32"):
        self.precision = precision

    def activate(self) -> AbstractContextManager:
        """Make this backend the target of :mod:`ppl_bdl.math` in a ``with`` block."""
        return use_backend(self)

    def __repr__(self) -> str:
        return f"<ppl_bdl backend {self.name} ({self.precision})>"

    # Each method below is implemented by the backend module.
    def precision_scope(self) -> AbstractContextManager: ...
    def asarray(self, value: Any, dtype: str | None = None) -> Array: ...
    def to_numpy(self, value: Array) -> Any: ...
    def arange(self, n: int) -> Array: ...
    def distribution(self, spec) -> Any: ...
    def expand(self, native, batch_shape: tuple[int, ...], event_ndims: int) -> Any: ...
    def biject_to(self, support) -> Any: ...
    def observed_value(self, spec, value: Array) -> Array: ...
    def is_array(self, value: Any) -> bool: ...
    def value_and_grad(self, fn, has_aux: bool = False): ...
    def grad(self, fn): ...
    def vmap(self, fn): ...
    def tree_map(self, fn, *trees): ...
    def compile_loop(
        self, step, check=None, prologue=None, freeze=True, emit_every=1, stage_inputs=False,
        partial=False,
    ): ...  # fmt: skip
    def run_native_mcmc(self, potential, init, settings: NativeSettings, seed: int): ...
