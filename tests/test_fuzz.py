"""Fuzz: random small models, fitted briefly with NUTS and mean-field VI on every backend.

A seeded generator writes the source of a small model (random families from ``ppl_bdl.dsl.dist``
with valid or invalid parameters, random shapes, 0-2 nested plates, local and global latents,
observed values in and out of support, random dtypes and precision) and its data. Each model is
fitted with NUTS (20 warmup, 20 draws, one chain, tree depth <= 4) and with mean-field VI (20
steps), so no run can take long. Every run must either return a Posterior whose draws are
finite or raise one of the project's own errors (a ``ppl_bdl.PPLError``); anything else
(a backend's raw exception, non-finite draws) fails, printing the model's source and the fit call
that reproduce it.

A few seeds run in the default suite; ``-m slow`` runs a hundred more per backend. To add a
family, add a :class:`Family` to ``FAMILIES`` (its parameter domains and support are all the
generator needs).
"""

from __future__ import annotations

import math
import re
import warnings
from dataclasses import dataclass

import numpy as np
import pytest

import ppl_bdl as bdl
from ppl_bdl import dist
from ppl_bdl import math as bm

BACKENDS = bdl.backends.available()
NUTS = dict(num_warmup=20, num_samples=20, num_chains=1, max_tree_depth=4)
VI = dict(guide="meanfield", num_steps=20, num_samples=20)
#: Seeds of the default suite, picked (for the generator as written) to be quick and to spread:
#: a DistributionError (1), a ModelError (9), a Python-list parameter (13), fits in 2, 1 and 0
#: plates (14, 33, 54), a DataError (65). A change to the generator changes what a
#: seed makes: pick them again from a run of the slow seeds.
DEFAULT_SEEDS = (1, 9, 14, 54, 65)
SLOW_SEEDS = tuple(s for s in range(56) if s not in DEFAULT_SEEDS)


@dataclass(frozen=True)
class Family:
    """A distribution family as the generator sees it.

    ``params`` lists alternative parameterisations (e.g. probs or logits), each mapping a
    parameter to its domain: "real", "positive", "unit", "count", "low", "high" (scalars) or
    "vector", "positive_vector", "cholesky" (an event of size k). ``support`` names what its
    values are: "real", "positive", "unit", "interval", "binary", "binomial", "count",
    "category", "simplex", "vector".
    """

    name: str
    params: tuple[dict[str, str], ...]
    support: str
    discrete: bool = False

    @property
    def vector_event(self) -> bool:
        return self.support in ("simplex", "vector")


FAMILIES = (
    Family("Normal", ({"loc": "real", "scale": "positive"},), "real"),
    Family("Cauchy", ({"loc": "real", "scale": "positive"},), "real"),
    Family("Laplace", ({"loc": "real", "scale": "positive"},), "real"),
    Family("StudentT", ({"df": "positive", "loc": "real", "scale": "positive"},), "real"),
    Family("HalfNormal", ({"scale": "positive"},), "positive"),
    Family("HalfCauchy", ({"scale": "positive"},), "positive"),
    Family("HalfStudentT", ({"df": "positive", "scale": "positive"},), "positive"),
    Family("LogNormal", ({"loc": "real", "scale": "positive"},), "positive"),
    Family("Gamma", ({"concentration": "positive", "rate": "positive"},), "positive"),
    Family("InverseGamma", ({"concentration": "positive", "rate": "positive"},), "positive"),
    Family("Exponential", ({"rate": "positive"},), "positive"),
    Family("Beta", ({"concentration1": "positive", "concentration0": "positive"},), "unit"),
    Family("Uniform", ({"low": "low", "high": "high"},), "interval"),
    Family("Bernoulli", ({"probs": "unit"}, {"logits": "real"}), "binary", discrete=True),
    Family(
        "Binomial",
        ({"total_count": "count", "probs": "unit"}, {"total_count": "count", "logits": "real"}),
        "binomial",
        discrete=True,
    ),
    Family("Poisson", ({"rate": "positive"},), "count", discrete=True),
    Family("Categorical", ({"logits": "vector"}, {"probs": "simplex"}), "category", discrete=True),
    Family("Dirichlet", ({"concentration": "positive_vector"},), "simplex"),
    Family("MultivariateNormal", ({"loc": "vector", "scale_tril": "cholesky"},), "vector"),
)
LATENT_FAMILIES = tuple(f for f in FAMILIES if not f.discrete)
#: How a scalar parameter of each domain can be computed from a latent of each support.
FROM_LATENT = {
    "real": {"real": "{}", "positive": "bm.log({})", "unit": "{}", "interval": "{}"},
    "positive": {"real": "bm.exp({})", "positive": "{}", "unit": "{} + 0.5"},
    "unit": {"real": "bm.sigmoid({})", "unit": "{}"},
}


