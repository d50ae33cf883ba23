"""The effect stack: how a primitive such as ``sample`` reaches whoever runs the model.

A model is a plain Python function. While it runs, a stack of handlers is active (a context
variable, so threads and asyncio tasks do not see each other's stacks). Each primitive builds a
:class:`Message` and hands it to :func:`apply_stack`, which is one short loop:

1. every handler, innermost first, may ``process`` the message (a plate adds its frame, a
   substitution fixes the value) and may set ``msg.stop`` to keep outer handlers out;
2. the bottom handler is always a :class:`Runtime`. It turns the message into a value: the native
   ``pyro.sample`` / ``numpyro.sample`` call when a model is lowered, or a value and a log density
   when the core evaluates the model itself;
3. ``postprocess`` runs outermost first, to let handlers read the result.

The runtime also remembers the site being computed and the last one finished
(``current_site``, ``last_site``: two attribute stores per primitive), so an error raised while
the model runs can name where it happened (:mod:`ppl_bdl.dsl.model_errors`).

Handlers are context managers; leaving the ``with`` block pops them even when the model raises,
so a failed run never leaves a stale stack behind.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from ppl_bdl.backend_protocol import Backend
from ppl_bdl.errors import ModelError

_STACK: ContextVar[tuple[Handler, ...]] = ContextVar("ppl_bdl_stack", default=())
_BACKEND: ContextVar[Backend | None] = ContextVar("ppl_bdl_backend", default=None)


@dataclass
class PlateFrame:
    """One ``plate`` the current site sits in.

    ``dim`` is the batch dimension the plate owns, counted from the right as in Pyro: the first
    (outermost) plate owns dim -1, a plate nested in it dim -2. ``indices`` is the index array the
    plate yielded; ``scale`` is ``size / len(indices)`` (1 for a full batch).
    """

    name: str
    size: int
    dim: int
    indices: Any = None
    batch_size: int = 0
    scale: float = 1.0


@dataclass
class Message:
    """A primitive call on its way down the stack."""

    type: str
    name: str
    fn: Any = None
    value: Any = None
    obs: Any = None
    shape: tuple[int, ...] | None = None
    plates: list[PlateFrame] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)
    stop: bool = False

    @property
    def scale(self) -> float:
        scale = 1.0
        for frame in self.plates:
            scale *= frame.scale
        return scale


class Handler:
    """Base of every handler: a context manager that pushes itself on the stack."""

    def __enter__(self):
        self._token = _STACK.set(_STACK.get() + (self,))
        return self

    def __exit__(self, *exc_info):
        _STACK.reset(self._token)
        return False

    def process(self, msg: Message) -> None:  # noqa: B027 - optional hook
        """Look at or change ``msg`` before the runtime produces its value."""

    def postprocess(self, msg: Message) -> None:  # noqa: B027 - optional hook
        """Look at ``msg`` after the runtime has produced its value."""


class Runtime(Handler):
    """The bottom handler: runs primitives on one backend.

    Entering a runtime also makes its backend the one :mod:`ppl_bdl.dsl.math` dispatches to.
    Subclasses implement :meth:`run` (sample, param, deterministic, factor), :meth:`plate` and
    :meth:`scan`.
    """

    #: Whether primitives and distributions check their input in this run (a run that skips the
    #: checks only ever follows a validating run of the same model).
    validate = True
    #: Whether the model's code gets values that refuse to become Python values (``if mu > 0``,
    #: ``float(mu)``) where the backend can tell (the validating run; see ``model_value``).
    strict_values = False
    #: The site whose primitive was entered last, and the last one that returned (the same name
    #: between sites; different while a primitive is running).
    current_site: str | None = None
    last_site: str | None = None

    def __init__(self, backend: Backend):
        self.backend = backend

    def __enter__(self):
        if _STACK.get():
            raise ModelError(
                "a model is already running in this context; ppl_bdl does not nest model runs. "
                "Call fit/predict from outside the model function."
            )
        self._backend_token = _BACKEND.set(self.backend)
        return super().__enter__()

    def __exit__(self, *exc_info):
        _BACKEND.reset(self._backend_token)
        return super().__exit__(*exc_info)

    def run(self, msg: Message) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def plate(self, frame: PlateFrame):  # pragma: no cover - abstract
        """Return a context manager that enters the plate and yields its index array."""
        raise NotImplementedError

    def scan(self, f, init, xs, length: int, name: str):  # pragma: no cover - abstract
        """Run ``bdl.scan`` (see :mod:`ppl_bdl.dsl.control_flow`); return ``(carry, ys)``."""
        raise NotImplementedError


def apply_stack(msg: Message) -> Message:
    """Send ``msg`` through the active handlers and return it with its value set."""
    stack = _STACK.get()
    if not stack:
        raise ModelError(
            f"{msg.type}({msg.name!r}) was called outside a model run. Primitives only work inside a "
            "function decorated with @ppl_bdl.dsl.model, run by fit/predict/lower."
        )
    runtime = stack[0]
    runtime.current_site = msg.name
    for handler in reversed(stack[1:]):
        handler.process(msg)
        if msg.stop:
            break
    else:
        runtime.run(msg)
    for handler in stack[1:]:
        handler.postprocess(msg)
    runtime.last_site = msg.name
    return msg


class PlateHandler(Handler):
    """Adds its frame to every site sampled inside the plate (``bdl.plate`` pushes one)."""

    def __init__(self, frame: PlateFrame):
        self.frame = frame

    def process(self, msg: Message) -> None:
        if msg.type in ("sample", "factor", "deterministic"):
            msg.plates.append(self.frame)


def current_runtime() -> Runtime | None:
    stack = _STACK.get()
    return stack[0] if stack else None


def current_plates() -> list[PlateFrame]:
    return [h.frame for h in _STACK.get() if isinstance(h, PlateHandler)]


def innermost_handler(kind: type) -> Handler | None:
    """The innermost handler of class ``kind`` on the stack of the run in progress, or None
    (how a layer reads a context a handler sets, such as active dropout)."""
    for handler in reversed(_STACK.get()):
        if isinstance(handler, kind):
            return handler
    return None


def active_backend() -> Backend | None:
    """The backend of the model run or ``backend.activate()`` block in progress, or None."""
    return _BACKEND.get()


def current_backend() -> Backend:
    """The backend of the model run or inference loop in progress.

    Raises a clear error outside any run: the backend is always chosen at fit time, never set
    process-wide.
    """
    backend = _BACKEND.get()
    if backend is None:
        raise ModelError(
            "ppl_bdl.dsl.math / ppl_bdl.dsl.random was called outside a model run or inference loop, so there "
            "is no backend to run it on. Call it inside a @ppl_bdl.dsl.model function (run by fit, "
            "predict or lower), or wrap your code in `with ppl_bdl.backends.get('numpyro').activate():`."
        )
    return backend


class use_backend:
    """Make ``backend`` the target of :mod:`ppl_bdl.dsl.math` for the ``with`` block (no model run).

    Inference loops enter this so kernels and guides written with ``ppl_bdl.dsl.math`` run on the
    backend chosen at fit time.
    """

    def __init__(self, backend: Backend):
        self.backend = backend

    def __enter__(self):
        self._token = _BACKEND.set(self.backend)
        return self.backend

    def __exit__(self, *exc_info):
        _BACKEND.reset(self._token)
        return False
