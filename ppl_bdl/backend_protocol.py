"""The seam between the core and a backend: every entry point the core uses, grouped by part.

The core (guides, objectives, SG-MCMC kernels, schedules, the drivers, prediction) is written once
against :class:`Backend`. A backend is one module in ``backends/`` and one entry point in the group
``ppl_bdl.backends``; the core never tests a backend's name. ``tests/test_backend_protocol.py``
checks that every registered backend provides every member below and that the core uses nothing
else.

The groups:

- :class:`Arrays`: converting data, NumPy round trips, pytrees, the precision/device scope;
  ``math`` (the functions of :data:`ppl_bdl.dsl.math.NAMES`) and ``random`` (:class:`RandomKeys`).
- :class:`Autodiff`: gradients, vectorisation, compilation, and the compiled loop that runs a
  chunk of steps (:meth:`Autodiff.compile_loop`).
- :class:`Distributions`: neutral specs to native distributions, bijections, and the native
  primitives a lowered model calls.
- :class:`Optimizers`: an :class:`Optimizer` (``init``, ``update``) from an
  :class:`~ppl_bdl.optim.OptimizerConfig`, built from the backend's own library.
- :class:`NativeSamplers`: the backend's NUTS, and our SG-MCMC kernels as its native kernels.
- :class:`Enumeration`: discrete latent sites summed out, and drawn from their conditional.
- :class:`Devices`: where arrays live (``fit(..., device=...)``).
- :class:`Modules`: a network of the backend's own module library lifted into sample sites.

Example
-------
>>> import ppl_bdl as bdl
>>> from ppl_bdl.backend_protocol import Backend
>>> isinstance(bdl.backends.get("numpyro"), Backend)
True
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np

Array = Any
Key = Any
PyTree = Any


# -- data types of the seam ---------------------------------------------------------------------
class Batch(NamedTuple):
    """What a step sees of the data: the data's arrays (on the device), the minibatch's
    indices into the subsampled plate (None for a full batch), and ``step``, the step's number
    in the run (an int scalar, the same for every chain: a method may branch on it with
    :meth:`Autodiff.cond`; None where the caller has no run counter, the native adapters)."""

    data: Any
    indices: Any
    step: Any = None


class Transition(NamedTuple):
    """A method's per-chain transition: the one shape of every iterative method (SG-MCMC
    kernels, VI, NUTS and HMC), BlackJAX's kernel shape with the data passed in.

    ``init(key, position, data) -> state``; ``step(key, state, batch, rate) -> (state, info)``,
    where ``batch`` is a :class:`Batch` and ``rate`` the step's scheduled rate (an SG-MCMC step
    size, a VI learning rate; unused by NUTS/HMC), computed by the driver ahead of the loop;
    ``emit(state)``, what a kept step keeps (the position; nothing for VI). ``info`` is a dict
    of arrays: a step whose info or new state holds a non-finite float has failed. ``key``:
    what the steps' compiled program depends on (:mod:`ppl_bdl.trace.programs`), so
    another transition with an equal key reuses it; None: the program is this transition's own.
    """

    init: Callable[[Key, Array, Any], PyTree]
    step: Callable[[Key, PyTree, Batch, Any], tuple[PyTree, dict]]
    emit: Callable[[PyTree], PyTree]
    key: Hashable | None = None


class LoopResult(NamedTuple):
    """What a compiled chunk returns, read back to the host.

    ``state``: the state after the last step that did not fail (the state before the failed
    step, if one failed; backend arrays). ``infos``: every step's info up to (not including) the
    failed step, stacked (NumPy; leading axis steps), or, from a runner called with
    ``trace=False``, the kept steps' infos only. ``rows``: ``emit(state)`` after each kept
    step before the failure, stacked (NumPy; leading axis kept rows). ``failed_at``: the index
    of the first step whose info or new state was not finite, or -1; ``failed_info``: that step's info (NumPy),
    else None. ``interrupted``: Ctrl-C (KeyboardInterrupt) stopped the chunk before step
    ``failed_at``, the rest as after a failed step (a runner that steps in Python returns what
    it had; a compiled chunk cannot stop part-way: it holds the Ctrl-C until it returns, and
    returns all its steps).
    """

    state: PyTree
    infos: dict
    rows: PyTree
    failed_at: int = -1
    failed_info: dict | None = None
    interrupted: bool = False


class Optimizer(NamedTuple):
    """Optax's contract, with the step's lr and a flag for in-place optimizers:
    ``init(params) -> state`` and ``update(grads, state, params, apply, lr) -> (params, state)``.
    ``lr`` is the step's learning rate (a scalar; the schedule is the caller's, evaluated per
    step: :class:`~ppl_bdl.inference.loop.driver.Rates`). ``apply`` (a scalar boolean array) is
    False for a step whose loss or gradient is not finite: the loop stops there and keeps the
    state from before it (see :class:`LoopResult`), so a functional optimizer (optax) may update
    regardless, while one that changes the parameters in place (``torch.optim``) must not
    change them."""

    init: Callable[[PyTree], PyTree]
    update: Callable[[PyTree, PyTree, PyTree, Any, Any], tuple[PyTree, PyTree]]


@dataclass
class NativeSettings:
    """Settings of NUTS (the backend's own) and HMC (the core's; ``num_steps``)."""

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
    #: "sequential", "vectorized" or "parallel" where the backend offers them.
    chain_method: str = "sequential"


# -- the groups -----------------------------------------------------------------------------------
@runtime_checkable
class RandomKeys(Protocol):
    """Random keys in JAX's style on every backend: ``split`` a key before each use."""

    def key(self, seed: int) -> Key: ...
    def split(self, key: Key, num: int = 2) -> tuple: ...
    def keys(self, key: Key, num: int) -> Any: ...

    def fold_in(self, key: Key, step: Any) -> Key:
        """The key of step ``step`` (an int, traced inside a compiled loop) of a chain whose key
        is ``key``: the same whatever the chunks a run is cut into. (On torch, whose key is the
        chain's one generator, advancing as it draws, the key itself.)"""
        ...

    def normal(self, key: Key, shape: tuple[int, ...]) -> Array: ...
    def uniform(self, key: Key, shape: tuple[int, ...], low: float, high: float) -> Array: ...
    def draw(self, key: Key, native: Any, reparameterized: bool = False) -> Array: ...


