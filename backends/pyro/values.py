"""The tensors a model's code is given on the Pyro backend.

A JAX array takes NumPy arrays on either side of an operator (``np.log(w) - (y - mu) ** 2``); a
torch tensor does not (its operators refuse ``numpy.ndarray`` operands, and NumPy then turns the
tensor itself into an array, which fails under autograd). So the values a model's code receives
on torch (latent values, the data, a plate's indices, params) are :class:`ModelTensor` objects,
and so is everything computed from them (``__torch_function__`` hands the class on): NumPy
defers to their operators (``__array_ufunc__ = None``), which convert NumPy operands to tensors
of the other operand's precision. ``@`` promotes integer data to the other operand's float
dtype, as NumPy and JAX do.

In the validating run (once per fit) the values are :class:`StrictTensor` objects: they also
refuse to become a Python bool, a Python number or a NumPy array while the model's own code
runs, raising :class:`~ppl_bdl.dsl.model_errors.ValueConversionError`, which the core reports as a
:class:`~ppl_bdl.errors.ModelError` naming the site and line. (A traced step, ``make_fx``, runs
the model once and would freeze whatever Python decided from a value then; ``jax.jit``
refuses.)

Costs: one alias per value handed to the model per run and a Python call per operation on them
in eager runs (replays, prediction); none in traced steps, whose graphs hold only aten ops. The
class is set on fresh results in place (``__class__``) rather than by ``as_subclass``, whose
aliases ``make_fx`` does not track.

Example
-------
>>> import numpy as np, torch
>>> from ppl_bdl.backends.pyro.values import model_value
>>> mu = model_value(torch.tensor([0.5, 1.0]), strict=False)
>>> out = np.log(np.array([1.0, 2.0])) - (np.zeros(2) - mu) ** 2
>>> type(out).__name__, out.dtype
('ModelTensor', torch.float32)
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ppl_bdl.dsl.effects import current_runtime
from ppl_bdl.dsl.model_errors import ValueConversionError

Tensor = torch.Tensor
_Unwrapped = torch._C.DisableTorchFunctionSubclass
_torch_function_on = torch._C._is_torch_function_enabled


def model_value(value: Any, strict: bool) -> Any:
    """``value`` as the model's code sees it: a :class:`ModelTensor` alias of a tensor
    (:class:`StrictTensor` where ``strict``); anything else as it is."""
    if not isinstance(value, Tensor):
        return value
    with _Unwrapped():
        out = value.view_as(value)
    out.__class__ = StrictTensor if strict else ModelTensor
    return out


def plain(value: Any) -> Any:
    """A plain-tensor alias of a model tensor (for torch's own code, which then runs without
    the per-operation hook); anything else as it is."""
    if type(value) is Tensor or not isinstance(value, Tensor):
        return value
    with _Unwrapped():
        return value.view_as(value)


def matmul(a, b):
    """``a @ b`` with integer data promoted to the other operand's float dtype (torch's matmul
    refuses mixed dtypes)."""
    if isinstance(a, Tensor) and isinstance(b, Tensor) and a.dtype != b.dtype:
        dtype = torch.promote_types(a.dtype, b.dtype)
        a, b = a.to(dtype), b.to(dtype)
    return torch.matmul(a, b)


def _tensor_of(array: np.ndarray, like: Tensor) -> Tensor:
    """A NumPy operand as a tensor next to ``like``: floats in ``like``'s float dtype (the fit's
    precision; float64 NumPy constants do not promote, as under JAX's default float32)."""
    kind = array.dtype.kind
    if kind == "f":
        dtype = like.dtype if like.is_floating_point() else torch.get_default_dtype()
    elif kind in "iu":
        dtype = torch.int64
    else:
        dtype = None
    if not array.flags.writeable:
        array = array.copy()
    return torch.as_tensor(array, dtype=dtype, device=like.device)


def _operator(method, reflected: bool = False, promote: bool = False):
    """A binary operator of the model tensors: a NumPy operand becomes a tensor first."""

    def operator(self, other):
        if isinstance(other, np.ndarray):
            other = _tensor_of(other, self)
        if promote:
            return matmul(other, self) if reflected else matmul(self, other)
        return method(self, other)

    operator.__name__ = method.__name__
    return operator


