"""``bdl.scan`` on torch: the step traced once to a graph of aten ops, called at every step.

torch has no compiled loop. Run eagerly, each step walks the model's Python again (its sites,
their distributions, the evaluator's tables). Here the first step is traced (``make_fx``) and the
loop calls that graph at every step: autograd (or ``torch.func``) records the graph's ops as it
would the eager step's, so the gradient is the eager loop's.

A step closes over tensors made outside it: the model's latents, its data. A plain trace would
take them as constants and lose their gradients. So the first step runs eagerly under a mode that
sees every torch call (:class:`_Recorder`): a tensor the step uses that is neither one of its
arguments nor made inside it is a tensor it closes over. The trace takes those as inputs
(:class:`_Lift` puts the trace's inputs in their place in every torch call) and the loop calls
the graph with the live tensors, so gradients reach them. The same eager run names what the
graph depends on besides its inputs: the torch calls in order, the values that are not tensors
they are given (numbers, NumPy constants), the shapes, dtypes and classes of the tensors. Graphs
are kept per backend under that name (:class:`StepPrograms`), so a fit's potential traces its
step once, not at every evaluation. The trace runs in the forward of an ``autograd.Function``
(:class:`_Outside`), which ``torch.func``'s transforms call with plain tensors: ``make_fx``
cannot trace inside them.

The step runs as the Python loop instead (no warning: the values are the same) where a graph
could differ from it: the step turns a tensor into a Python value (``if`` on a value or on the
step index, ``float()``, ``.item()``, NumPy data indexed by the step), indexes a tensor by the
step on an axis other than its first (``y[:, t]``; ``y[t]`` and ``y[t, ...]`` trace), draws
random numbers (prediction), takes arguments other than arrays, or changes its carry's
structure, shape or dtype; or the trace fails, or its outputs at the first step differ from the
step's own, or a transform refuses the ``Function`` (``torch.func.jvp``). Inside a trace of the
whole potential (:meth:`~ppl_bdl.backends.pyro.backend.PyroBackend.trace`) a loop of up to
:data:`UNROLL_LIMIT` steps runs as the Python loop, unrolled into that trace as before; a
longer one raises :class:`~ppl_bdl.errors.LongLoop`, and the potential runs untraced around its
traced step (a trace of the whole potential grows faster than the steps: 25 s to build at
T = 100, 130 s at T = 300).

Example
-------
>>> import torch, ppl_bdl as bdl
>>> from ppl_bdl.backends.pyro.scan import traced_scan
>>> backend = bdl.backends.get("pyro")
>>> rate, calls = torch.tensor(0.5, requires_grad=True), []
>>> def step(carry, x):
...     calls.append(x)
...     new = rate * carry + x
...     return new, new
>>> carry, ys = traced_scan(backend, step, torch.tensor(1.0), torch.ones(100), 100)
>>> (grad,) = torch.autograd.grad(carry, rate)
>>> round(float(carry.detach()), 4), round(float(grad), 4), len(calls) <= 4  # not 100 calls
(2.0, 4.0, True)
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree

from ppl_bdl.backends.pyro import values as _values
from ppl_bdl.backends.pyro.torchscript import TRACING_POTENTIAL, compile_graph, outputs_agree
from ppl_bdl.backends.pyro.trees import index_tree, stack_tree
from ppl_bdl.errors import LongLoop

Tensor = torch.Tensor

#: The longest loop a trace of the whole potential unrolls (see the module's docstring).
UNROLL_LIMIT = 200

#: Torch calls that turn a tensor into a Python value: a graph would freeze what they decide.
_CONVERSIONS = frozenset(
    {
        Tensor.__bool__,
        Tensor.__float__,
        Tensor.__int__,
        Tensor.__index__,
        Tensor.__complex__,
        Tensor.item,
        Tensor.tolist,
        Tensor.numpy,
        Tensor.__array__,
    }
)
#: Values other than tensors that a torch call may take, named by their ``repr``.
_ATOMS = (
    bool,
    int,
    float,
    complex,
    str,
    type(None),
    type(Ellipsis),
    torch.dtype,
    torch.device,
    torch.layout,
    torch.memory_format,
)


class Untraceable(Exception):
    """Why a step runs as the Python loop."""


class StepPrograms:
    """The traced steps of one backend, by the key :class:`_Recorder` names, least recently used
    first out. ``traces`` counts the steps traced, ``failures`` those that could not be (kept as
    None: their loops run in Python without tracing again).

    Example
    -------
    >>> programs = StepPrograms(maxsize=1)
    >>> programs.put("a", None)
    >>> programs.get("a") is None, programs.traces, programs.failures
    (True, 1, 1)
    """

    def __init__(self, maxsize: int = 32):
        self.maxsize, self.traces, self.failures = maxsize, 0, 0
        self._programs: OrderedDict = OrderedDict()

    def get(self, key):
        """The graph kept under ``key`` (None: the step cannot be traced); KeyError if none."""
        self._programs.move_to_end(key)
        return self._programs[key]

    def __reduce__(self):
        return StepPrograms, (self.maxsize,)  # a copy (in another process) starts empty

    def put(self, key, graph) -> None:
        self.traces += 1
        self.failures += graph is None
        self._programs[key] = graph
        if len(self._programs) > self.maxsize:
            self._programs.popitem(last=False)


def traced_scan(backend, fn, init, xs, length: int):
    """``lax.scan(fn, init, xs, length)`` with ``fn`` traced once (see the module's docstring);
    the Python loop where it cannot be. NumPy leaves of ``init`` and ``xs`` become tensors.

    Example
    -------
    >>> import torch, ppl_bdl as bdl
    >>> backend = bdl.backends.get("pyro")
    >>> def loss(scale):  # the step closes over scale
    ...     step = lambda carry, x: (carry + scale * x, None)
    ...     return traced_scan(backend, step, torch.tensor(0.0), torch.arange(10.0), 10)[0]
    >>> float(torch.func.grad(loss)(torch.tensor(2.0)))  # the sum of 0..9
    45.0
    """
    if TRACING_POTENTIAL.get():
        if length > UNROLL_LIMIT:
            raise LongLoop(f"a bdl.scan of {length} steps (more than {UNROLL_LIMIT})")
        return eager_scan(fn, init, xs, length)
    if length < 2:
        return eager_scan(fn, init, xs, length)
    try:
        layout = _Layout.of(backend, init, xs)
        return _traced_loop(backend, fn, layout, length)
    except Untraceable:
        return eager_scan(fn, init, xs, length)


def eager_scan(fn, init, xs, length: int):
    """The Python loop: ``fn`` run once per step (NumPy leaves of ``xs`` sliced as NumPy).

    Example
    -------
    >>> import numpy as np
    >>> carry, ys = eager_scan(lambda c, x: (c + x, c), 0, np.arange(4), 4)
    >>> int(carry), ys.tolist()
    (6, [0, 0, 1, 3])
    """
    carry, ys = init, []
    for t in range(length):
        carry, y = fn(carry, index_tree(xs, t))
        ys.append(y)
    return carry, stack_tree(ys)


@dataclass
class _Layout:
    """A step's arguments as one list of leaves (tensors, or None): the carry's, then the
    step's slice of ``xs``, each ``xs`` leaf unbound along its time axis."""

    carry: list
    carry_spec: pytree.TreeSpec
    columns: list
    xs_spec: pytree.TreeSpec

    @classmethod
    def of(cls, backend, init, xs) -> _Layout:
        carry, carry_spec = pytree.tree_flatten(init)
        if any(leaf is None for leaf in carry):
            raise Untraceable("the carry holds None")
        columns, xs_spec = pytree.tree_flatten(xs)
        carry = [_tensor(backend, leaf) for leaf in carry]
        columns = [None if c is None else _values.plain(_tensor(backend, c)) for c in columns]
        columns = [None if c is None else c.unbind(0) for c in columns]
        return cls(carry, carry_spec, columns, xs_spec)

    def leaves(self, carry, t: int) -> list:
        return list(carry) + [None if c is None else c[t] for c in self.columns]

    def args(self, leaves: list) -> tuple:
        """``(carry, x)`` from the leaves."""
        n = len(self.carry)
        carry = pytree.tree_unflatten(list(leaves[:n]), self.carry_spec)
        return carry, pytree.tree_unflatten(list(leaves[n:]), self.xs_spec)


def _tensor(backend, leaf):
    if isinstance(leaf, Tensor):
        return leaf
    if isinstance(leaf, np.ndarray | np.generic | int | float | bool):
        return backend.asarray(leaf)
    raise Untraceable(f"the step takes a {type(leaf).__name__}")


def _traced_loop(backend, fn, layout: _Layout, length: int):
    """The first step eagerly (recorded), the other steps through its graph."""
    first = _Recorded.run(fn, layout)
    programs = backend.step_programs
    try:
        graph = programs.get(first.key)
    except KeyError:
        graph = _trace(fn, layout, first)
        programs.put(first.key, graph)
        # The step's last run is eager (the evaluator keeps what its last run recorded).
        again = _Recorded.run(fn, layout)
        if again.key != first.key:
            raise Untraceable("the step's torch calls change from one run to the next") from None
        first = again
    if graph is None:
        raise Untraceable("the trace failed or disagrees with the step")
    captured = [_values.plain(c) for c in first.captured]
    n_carry = len(layout.carry)
    outs = [first.tensors]
    carry = [_values.plain(leaf) for leaf in first.tensors[:n_carry]]
    for t in range(1, length):
        inputs = [x for x in layout.leaves(carry, t) if x is not None]
        leaves = graph(*inputs, *captured)
        outs.append(leaves)
        carry = leaves[:n_carry]
    return first.assemble(carry, outs)


@dataclass
class _Recorded:
    """One eager run of the step at the first step's arguments, recorded."""

    key: tuple
    inputs: list  # the step's argument leaves (model values; None kept)
    captured: list  # the tensors it closes over, in the order it first used them
    out: tuple
    tensors: list  # the tensor leaves of its output, the carry's first

    @classmethod
    def run(cls, fn, layout: _Layout) -> _Recorded:
        inputs = [
            None if x is None else _values.model_value(x, strict=False)
            for x in layout.leaves(layout.carry, 0)
        ]
        recorder = _Recorder(inputs)
        try:
            with recorder:
                out = fn(*layout.args(inputs))
        except Exception as err:  # noqa: BLE001 - the Python loop runs it (and raises its error)
            raise Untraceable(f"the step fails on tensors ({type(err).__name__})") from err
        if recorder.refusal is not None:
            raise Untraceable(recorder.refusal)
        leaves, out_spec = pytree.tree_flatten(out)
        _check_carry(layout, out)
        if any(not (leaf is None or isinstance(leaf, Tensor)) for leaf in leaves):
            raise Untraceable("the step returns values other than tensors")
        key = (
            tuple(recorder.calls),
            layout.carry_spec,
            layout.xs_spec,
            out_spec,
            torch.get_default_dtype(),
            str(torch.get_default_device()),
        )
        tensors = [leaf for leaf in leaves if leaf is not None]
        return cls(key, inputs, recorder.captured, out, tensors)

    def assemble(self, carry: list, outs: list):
        """``(last carry, stacked outputs)`` from each step's output tensors."""
        n_carry = len(carry)
        last = pytree.tree_unflatten(
            [_model(c) for c in carry], pytree.tree_flatten(self.out[0])[1]
        )
        ys, ys_spec = pytree.tree_flatten(self.out[1])
        stacked = iter(
            _model(torch.stack([out[i] for out in outs])) for i in range(n_carry, len(self.tensors))
        )
        ys = [None if leaf is None else next(stacked) for leaf in ys]
        return last, pytree.tree_unflatten(ys, ys_spec)


def _check_carry(layout: _Layout, out) -> None:
    """The step returns a pair whose carry has the structure, shapes and dtypes it was given."""
    if not (isinstance(out, tuple) and len(out) == 2):
        raise Untraceable("the step does not return a pair")
    leaves, spec = pytree.tree_flatten(out[0])
    if spec != layout.carry_spec or any(
        not isinstance(new, Tensor) or new.shape != old.shape or new.dtype != old.dtype
        for new, old in zip(leaves, layout.carry, strict=True)
    ):
        raise Untraceable("the carry changes structure, shape or dtype")


def _model(tensor):
    return _values.model_value(tensor, strict=False)


class _Recorder(TorchFunctionMode):
    """Sees each torch call of an eager step: the tensors the step closes over (those it uses
    that are neither its arguments nor made by an earlier call), and the calls in order, with
    their arguments named (``calls``: the key of the step's graph). ``refusal`` says why the
    step cannot be traced, if it cannot."""

    def __init__(self, inputs: list):
        super().__init__()
        tensors = [x for x in inputs if x is not None]
        self._names = {id(t): ("in", i) for i, t in enumerate(tensors)}
        self._alive = list(tensors)  # ids stay unique while the step runs
        self.captured: list = []
        self.calls: list = [tuple(None if x is None else _meta(x) for x in inputs)]
        self.refusal: str | None = None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _CONVERSIONS and self.refusal is None:
            self.refusal = f"it turns a tensor into a Python value ({func.__name__})"
        try:
            self.calls.append((func, self._name(args), self._name(kwargs)))
        except Untraceable as err:
            self.refusal = self.refusal or str(err)
        out = func(*args, **kwargs)
        for leaf in pytree.tree_leaves(out):
            if isinstance(leaf, Tensor) and id(leaf) not in self._names:
                self._names[id(leaf)] = ("made", len(self._alive))
                self._alive.append(leaf)
        return out

    def _name(self, value):
        if isinstance(value, Tensor):
            name = self._names.get(id(value))
            if name is None:
                name = ("closed", len(self.captured))
                self._names[id(value)] = name
                self._alive.append(value)
                self.captured.append(value)
                self.calls.append(("closed", _meta(value)))
            return name
        if isinstance(value, tuple | list):
            return (type(value).__name__, *(self._name(v) for v in value))
        if isinstance(value, dict):
            return ("dict", *((k, self._name(v)) for k, v in value.items()))
        if isinstance(value, slice):
            return (
                "slice",
                self._name(value.start),
                self._name(value.stop),
                self._name(value.step),
            )
        if isinstance(value, np.ndarray | np.generic):
            array = np.ascontiguousarray(value)
            digest = hashlib.sha1(array.tobytes()).hexdigest()
            return ("ndarray", array.dtype.str, array.shape, digest)
        if isinstance(value, _ATOMS):
            return (type(value).__name__, repr(value))
        raise Untraceable(f"a torch call in it takes a {type(value).__name__}")


def _meta(tensor) -> tuple:
    return (tuple(tensor.shape), tensor.dtype, str(tensor.device), type(tensor))


class _Lift(TorchFunctionMode):
    """Every torch call sees ``traced[i]`` in place of ``live[i]`` (the tensors a step closes
    over, as the trace's inputs); ``x[t]`` with a 0-d integer tensor ``t`` is an
    ``index_select`` (torch would make ``t`` a Python int, which a trace cannot follow)."""

    def __init__(self, live: list, traced):
        super().__init__()
        self._live = live
        self._swap = {id(a): b for a, b in zip(live, traced, strict=True)}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        args, kwargs = self._swapped(args), self._swapped(kwargs or {})
        if func is Tensor.__getitem__ and len(args) == 2 and not kwargs:
            taken = _take(*args)
            if taken is not None:
                return taken
        return func(*args, **kwargs)

    def _swapped(self, value):
        if isinstance(value, Tensor):
            return self._swap.get(id(value), value)
        if isinstance(value, tuple | list):
            return type(value)(self._swapped(v) for v in value)
        if isinstance(value, dict):
            return {k: self._swapped(v) for k, v in value.items()}
        return value


def _is_index(value) -> bool:
    return (
        isinstance(value, Tensor)
        and value.dim() == 0
        and not value.is_floating_point()
        and value.dtype != torch.bool
    )


def _take(tensor, index):
    """``tensor[index]`` where ``index`` is a 0-d integer tensor (or a tuple that starts with
    one) as ``index_select``; None for any other index."""
    rest = ()
    if isinstance(index, tuple) and index and _is_index(index[0]):
        index, rest = index[0], index[1:]
    if not _is_index(index):
        return None
    position = torch.where(index < 0, index + tensor.shape[0], index)
    out = torch.index_select(tensor, 0, position.reshape(1)).squeeze(0)
    return out[rest] if rest else out


class _Outside(torch.autograd.Function):
    """Runs ``work(*tensors)`` on plain tensors: torch.func's transforms call a Function's
    forward below themselves (``grad``: with its inputs unwrapped; ``vmap``: by :meth:`vmap`,
    on the first row of the batch)."""

    @staticmethod
    def forward(work, *tensors):
        work(*tensors)
        return torch.zeros(())

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.count = len(inputs)

    @staticmethod
    def backward(ctx, grad):
        return (None,) * ctx.count

    @staticmethod
    def vmap(info, in_dims, work, *tensors):
        rows = [
            t if d is None else t.select(d, 0) for t, d in zip(tensors, in_dims[1:], strict=True)
        ]
        _Outside.apply(work, *rows)
        return torch.zeros(()), None


class _TraceWork:
    """The trace of one step, run by :class:`_Outside` on plain copies of the live tensors."""

    def __init__(self, fn, layout: _Layout, first: _Recorded):
        self.fn, self.layout, self.first = fn, layout, first
        self.live = [x for x in first.inputs if x is not None] + list(first.captured)
        self.graph = None

    def __call__(self, *plain):
        _check_tracing_works()
        examples = []
        for value, live in zip(plain, self.live, strict=True):
            example = value.detach().clone()
            example.__class__ = type(live)
            examples.append(example)
        slots = [i for i, x in enumerate(self.first.inputs) if x is not None]
        first, fn, layout = self.first, self.fn, self.layout

        def lifted(*tensors):
            leaves = [None] * len(first.inputs)
            for i, tensor in zip(slots, tensors, strict=False):
                leaves[i] = tensor
            with _Lift(first.captured, tensors[len(slots) :]):
                out = fn(*layout.args(leaves))
            return tuple(leaf for leaf in pytree.tree_leaves(out) if leaf is not None)

        with torch.enable_grad():
            graph = make_fx(lifted)(*examples)
        for node in graph.graph.nodes:
            if torch.Tag.nondeterministic_seeded in getattr(node.target, "tags", ()):
                raise Untraceable("the step draws random numbers")
            if node.op == "get_attr" and getattr(graph, node.target).requires_grad:
                raise Untraceable("a tensor with a gradient became a constant")
        graph.graph.eliminate_dead_code()
        graph.recompile()
        if not outputs_agree(graph(*examples), lifted(*examples)):
            raise Untraceable("the trace disagrees with the step")
        # TorchScript runs the graph's ops without Python: 2-2.5x faster per step than the
        # graph's own Python code on the stochastic-volatility step
        plain = tuple(_values.plain(e) for e in examples)
        compiled = compile_graph(graph, plain)
        self.graph = compiled if outputs_agree(compiled(*plain), graph(*plain)) else graph


def _check_tracing_works() -> None:
    """``make_fx`` traces here (not inside a torch.func transform, where it would take every
    tensor for a constant)."""
    probe = make_fx(lambda a: a + 1.0)(torch.zeros(()))
    if any(node.op == "get_attr" for node in probe.graph.nodes):
        raise Untraceable("make_fx cannot trace inside this transform")


def _trace(fn, layout: _Layout, first: _Recorded):
    """The step's graph (a function of the step's argument tensors, then the tensors it closes
    over, to its output tensors), or None where it cannot be traced."""
    work = _TraceWork(fn, layout, first)
    try:
        _Outside.apply(work, *work.live)
    except Exception:  # noqa: BLE001 - any failure: the Python loop
        return None
    return work.graph