@runtime_checkable
class NativePrimitives(Protocol):
    """The primitives a model lowered to the backend calls (``pyro.sample``, ...)."""

    #: Whether :meth:`scan` is the backend's own loop primitive; where it is not, ``bdl.scan``
    #: lowers to a Python loop under :meth:`markov` whose step t names its sites ``{name}_{t}``.
    compiled_scan: bool

    def sample(self, name: str, fn: Any, obs: Any, enumerate: bool = False) -> Array:
        """The native sample site; ``enumerate`` marks a latent discrete site for parallel
        enumeration (``infer={"enumerate": "parallel"}``)."""
        ...

    def param(self, name: str, init: Array, constraint: str) -> Array: ...
    def deterministic(self, name: str, value: Array) -> Array: ...
    def factor(self, name: str, log_weight: Array) -> None: ...
    def plate(self, name: str, size: int, dim: int) -> AbstractContextManager: ...

    def scan(self, fn: Callable, init: Any, xs: Any, length: int) -> tuple[Any, Any]:
        """The backend's scan (``fn(carry, x) -> (carry, y)``), its sites stacked over steps;
        only called where :attr:`compiled_scan` is true."""
        ...

    def markov(self, steps: range) -> Any:
        """An iterable over ``steps`` that enters one nested ``markov`` context per step (each
        step's sites depend only on the step before): ``pyro.markov(range(T))``."""
        ...