def _adopt(out, cls, args):
    """Results of an operation on model tensors are model tensors too (inputs returned as they
    are keep their class)."""
    if type(out) is Tensor:
        if not any(out is a for a in args):
            out.__class__ = cls
    elif isinstance(out, tuple | list):
        for item in out:
            if type(item) is Tensor and not any(item is a for a in args):
                item.__class__ = cls
    return out


class ModelTensor(Tensor):
    """A tensor of a model run: NumPy operands work on either side of its operators."""

    __slots__ = ()
    #: NumPy defers to our (reflected) operators instead of converting the tensor.
    __array_ufunc__ = None

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        with _Unwrapped():
            out = func(*args, **(kwargs or {}))
        return _adopt(out, cls, args)

    __add__ = _operator(Tensor.__add__)
    __radd__ = _operator(Tensor.__radd__)
    __sub__ = _operator(Tensor.__sub__)
    __rsub__ = _operator(Tensor.__rsub__)
    __mul__ = _operator(Tensor.__mul__)
    __rmul__ = _operator(Tensor.__rmul__)
    __truediv__ = _operator(Tensor.__truediv__)
    __rtruediv__ = _operator(Tensor.__rtruediv__)
    __floordiv__ = _operator(Tensor.__floordiv__)
    __rfloordiv__ = _operator(Tensor.__rfloordiv__)
    __mod__ = _operator(Tensor.__mod__)
    __rmod__ = _operator(Tensor.__rmod__)
    __pow__ = _operator(Tensor.__pow__)
    __rpow__ = _operator(Tensor.__rpow__)
    __matmul__ = _operator(Tensor.__matmul__, promote=True)
    __rmatmul__ = _operator(Tensor.__rmatmul__, reflected=True, promote=True)
    __and__ = _operator(Tensor.__and__)
    __rand__ = _operator(Tensor.__rand__)
    __or__ = _operator(Tensor.__or__)
    __ror__ = _operator(Tensor.__ror__)
    __xor__ = _operator(Tensor.__xor__)
    __rxor__ = _operator(Tensor.__rxor__)
    __lt__ = _operator(Tensor.__lt__)
    __le__ = _operator(Tensor.__le__)
    __gt__ = _operator(Tensor.__gt__)
    __ge__ = _operator(Tensor.__ge__)
    __eq__ = _operator(Tensor.__eq__)
    __ne__ = _operator(Tensor.__ne__)
    __hash__ = Tensor.__hash__

    def __format__(self, spec: str) -> str:
        # torch formats only exact Tensors as numbers (f"{x:.2f}" for a 0-d tensor)
        return format(plain(self), spec)

    def __repr__(self, **kwargs) -> str:
        return repr(plain(self))


def _refuse(what: str) -> None:
    """Raise while the model's own code runs in a validating run (not in ppl_bdl's or torch's
    code, which runs with the hook off, nor after the run)."""
    if _torch_function_on():
        runtime = current_runtime()
        if runtime is not None and runtime.strict_values:
            raise ValueConversionError(f"{what} of a model value")


class StrictTensor(ModelTensor):
    """A tensor of a validating run: refuses to become a Python bool, number or NumPy array."""

    __slots__ = ()

    def __bool__(self) -> bool:
        _refuse("bool()")
        return Tensor.__bool__(self)

    def __float__(self) -> float:
        _refuse("float()")
        return Tensor.__float__(self)

    def __int__(self) -> int:
        _refuse("int()")
        return Tensor.__int__(self)

    def __index__(self) -> int:
        _refuse("an index")
        return Tensor.__index__(self)

    def __complex__(self) -> complex:
        _refuse("complex()")
        return Tensor.__complex__(self)

    def item(self):
        _refuse(".item()")
        return Tensor.item(self)

    def tolist(self):
        _refuse(".tolist()")
        return Tensor.tolist(self)

    def numpy(self, *, force: bool = False):
        _refuse(".numpy()")
        return Tensor.numpy(self, force=force)

    def __array__(self, dtype=None, copy=None):
        _refuse("a NumPy array")
        return Tensor.__array__(plain(self), dtype)
