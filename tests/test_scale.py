"""Work over several devices (data and chains spread), tested on JAX's virtual CPU devices.

JAX fixes its number of CPU devices when it starts (``XLA_FLAGS=
--xla_force_host_platform_device_count=4``), so the runs on four devices are subprocesses
(:mod:`scale_fits`) whose draws are compared with the same fits on one device here: chains split
over the devices draw what they draw on one device, for every kernel and guide, with a number
of chains the devices do not divide; ``shard="data"`` steps match the unsplit steps to float
tolerance. The split program itself is checked: a chunk with chains split over the devices has
no cross-device communication at all (each device runs its own chains), and a data-split one has
the reduction XLA inserted. Ensembles' members split like chains. Torch spreads chains over a
device list one worker process per device (the CPU listed twice here), drawing what one
process draws, bit for bit. VI's ``num_chains``: independent fits side by side, the first the
one fit of the same seed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest

import ppl_bdl as bdl
from ppl_bdl import dist

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import scale_fits  # noqa: E402

pytest.importorskip("jax")

#: Float tolerance between a split and an unsplit run (float32; a few dozen steps). XLA may
#: compile a step over 2 chains (a device's share) a little differently from one over 5: NUTS
#: carries such last-digit differences through its adaptation and trajectories (seen: 4e-5
#: relative after 50 draws), the SG kernels, HMC without warmup and VI less (1e-7).
ATOL = 1e-5
NATIVE_RTOL = 5e-4


def _env(count: int) -> dict:
    flags = os.environ.get("XLA_FLAGS", "")
    flags += f" --xla_force_host_platform_device_count={count}"
    return dict(os.environ, XLA_FLAGS=flags.strip(), JAX_PLATFORMS="cpu")


def _virtual(names, device="cpu:*", shard=None, count=4) -> dict:
    """``scale_fits.run(names, device, shard)`` on ``count`` virtual CPU devices (``device``
    "cpu:0,cpu:1": the list of those two)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.npz"
        cmd = [sys.executable, str(HERE / "scale_fits.py"), str(out), device, shard or "-", *names]
        proc = subprocess.run(cmd, env=_env(count), capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr[-4000:]
        with np.load(out) as saved:
            found = {k: saved[k] for k in saved.files}
    assert int(found.pop("devices")) == count
    return found


def _script(code: str, count: int = 4) -> str:
    """Run ``code`` on ``count`` virtual CPU devices; its stdout."""
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=_env(count),
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout


def _compare(names, device="cpu:*", shard=None, count=4):
    split = _virtual(names, device, shard, count)
    one = scale_fits.run(names)
    assert sorted(split) == sorted(one)
    for key, value in one.items():
        if value.dtype.kind in "US":  # an error's message: the same step and chain
            assert str(split[key]) == str(value), key
        else:
            rtol = NATIVE_RTOL if key == "nuts" else 1e-5
            np.testing.assert_allclose(split[key], value, atol=ATOL, rtol=rtol, err_msg=key)


# -- chains over devices -------------------------------------------------------------------------
def test_chains_split_over_devices_draw_what_one_device_draws():
    """Five SGLD chains on four devices (padded to eight: the copies' draws dropped): the draws
    of one device."""
    _compare(["sgld"])


CHAIN_FITS = [
    n for n in scale_fits.FITS if "data" not in n and n != "sgld" and not n.startswith("ensemble")
]


def test_ensemble_members_split_over_devices_are_the_members_of_one_device():
    """Five members of a plain and of an anchored ensemble on four devices (padded to eight,
    as chains are): each member's position and its losses at every step are those of one
    device."""
    _compare(["ensemble", "ensemble_anchored"])


def test_an_explicit_device_list_splits_chains_and_data():
    """device=["cpu:0", "cpu:1"] (two of four virtual devices): five SGLD chains split over
    them, and one chain's minibatches split over them (shard="data"), as on one device."""
    _compare(["sgld", "sgld_data"], device="cpu:0,cpu:1", shard="auto")


@pytest.mark.slow
def test_every_kernel_and_guide_split_over_devices_draws_what_one_device_draws():
    """Every SG kernel (the cyclical ones too), NUTS and HMC (vectorised, the default over
    several devices), every guide; and a chain that fails on a split run fails at the same
    step, named the same, with the same draws kept."""
    _compare(CHAIN_FITS)


def test_data_parallel_steps_match_the_unsplit_steps():
    """shard="data": each minibatch of 8 split over 4 devices, one chain; the parameters
    replicated and the reduction inserted by XLA: the draws of the unsplit steps."""
    _compare(["sgld_data"], shard="data")


@pytest.mark.slow
def test_data_parallel_steps_of_several_chains_and_of_vi():
    _compare(["sghmc_data", "vi_data"], shard="data")


LOOP_CHECK = """
import re
import jax, jax.numpy as jnp, numpy as np
from ppl_bdl.backends.numpyro.loop import compile_loop
from ppl_bdl.backends.numpyro.shard import Placement

C, L, N, B = 8, 40, 64, 8
data = jnp.asarray(np.random.default_rng(0).normal(size=N), jnp.float32)

def step(state, x, data, t):
    def one(s, key, idx, chain):
        new = 0.9 * s + 0.1 * jax.random.normal(key, s.shape) + 0.01 * jnp.sum(data[idx])
        bad = (chain == 5) & (t == 23)  # chain 5 fails at step 23
        return new, {"v": jnp.where(bad, jnp.nan, jnp.sum(new)), "n": jnp.int32(1)}
    s, info = jax.vmap(one)(state["s"], x["key"], x["idx"], state["chain"])
    return {"s": s, "chain": state["chain"]}, info

def emit(state):
    return state["s"]

keys = jax.vmap(lambda k: jax.random.split(k, L))(jax.random.split(jax.random.PRNGKey(0), C))
idx = np.random.default_rng(1).integers(0, N, size=(L, C, B)).astype(np.int32)
xs = {"key": jnp.swapaxes(keys, 0, 1), "idx": jnp.asarray(idx)}
state = {"s": jnp.zeros((C, 3)), "chain": jnp.arange(C)}
keep = np.zeros(L, bool); keep[4:30:5] = True
collective = r"all-reduce|all-gather|collective-permute|all-to-all|reduce-scatter"
for on_cpu in (True, False):
    one = compile_loop(step, emit, on_cpu=on_cpu)
    chains = Placement(jax.devices(), "chains")
    split = compile_loop(step, emit, on_cpu=on_cpu, mesh=chains.mesh)
    placed = (chains.place(state, 0, None),
              {"key": chains.place(xs["key"], 1, None), "idx": chains.place(xs["idx"], 1, 2)},
              chains.place(data, None, None))
    for steps in (20, 30):  # without and with the failure at step 23
        a = one(state, xs, data, keep, steps, 0, 6, trace=True)
        b = split(*placed, keep, steps, 0, 6, trace=True)
        assert a.failed_at == b.failed_at == (-1 if steps == 20 else 23), (a.failed_at, b.failed_at)
        np.testing.assert_allclose(np.asarray(b.state["s"]), np.asarray(a.state["s"]), atol=1e-6)
        np.testing.assert_allclose(b.rows, a.rows, atol=1e-6)
        np.testing.assert_allclose(b.infos["v"], a.infos["v"], atol=1e-5)
    assert len(b.state["s"].sharding.device_set) == 4  # the chains stayed split
    program = split.split[False]
    from ppl_bdl.backends.numpyro.loop import _specs, chunk_header
    header = chunk_header(keep, 30, 0, 6, on_cpu)
    specs = (_specs(placed[1]), _specs(placed[2]))
    text = program.lower(*placed, header, keep, length=L, num_rows=6,
                         specs=specs).compile().as_text()
    print("chains", on_cpu, sorted(set(re.findall(collective, text))))
# shard="data": the minibatch's batch axis split, the rest replicated; XLA inserts the sum
batch = Placement(jax.devices(), "data")
one = compile_loop(step, emit, on_cpu=True)
placed = (batch.place(state, 0, None),
          {"key": batch.place(xs["key"], 1, None), "idx": batch.place(xs["idx"], 1, 2)},
          batch.place(data, None, None))
a, b = one(state, xs, data, keep, 20, 0, 6), one(*placed, keep, 20, 0, 6)
np.testing.assert_allclose(np.asarray(b.state["s"]), np.asarray(a.state["s"]), atol=1e-6)
from ppl_bdl.backends.numpyro.loop import chunk_header
header = chunk_header(keep, 20, 0, 6)
text = one.fast.lower(*placed, header, length=L, num_rows=6, trace=True)
print("data", sorted(set(re.findall(collective, text.compile().as_text()))))
"""


def test_split_chains_share_nothing_across_devices_and_data_splits_reduce():
    """The loop's own check, on both of its shapes (the CPU's segments, the GPUs' scan): chains
    split over 4 devices give the one-device result, stop at the same failed step (chain 5,
    step 23: the gated re-run), stay split, and their compiled chunk holds no cross-device
    communication (no per-step all-reduce of the finite flag: it is kept per chain); a
    data-split chunk holds the all-reduce XLA inserted for the minibatch's sum."""
    lines = _script(LOOP_CHECK).strip().splitlines()
    assert lines == ["chains True []", "chains False []", "data ['all-reduce']"], lines


ERRORS = """
import numpy as np, ppl_bdl as bdl, sys
sys.path.insert(0, {here!r})
from scale_fits import regression, data

def error(**options):
    try:
        bdl.fit(regression(*data()), backend="numpyro", num_warmup=5, num_samples=5,
                progress=False, **options)
    except bdl.PPLError as err:
        return type(err).__name__ + ": " + str(err)
    return "no error"

print(error(method="sgld", step_size=1e-3, batch_size=8, num_chains=1, device="cpu:*"))
print(error(method="nuts", num_chains=4, device="cpu:*", chain_method="sequential"))
print(error(method="sgld", step_size=1e-3, batch_size=10, num_chains=1, device="cpu:*",
            shard="data"))
print(error(method="nuts", num_chains=1, device="cpu:*", shard="data"))
print(error(method="sgld", step_size=1e-3, num_chains=2, device=["cpu:0", "cpu:0"]))
"""


def test_what_several_devices_cannot_split_is_a_clear_error():
    lines = _script(ERRORS.format(here=str(HERE))).strip().splitlines()
    assert len(lines) == 5, lines
    assert lines[0].startswith("ConfigError") and "num_chains=1" in lines[0]
    assert "shard='data'" in lines[0] and "4 devices" in lines[0]
    assert lines[1].startswith("ConfigError") and "chain_method='vectorized'" in lines[1]
    assert lines[2].startswith("ConfigError") and "batch_size=10 is not a multiple of 4" in lines[2]
    assert "batch_size=8" in lines[2]
    assert lines[3].startswith("ConfigError") and "no batch_size" in lines[3]
    assert lines[4].startswith("BackendError") and "more than once" in lines[4]


@pytest.mark.parametrize(
    "device",
    [[], 3, ["cpu:0", 1], "cpu:0,", "quantum:*"],
    ids=["empty", "int", "mixed", "comma", "kind"],
)
def test_a_device_list_that_names_no_devices_is_a_clear_error(device):
    with pytest.raises(bdl.BackendError, match="device"):
        bdl.backends.get("numpyro", device=device)


def test_shard_names_what_it_splits():
    with pytest.raises(bdl.BackendError, match="shard must be 'chains'.*or 'data'"):
        bdl.backends.get("numpyro", device="cpu:*", shard="model")


def test_a_list_of_one_device_is_that_device():
    """``["cpu:0"]`` (or a star over one device): nothing to split, so the arrays are placed as
    for ``"cpu:0"`` (the plain loop: no per-chunk placement on a mesh; the sharding overhead on
    one device is none) and the draws are those of ``"cpu:0"``, bit for bit."""
    names = ["sgld"]
    a, b = scale_fits.run(names, device="cpu:0"), scale_fits.run(names, device=["cpu:0"])
    np.testing.assert_array_equal(b["sgld"], a["sgld"])
    backend = bdl.backends.get("numpyro", device=["cpu:0"])
    assert backend.device_count == 1 and backend.device == "cpu:0"
    tree = {"x": np.zeros((2, 1))}
    plain = bdl.backends.get("numpyro", device="cpu:0").place(tree, 0)
    placed = backend.place(tree, 0)
    np.testing.assert_array_equal(placed["x"], plain["x"])
    assert placed["x"].devices() == plain["x"].devices()


# -- torch ---------------------------------------------------------------------------------------
def test_torch_chains_over_two_processes_draw_what_one_process_draws():
    """device=["cpu", "cpu"] on torch: five SGLD chains in two worker processes (chains [0, 1,
    2] and [3, 4], one process per device), merged: bit for bit the draws of one process
    (torch runs chains one after another; a chain's draws depend on its seed and number)."""
    pytest.importorskip("torch")
    one = scale_fits.run(["sgld"], backend="pyro")
    two = scale_fits.run(["sgld"], device=["cpu", "cpu"], backend="pyro")
    np.testing.assert_array_equal(two["sgld"], one["sgld"])


def test_what_torch_does_not_spread_over_devices_is_a_clear_error():
    """A list of one device is that device; "cpu:*" is the CPU once (torch has one CPU
    device); VI's fits are not spread over devices (refused, naming what is); no CUDA here."""
    torch = pytest.importorskip("torch")
    bound = scale_fits.regression(*scale_fits.data())
    options = dict(
        backend="pyro",
        method="sgld",
        step_size=1e-3,
        batch_size=8,
        num_warmup=5,
        num_samples=5,
        num_chains=2,
        progress=False,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for device in (["cpu"], "cpu:*"):
            post = bdl.fit(bound, device=device, **options)
            assert post.samples["w"].shape == (2, 5, 2) and post.settings["device"] == "cpu"
    with pytest.raises(bdl.BackendError, match="VI's num_chains fits") as info:
        bdl.fit(
            bound, backend="pyro", method="vi", num_steps=5, device=["cpu", "cpu"], progress=False
        )
    assert "one worker process per device" in str(info.value)
    with pytest.raises(bdl.ConfigError, match="one worker process per device"):
        bdl.fit(bound, device=["cpu", "cpu"], executor="ray", **options)
    if not torch.cuda.is_available():
        with pytest.raises(bdl.BackendError, match="finds no 'cuda' devices"):
            bdl.fit(bound, device="cuda:*", **options)


# -- VI: num_chains independent fits -------------------------------------------------------------
@bdl.model
def mean_model(y):
    mu = bdl.sample("mu", dist.Normal(0.0, 10.0))
    with bdl.plate("data", y.shape[0]) as idx:
        bdl.sample("y", dist.Normal(mu, 1.0), obs=y[idx])


Y = np.random.default_rng(0).normal(1.0, 1.0, size=200)


def _vi(backend, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return bdl.fit(
            mean_model(Y),
            backend=backend,
            method="vi",
            num_steps=300,
            lr=0.05,
            batch_size=20,
            num_samples=400,
            progress=False,
            **options,
        )


def test_vi_fits_run_as_chains(backend):
    """Three fits: the first is the one fit of the same seed (its losses and draws), the others
    start, draw noise and minibatches from their own seeds; each is a chain of the posterior
    (its draws from its own fitted guide), with its own losses, best step and guide; each
    fitted guide's mean is the exact posterior mean, n·ȳ/(n + 0.01), to within Adam's jitter
    at a constant lr (its steps move the mean by about lr each: 3 lr) and the Monte Carlo error
    of 400 draws."""
    one, three = _vi(backend), _vi(backend, num_chains=3)
    assert three.samples["mu"].shape == (3, 400) and three.losses.shape == (3, 300)
    np.testing.assert_array_equal(three.losses[0], one.losses)
    np.testing.assert_array_equal(three.samples["mu"][0], one.samples["mu"][0])
    assert not np.allclose(three.losses[1], three.losses[0])  # its own noise and minibatches
    assert len(three.guide) == 3 and len(three.settings["best_step"]) == 3
    assert three.settings["num_chains"] == 3
    exact, sd = Y.sum() / (len(Y) + 0.01), 1 / np.sqrt(len(Y) + 0.01)
    means = three.samples["mu"].mean(axis=1)
    assert np.all(np.abs(means - exact) < 3 * 0.05 + 4 * sd / np.sqrt(400)), means


def test_each_vi_fit_cuts_its_own_lr_on_its_plateau(backend):
    """schedule="plateau" with two fits: each fit's lr is cut where its own loss flattens (a
    per-fit scale of the run's rates), so the first fit cuts where the one fit of the same seed
    cuts and draws what it draws, and the second cuts at its own steps. (The fits start from
    prior draws, far apart, so that their losses flatten at different segments: from the prior
    median both flatten at the same ones.)"""
    options = dict(
        backend=backend,
        method="vi",
        num_steps=800,
        lr=0.05,
        batch_size=20,
        seed=0,
        init_loc="prior",
        num_samples=100,
        progress=False,
        schedule="plateau",
        plateau_patience=1,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        one = bdl.fit(mean_model(Y), **options)
        two = bdl.fit(mean_model(Y), num_chains=2, **options)
    first, second = two.settings["lr_cuts"]
    assert first == one.settings["lr_cuts"] and first and second and second != first
    np.testing.assert_array_equal(two.losses[0], one.losses)
    np.testing.assert_array_equal(two.samples["mu"][0], one.samples["mu"][0])


def test_several_vi_fits_save_and_load(tmp_path):
    three = _vi("numpyro", num_chains=2)
    back = bdl.load(three.save(tmp_path / "vi.nc"), model=mean_model(Y))
    assert back.losses.shape == (2, 300) and len(back.guide) == 2
    np.testing.assert_allclose(back.guide[1].phi, three.guide[1].phi)


@bdl.model
def with_param(y):
    mu = bdl.sample("mu", dist.Normal(0.0, 10.0))
    s = bdl.param("s", 1.0, constraint="positive")
    with bdl.plate("data", y.shape[0]) as idx:
        bdl.sample("y", dist.Normal(mu, s), obs=y[idx])


@pytest.mark.parametrize("num_chains", [0, 2.0, True])
def test_vi_num_chains_is_checked(num_chains):
    with pytest.raises(bdl.ConfigError, match="num_chains"):
        bdl.fit(mean_model(Y), method="vi", num_steps=10, num_chains=num_chains, progress=False)


def test_several_vi_fits_of_a_model_with_params_are_refused():
    with pytest.raises(bdl.ConfigError, match=r"bdl.param sites \['model.s'\]"):
        bdl.fit(with_param(Y), method="vi", num_steps=10, num_chains=2, progress=False)