@runtime_checkable
class Arrays(Protocol):
    name: str
    precision: str
    #: The device arrays live on ("cpu", "cuda:0", ...), as the backend names it.
    device: str
    math: Any
    random: RandomKeys

    def scope(self) -> AbstractContextManager:
        """The fit's precision and device as the defaults of the block."""
        ...

    def activate(self) -> AbstractContextManager:
        """Make this backend the one :mod:`ppl_bdl.dsl.math` runs on in the block."""
        ...

    def asarray(self, value: Any, dtype: str | None = None) -> Array: ...
    def to_numpy(self, value: Array) -> np.ndarray: ...
    def is_array(self, value: Any) -> bool: ...
    def arange(self, n: int) -> Array: ...
    def tree_map(self, fn: Callable, *trees: PyTree) -> PyTree: ...

    #: Whether indexing an array out of its bounds raises (torch); JAX clamps instead.
    checks_index_bounds: bool

    def bounds_checked(self, fn: Callable) -> Callable:
        """``fn`` (of arrays, as positional arguments) run with out-of-bounds indexing raising an
        ``IndexError`` that says "out of bounds" (used once per fit, to validate a model's data). Where it is found
        after ``fn`` ran, the error carries ``source_frames`` (``traceback.FrameSummary``,
        outermost first: where the read happened), from which the core names the site."""
        ...

    def model_value(self, value: Any, strict: bool) -> Any:
        """``value`` (an array of this backend, or anything else) as a model's code gets it: an
        array that NumPy values mix with on either side of an operator (``np.log(w) - mu``),
        as JAX arrays do. ``strict`` (the validating run): one that also refuses to become a
        Python bool, number or NumPy array while the model runs, raising
        :class:`~ppl_bdl.dsl.model_errors.ValueConversionError` (on a backend whose traced steps
        would freeze such a value rather than refuse it)."""
        ...