# -- values ---------------------------------------------------------------------------------------
def _valid(domain: str, rng, shape: tuple, k: int) -> np.ndarray:
    if domain == "real":
        return rng.normal(0.0, 1.0, shape)
    if domain == "positive":
        return rng.uniform(0.5, 2.0, shape)
    if domain == "unit":
        return rng.uniform(0.1, 0.9, shape)
    if domain == "count":
        return rng.integers(1, 6, shape).astype(float)
    if domain == "low":
        return rng.uniform(-2.0, -0.6, shape)
    if domain == "high":
        return rng.uniform(0.6, 2.0, shape)
    if domain == "vector":
        return rng.normal(0.0, 1.0, shape + (k,))
    if domain == "positive_vector":
        return rng.uniform(0.5, 2.0, shape + (k,))
    if domain == "simplex":
        return rng.dirichlet(np.ones(k), size=shape)
    if domain == "cholesky":
        lower = np.tril(rng.normal(0.0, 0.3, shape + (k, k)), -1)
        return lower + np.eye(k) * rng.uniform(0.5, 1.5, shape + (k,))[..., None]
    raise ValueError(domain)


def _invalid(domain: str, rng, shape: tuple, k: int) -> np.ndarray:
    value = np.array(_valid(domain, rng, shape, k), dtype=float)
    flat = value.reshape(-1)
    bad = {
        "real": [math.nan, math.inf],
        "positive": [-1.0, 0.0],
        "unit": [1.5, -0.2],
        "count": [2.5, -1.0],
        "low": [5.0],
        "high": [-5.0],
        "vector": [math.nan],
        "positive_vector": [-1.0],
        "simplex": [0.9],
    }
    if domain == "cholesky":
        value[..., 0, 0] = -1.0
    else:
        flat[rng.integers(flat.size)] = rng.choice(bad[domain])
    return value


def _observed(family: Family, rng, shape: tuple, k: int, in_support: bool):
    """Observed values of ``family`` of value shape ``shape`` (event included)."""
    support = family.support
    batch = shape[:-1] if family.vector_event else shape
    if support == "real":
        value = rng.normal(0.0, 1.0, shape)
    elif support == "positive":
        value = rng.exponential(1.0, shape) + 0.05
    elif support == "unit":
        value = rng.uniform(0.05, 0.95, shape)
    elif support == "interval":
        value = rng.uniform(-0.5, 0.5, shape)
    elif support == "binary":
        value = rng.integers(0, 2, shape)
    elif support in ("binomial", "count"):
        value = rng.integers(0, 2, shape)
    elif support == "category":
        value = rng.integers(0, k, shape)
    elif support == "simplex":
        value = rng.dirichlet(np.ones(k), size=batch)
    else:
        value = rng.normal(0.0, 1.0, shape)
    if not in_support and value.size:
        value = np.array(value, dtype=float)
        outside = {
            "real": [math.nan, math.inf],
            "positive": [-1.0, 0.0],
            "unit": [1.5, 0.0],
            "interval": [5.0],
            "binary": [0.5, 2.0],
            "binomial": [9.0, 0.5],
            "count": [-1.0, 2.5],
            "category": [float(k), -1.0],
            "simplex": [0.9],
            "vector": [math.nan],
        }[support]
        value.reshape(-1)[rng.integers(value.size)] = rng.choice(outside)
    return value


def _render_value(value: np.ndarray, rng, discrete: bool, list_chance: float) -> str:
    """Source text of ``value`` as a Python list (with chance ``list_chance``), a Python number
    or a NumPy array of a random dtype (integers too for discrete values)."""
    kinds = ["float32", "float64"] + (["int64", "int32"] if discrete else [])
    if value.ndim == 0:
        kinds.append("python")
    kind = "list" if rng.uniform() < list_chance else str(rng.choice(kinds))
    if kind in ("int64", "int32") and not np.all(np.isfinite(value)):
        kind = "float64"
    if kind == "python":
        return repr(float(value))
    if kind == "list":
        return repr(np.asarray(value, dtype=float).tolist())
    return f"np.array({np.asarray(value, dtype=kind).tolist()!r}, dtype={kind!r})"


# -- models ---------------------------------------------------------------------------------------
@dataclass
class _Latent:
    name: str
    support: str
    shape: tuple  # value shape
    k: int = 0


def _fits(shape: tuple, target: tuple) -> bool:
    try:
        return np.broadcast_shapes(shape, target) == target
    except ValueError:
        return False


