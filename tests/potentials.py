"""Helpers of tests/test_model_values*.py: a model's potential through the samplers' compiled path,
and tiny fits."""

from __future__ import annotations

import sys
import warnings

import numpy as np

import ppl_bdl as bdl
from ppl_bdl.trace.layout import LatentLayout, ModelDensity, trace_model

NUTS = dict(num_warmup=15, num_samples=10, num_chains=1, max_tree_depth=3, progress=False)
VI = dict(method="vi", num_steps=30, num_samples=10, progress=False)


def potential(bound, backend: str, points: np.ndarray, compiled: bool = True):
    """U and ∇U of ``bound`` at each row of ``points`` (unconstrained), through the compiled path
    the samplers use (``jit`` on JAX; the traced graph on torch; the eager one if not
    ``compiled``), as NumPy."""
    be = bdl.backends.get(backend)
    layout = LatentLayout.from_sites(trace_model(bound, be), be)
    density = ModelDensity(bound, be, layout)
    out = []
    with be.scope(), be.activate(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = be.asarray(points[0])
        fn = lambda flat, data: density.value_and_grad(flat, data)  # noqa: E731
        if compiled:
            fn = be.trace(be.jit(fn), (first, density.data))
        for row in points:
            value, grad = fn(be.asarray(row), density.data)
            out.append((float(be.to_numpy(value)), np.asarray(be.to_numpy(grad), dtype=float)))
    # the traced step, not the eager fallback
    assert not [w for w in caught if "could not trace" in str(w.message)], bound.name
    return out


_REFERENCES: dict = {}


def assert_same_potential(bound, reference, backend: str, dim: int, compiled: bool = True):
    """``bound`` and ``reference`` have the same U and ∇U at two points (``reference``'s are
    computed once per test session, keyed by its model, data and backend)."""
    points = np.random.default_rng(0).uniform(-1.5, 1.5, size=(2, dim))
    got = potential(bound, backend, points, compiled)
    with np.printoptions(threshold=sys.maxsize):
        data = repr((reference.args, reference.kwargs))
    key = (reference.model.fn, data, backend, dim, compiled)
    if key not in _REFERENCES:
        _REFERENCES[key] = potential(reference, backend, points, compiled)
    expected = _REFERENCES[key]
    for (v, g), (v_ref, g_ref) in zip(got, expected, strict=True):
        atol = 1e-5 * (1.0 + abs(v_ref))
        np.testing.assert_allclose(v, v_ref, rtol=1e-5, atol=atol)
        np.testing.assert_allclose(g, g_ref, rtol=1e-5, atol=atol * (1.0 + np.abs(g_ref).max()))


def assert_fits(bound, backend: str):
    """A tiny NUTS run and a VI run give finite draws."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for options in (NUTS, VI):
            post = bdl.fit(bound, backend=backend, seed=1, **options)
            for name, draws in post.samples.items():
                assert np.all(np.isfinite(draws)), (backend, options, name)