@runtime_checkable
class Autodiff(Protocol):
    #: Whether chains run side by side in one vectorised loop (else one after another).
    vectorized_chains: bool
    #: Whether elementwise work over several arrays fuses into a few kernels (a compiled
    #: program: XLA), so a position held as per-site blocks costs no more per step than one
    #: flat vector and saves the flat vector's slices and concatenation; else (eager torch)
    #: each op on each block is a dispatch of its own, and SG-MCMC keeps its position flat.
    fuses_elementwise: bool

    def value_and_grad(self, fn: Callable, has_aux: bool = False) -> Callable: ...
    def grad(self, fn: Callable) -> Callable: ...

    def hessian(self, fn: Callable) -> Callable:
        """The Hessian of a scalar ``fn`` of one flat vector: ``hessian(fn)(x)`` is the
        (d, d) matrix of second derivatives (``jax.hessian``, ``torch.func.hessian``)."""
        ...

    def jvp(self, fn: Callable, primals: tuple, tangents: tuple) -> tuple:
        """Forward-mode derivative: ``(fn(*primals), J·tangents)``, the Jacobian of ``fn`` times
        the tangents without forming the Jacobian (``jax.jvp``, ``torch.func.jvp``); ``fn``'s
        output may be a pytree (a dict of arrays)."""
        ...

    def vmap(self, fn: Callable, in_axes: Any = 0) -> Callable: ...
    def jit(self, fn: Callable) -> Callable: ...

    def fori_loop(self, num: int, body: Callable, init: PyTree) -> PyTree:
        """``carry = body(i, carry)`` for i = 0 .. ``num`` − 1 from ``init``: one loop in the
        compiled program on JAX (``lax.fori_loop``: its body traced once, however large
        ``num``), a plain loop elsewhere. For a loop inside a step (an EBM's Langevin chain)."""
        ...

    def scan(self, fn: Callable, init: PyTree, xs: PyTree, length: int) -> tuple[PyTree, PyTree]:
        """``lax.scan``'s contract for the core's own loops: ``fn(carry, x) -> (carry, y)`` over
        the leading axis of ``xs`` (a pytree; None leaves kept), the ``y`` stacked along a new
        leading axis. One loop in the compiled program on JAX (``lax.scan``: ``fn`` traced once,
        however large ``length``); on torch a Python loop around ``fn`` traced once (NumPy
        leaves of ``xs`` as tensors), or around ``fn`` itself where a trace could differ from it
        (NumPy leaves sliced as NumPy). Raises what ``fn`` raises (on JAX also where ``fn`` cannot be traced: Python
        control flow on a traced value, a carry that changes type), and
        :class:`~ppl_bdl.errors.LongLoop` where a trace of the function around the loop
        (:meth:`trace`) would unroll too many steps. The core runs ``bdl.scan`` with it
        (:meth:`~ppl_bdl.trace.interpreter.Evaluator.scan`)."""
        ...

    def cond(self, pred: Any, true_fn: Callable, false_fn: Callable, operand: PyTree) -> PyTree:
        """``true_fn(operand)`` if ``pred`` (a scalar boolean) else ``false_fn(operand)``, only
        the branch taken computed (``lax.cond``; a Python ``if`` on torch). Both branches return
        the same structure. Under :meth:`vmap` ``pred`` must not depend on the mapped arguments
        (a batched predicate would compute both branches)."""
        ...

    def trace(self, fn: Callable, example_args: tuple) -> Callable:
        """``fn`` compiled for repeated calls where the backend gains from it (a graph traced at
        ``example_args`` on torch); ``fn`` itself where the enclosing loop is compiled (JAX)."""
        ...

    def traced_vmap(self, fn: Callable, example_args: tuple, in_axes: Any = 0) -> Callable:
        """``vmap(fn, in_axes)`` compiled as :meth:`trace` compiles, ``fn`` drawing no random
        numbers (a point's gradient): one traced ``torch.func.vmap`` graph, else (warned) a loop."""
        ...

    def compile_loop(self, step: Callable, emit: Callable) -> Callable:
        """A runner of ``step(state, x, data, t) -> (state, info)`` over a chunk of steps (``t``:
        the step's index in the run, an int scalar).

        ``runner(state, xs, data, keep, steps, first, num_rows, trace) -> LoopResult``: ``keep``
        is a host bool array of the chunk's compiled length whose True entries are the steps
        whose ``emit(state)`` is kept (at most ``num_rows`` of them); the first ``steps`` of
        them run, numbered ``first``, ``first + 1``, ...; ``xs`` is a dict of per-step inputs
        (leading axis: the compiled length; may be empty). The runner compiles once per
        compiled length, ``num_rows``, ``trace`` and input shapes, so a shorter last chunk
        reuses the program. ``trace``: every step's info comes back, else the kept steps' only. ``data``
        is passed to every step unchanged (never baked into the compiled program). The runner
        stops at the first step whose info or new state holds a non-finite float and returns
        the state from before that step (:class:`LoopResult`): how it gets there (a gated step,
        or a re-run of the chunk from its start; between kept steps of a ``trace=False`` run it
        may check the state alone, whose infos nobody reads) is the backend's business, never
        the driver's.
        """
        ...


@runtime_checkable
class Distributions(Protocol):
    native: NativePrimitives

    def distribution(self, spec: Any) -> Any: ...
    def expand(self, native: Any, batch_shape: tuple[int, ...], event_ndims: int) -> Any: ...
    def biject_to(self, support: Any) -> Any: ...

    def transform(self, spec: Any) -> Callable[[Array], Array]:
        """The backend's bijection of a ``ppl_bdl.dsl.dist.transforms`` spec, callable on arrays
        (``bdl.TransformReparam`` pushes a base draw through it)."""
        ...

    def observed_value(self, spec: Any, value: Array) -> Array:
        """An observed value in the dtype the native family of ``spec`` needs (0/1 labels as
        floats for a Bernoulli on torch, float labels as ints for a Categorical on JAX, ...)."""
        ...


@runtime_checkable
class Optimizers(Protocol):
    def optimizer(self, config: Any) -> Optimizer: ...


@runtime_checkable
class NativeSamplers(Protocol):
    def native_transition(self, potential: Callable, settings: NativeSettings) -> Transition:
        """The backend's NUTS on ``potential(flat, data)`` as a :class:`Transition` of the
        core's driver (its ``rate`` unused; info: ``diverging``, ``n_steps``,
        ``acceptance_rate``, ``step_size``, ``lp``, optionally ``energy``; ``emit``: the
        position)."""
        ...

    def native_sgmcmc_kernel(self, spec: Any) -> Any:
        """Our SG-MCMC transition (``spec``: :class:`ppl_bdl.inference.mcmc.native_kernel.NativeSpec`) as a
        kernel of the backend's own MCMC driver."""
        ...