#: Chances of an invalid parameter, an observed value outside its support, a wrong shape.
P_INVALID, P_OUTSIDE, P_WRONG_SHAPE = 0.04, 0.12, 0.02


def _params_source(family: Family, rng, site_shape: tuple, k: int, latents: list[_Latent]):
    """Source of ``family``'s arguments for a site of batch shape ``site_shape``; and whether
    they are all valid."""
    variant = family.params[rng.integers(len(family.params))]
    args, valid = [], True
    for key, domain in variant.items():
        if domain == "vector":
            usable = [z for z in latents if z.support == "vector" and z.k == k]
        else:
            usable = [z for z in latents if z.support in FROM_LATENT.get(domain, {})]
        if rng.uniform() >= P_WRONG_SHAPE * 2:  # mostly latents whose shape fits the site's
            event = 1 if domain == "vector" else 0
            usable = [z for z in usable if _fits(z.shape[: len(z.shape) - event], site_shape)]
        if usable and rng.uniform() < 0.4:
            z = usable[rng.integers(len(usable))]
            template = "{}" if domain == "vector" else FROM_LATENT[domain][z.support]
            args.append(f"{key}={template.format(z.name)}")
            continue
        shape = site_shape if rng.uniform() < 0.5 else ()
        if rng.uniform() < P_INVALID:
            value, valid = _invalid(domain, rng, shape, k), False
        else:
            if shape and rng.uniform() < P_WRONG_SHAPE:
                shape, valid = shape + (7,), False  # a shape that cannot broadcast
            value = _valid(domain, rng, shape, k)
        if domain == "count" and value.ndim == 0 and rng.uniform() < 0.5 and valid:
            args.append(f"{key}={int(value)}")
        else:
            args.append(f"{key}={_render_value(np.asarray(value), rng, False, 0.1)}")
    return f"dist.{family.name}({', '.join(args)})", valid


def generate(seed: int) -> dict:
    """A random model: its source (model function ``fuzz`` and ``data``), and what it holds."""
    rng = np.random.default_rng(seed)
    k = int(rng.integers(2, 4))
    plates = [(f"p{i}", int(rng.integers(1, 5))) for i in range(int(rng.integers(0, 3)))]
    plate_shape = tuple(size for _, size in reversed(plates))
    lines, data, latents = [], {}, []
    meta = {"seed": seed, "plates": len(plates), "families": [], "valid": True, "obs": []}

    def site(name: str, family: Family, observed: bool, in_plates: bool, indent: str) -> None:
        extra = () if in_plates else [(), (2,), (3,)][rng.integers(3)]
        batch = plate_shape if in_plates else extra
        params, valid = _params_source(family, rng, batch, k, latents)
        meta["valid"] &= valid
        meta["families"].append(family.name)
        event = (k,) if family.vector_event else ()
        shape_arg = "" if in_plates else f", shape={extra!r}"
        if not observed:
            lines.append(f'{indent}{name} = bdl.sample("{name}", {params}{shape_arg})')
            latents.append(_Latent(name, family.support, batch + event, k))
            return
        in_support = rng.uniform() >= P_OUTSIDE
        value_shape = batch + event
        if rng.uniform() < P_WRONG_SHAPE:
            value_shape, in_support = value_shape + (2,), False  # the wrong shape
        value = _observed(family, rng, value_shape, k, in_support)
        meta["valid"] &= in_support
        meta["obs"].append("in" if in_support else "out")
        data[name] = _render_value(value, rng, family.discrete, 0.25)
        lines.append(f'{indent}bdl.sample("{name}", {params}{shape_arg}, obs=data["{name}"])')

    for i in range(int(rng.integers(1, 4))):
        family = LATENT_FAMILIES[rng.integers(len(LATENT_FAMILIES))]
        site(f"z{i}", family, observed=False, in_plates=False, indent="    ")
    observed = [
        (f"y{i}", FAMILIES[rng.integers(len(FAMILIES))], bool(plates) and rng.uniform() < 0.8)
        for i in range(int(rng.integers(1, 3)))
    ]
    for name, family, inside in observed:
        if not inside:
            site(name, family, observed=True, in_plates=False, indent="    ")
    indent = "    "
    if any(inside for _, _, inside in observed):
        for name, size in plates:
            lines.append(f'{indent}with bdl.plate("{name}", {size}):')
            indent += "    "
        if rng.uniform() < 0.4:
            family = LATENT_FAMILIES[rng.integers(len(LATENT_FAMILIES))]
            site("local", family, observed=False, in_plates=True, indent=indent)
        for name, family, inside in observed:
            if inside:
                site(name, family, observed=True, in_plates=True, indent=indent)
    meta["precision"] = "float64" if rng.uniform() < 0.25 else "float32"
    data_src = ", ".join(f'"{n}": {v}' for n, v in data.items())
    meta["source"] = (
        f"data = {{{data_src}}}\n\n\n@bdl.model\ndef fuzz(data):\n" + "\n".join(lines) + "\n"
    )
    return meta