@runtime_checkable
class Enumeration(Protocol):
    """Discrete latent sites summed out by the backend's own machinery. ``model(inputs)`` runs a
    native model (lowered by the core: continuous sites conditioned on values computed from
    ``inputs``, discrete latent sites marked for enumeration); the first free dimension for
    enumeration is ``-1 - max_plate_nesting``."""

    def enumerated_log_density(self, model: Callable, inputs: PyTree, max_plate_nesting: int):
        """log p(inputs, data) with the enumerated sites summed out: a scalar, differentiable
        in ``inputs`` by :meth:`Autodiff.value_and_grad` and traceable by :meth:`Autodiff.jit`
        / :meth:`Autodiff.trace`."""
        ...

    def infer_discrete(
        self, model: Callable, inputs: PyTree, max_plate_nesting: int, key: Key
    ) -> dict[str, Array]:
        """One draw of every enumerated site from its distribution given everything else
        (Pyro's / NumPyro's ``infer_discrete`` at temperature 1), by native site name."""
        ...


@runtime_checkable
class Devices(Protocol):
    """Where arrays live, and how a fit's work is spread over several devices.

    A backend made for several devices (``fit(..., device=["cuda:0", "cuda:1"])``, ``"cuda:*"``)
    says how many (:attr:`device_count`) and what it splits over them (:attr:`shard_mode`):
    "chains" (the chain axis: each device runs its own block of chains) or "data" (each step's
    minibatch, the parameters replicated). The driver hands every array a compiled loop reads
    to :meth:`place`, naming its chain and batch axes, and pads the chains to a multiple of
    :attr:`device_count`; the backend decides the rest. A backend that runs one stream of
    work per process spreads chains over devices one worker process per device instead
    (:meth:`process_devices`, :mod:`ppl_bdl.run.process_executor`); what it cannot spread it
    refuses when it is made, saying what it supports.
    """

    #: How many devices the fit's work is spread over (1: one device).
    device_count: int
    #: What is split over them: "chains" or "data" (``fit(..., shard=...)``).
    shard_mode: str

    def on(self, device: Any, shard: str | None = None) -> Backend:
        """This backend with arrays on ``device`` (None: the backend's default device; a list
        of devices, or a kind with a star, ``"cuda:*"``: spread as ``shard`` says)."""
        ...

    def place(
        self, tree: PyTree, chain_axis: int | None = None, batch_axis: int | None = None
    ) -> PyTree:
        """``tree``'s arrays placed for a compiled loop on the fit's devices: split along
        ``chain_axis`` when chains are split, along ``batch_axis`` (minibatch indices) when the
        data is, replicated on every device otherwise. On one device: the arrays as they are."""
        ...

    def devices(self) -> list[str]:
        """The devices this backend can use here."""
        ...

    def process_devices(self, device: Any, shard: str | None = None) -> list[str] | None:
        """Where a fit's chains over the devices ``device`` names run one worker process per
        device: the device of each process (the names expanded and checked). None: ``device``
        is one device, or this backend spreads the work over the devices itself (one
        program over a device list, or ``shard="data"``)."""
        ...

    def set_threads(self, count: int) -> None:
        """Intra-op CPU threads of the array library (a no-op where it has no such setting)."""
        ...


@runtime_checkable
class Modules(Protocol):
    def lift_module(self, module: Any) -> Any:
        """A network of the backend's own module library (a ``torch.nn.Module``, an
        ``equinox.Module``) as its named parameters and a pure forward pass
        (:class:`ppl_bdl.dsl.nn.ModuleParts`), or None for a module of another kind
        (:func:`ppl_bdl.dsl.nn.lift`)."""
        ...


@runtime_checkable
class Backend(
    Arrays,
    Autodiff,
    Distributions,
    Optimizers,
    NativeSamplers,
    Enumeration,
    Devices,
    Modules,
    Protocol,
):
    """Everything the core needs from a backend."""