def build(meta: dict):
    """The bound model of a generated spec (``fuzz(data)``)."""
    namespace = {"np": np, "bdl": bdl, "dist": dist, "bm": bm, "nan": math.nan, "inf": math.inf}
    exec(compile(meta["source"], f"<fuzz seed {meta['seed']}>", "exec"), namespace)  # noqa: S102
    return namespace["fuzz"], namespace["data"]


def reproducer(meta: dict, backend: str, method: str) -> str:
    options = NUTS if method == "nuts" else VI
    call = ", ".join(f"{k}={v!r}" for k, v in options.items())
    return (
        "import math\nimport numpy as np\nimport ppl_bdl as bdl\nfrom ppl_bdl import dist, math as bm\n"
        "nan, inf = math.nan, math.inf\n\n" + meta["source"] + "\n"
        f"bdl.fit(fuzz(data), backend={backend!r}, method={method!r}, "
        f"precision={meta['precision']!r}, seed={meta['seed']}, progress=False, {call})\n"
    )


def run_case(seed: int, backend: str) -> tuple[list[str], list[str]]:
    """Fit seed's model with NUTS and VI on ``backend``; return the outcomes and the failures."""
    meta = generate(seed)
    outcomes, failures = [], []
    for method, options in (("nuts", NUTS), ("vi", VI)):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model, data = build(meta)
                post = bdl.fit(
                    model(data),
                    backend=backend,
                    method=method,
                    precision=meta["precision"],
                    seed=seed,
                    progress=False,
                    **options,
                )
        except bdl.PPLError as err:
            outcomes.append(f"{method}: {type(err).__name__}")
            continue
        except Exception as err:  # noqa: BLE001 - what the fuzzer looks for
            failures.append(f"{method} raised {type(err).__name__}: {err}")
        else:
            bad = [n for n, v in post.samples.items() if not np.all(np.isfinite(v))]
            if bad:
                failures.append(f"{method} returned non-finite draws of {bad}")
            else:
                outcomes.append(f"{method}: ok")
                continue
        failures[-1] += "\nreproduce with:\n" + reproducer(meta, backend, method)
    return outcomes, failures


#: Bugs the fuzzer found outside this test, reported to the lead with a reproducer: a run that
#: fails only with these (message pattern -> what is wrong) is an expected failure until fixed.
KNOWN_BUGS: dict[str, str] = {}


def _check(seed: int, backend: str) -> None:
    outcomes, failures = run_case(seed, backend)
    known = {
        reason
        for failure in failures
        for pattern, reason in KNOWN_BUGS.items()
        if re.search(pattern, failure.split("\nreproduce with:")[0])
    }
    unknown = [
        f
        for f in failures
        if not any(re.search(p, f.split("\nreproduce with:")[0]) for p in KNOWN_BUGS)
    ]
    assert not unknown, f"seed {seed} on {backend}:\n" + "\n\n".join(unknown)
    if known:
        pytest.xfail("known bug(s): " + "; ".join(sorted(known)))


@pytest.mark.parametrize("seed", DEFAULT_SEEDS)
def test_fuzz_runs_work_or_raise_our_errors(backend, seed):
    _check(seed, backend)


@pytest.mark.slow
@pytest.mark.parametrize("seed", SLOW_SEEDS)
def test_fuzz_more_seeds(backend, seed):
    _check(seed, backend)


def test_generator_covers_what_it_claims():
    """Over the slow seeds the generator makes every family, 0-2 plates, invalid parameters,
    observed values outside their support and valid models (a fuzzer that never makes an
    error case, or never a working one, tests nothing)."""
    metas = [generate(seed) for seed in list(DEFAULT_SEEDS) + list(SLOW_SEEDS)]
    families = {f for m in metas for f in m["families"]}
    assert families == {f.name for f in FAMILIES}
    assert {m["plates"] for m in metas} == {0, 1, 2}
    assert any("out" in m["obs"] for m in metas)
    assert 0.3 < np.mean([m["valid"] for m in metas]) < 0.8
    assert {m["precision"] for m in metas} == {"float32", "float64"}
    for meta in metas[:20]:
        model, data = build(meta)  # the source compiles and binds
        assert isinstance(model(data), bdl.BoundModel)
    default = [generate(seed) for seed in DEFAULT_SEEDS]
    assert any(m["valid"] for m in default) and not all(m["valid"] for m in default)
