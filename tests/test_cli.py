"""The ``ppl-bdl`` command line: info, fit (npz / csv / json data), demo, and its errors."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

import ppl_bdl as bdl
from ppl_bdl import cli
from ppl_bdl.models.regression import make_regression_data

FIT_SMALL = [
    "--num-warmup",
    "30",
    "--num-samples",
    "20",
    "--num-chains",
    "2",
    "--max-tree-depth",
    "4",
]


def test_info_lists_backends_kernels_and_versions(capsys):
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    for name in bdl.backends.available():
        assert name in out
    assert "nuts" in out and "arviz" in out


def test_read_data_formats(tmp_path):
    X, y = make_regression_data(n=6, d=2)
    np.savez(tmp_path / "d.npz", X=X, y=y, K=np.array(3))
    (tmp_path / "d.json").write_text(json.dumps({"X": X.tolist(), "y": y.tolist(), "K": 3}))
    lines = ["X[0],X[1],y"] + [f"{a},{b},{c}" for (a, b), c in zip(X, y, strict=True)]
    (tmp_path / "d.csv").write_text("\n".join(lines) + "\n")
    for suffix in ("npz", "json", "csv"):
        data = cli.read_data(tmp_path / f"d.{suffix}")
        np.testing.assert_allclose(data["X"], X)
        np.testing.assert_allclose(data["y"], y)
        if suffix != "csv":
            assert data["K"] == 3 and isinstance(data["K"], int)


def test_read_data_errors(tmp_path):
    with pytest.raises(bdl.DataError, match="no file"):
        cli.read_data(tmp_path / "missing.csv")
    (tmp_path / "d.txt").write_text("1")
    with pytest.raises(bdl.DataError, match="unsupported"):
        cli.read_data(tmp_path / "d.txt")
    (tmp_path / "gap.csv").write_text("X.0,X.2\n1,2\n")
    with pytest.raises(bdl.DataError, match="numbered"):
        cli.read_data(tmp_path / "gap.csv")


def test_fit_writes_netcdf(tmp_path, backend, capsys):
    X, y = make_regression_data(n=30, d=2)
    np.savez(tmp_path / "d.npz", X=X, y=y)
    out = tmp_path / "post.nc"
    code = cli.main(
        ["fit", "ppl_bdl.models.regression:linear_regression", "--data", str(tmp_path / "d.npz"),
         "--backend", backend, *FIT_SMALL, "--out", str(out)]
    )  # fmt: skip
    assert code == 0
    printed = capsys.readouterr().out
    assert "r_hat" in printed and "w[0]" in printed
    post = bdl.load(out)
    assert post.samples["w"].shape == (2, 20, 2)
    assert post.log_likelihood["y"].shape == (2, 20, 30)


def test_fit_model_from_a_file(tmp_path, capsys):
    (tmp_path / "my_model.py").write_text(
        "import ppl_bdl as bdl\nfrom ppl_bdl import dist\n\n"
        "@bdl.model\ndef mean_model(y):\n"
        "    mu = bdl.sample('mu', dist.Normal(0.0, 10.0))\n"
        "    with bdl.plate('data', y.shape[0]) as idx:\n"
        "        bdl.sample('y', dist.Normal(mu, 1.0), obs=y[idx])\n"
    )
    (tmp_path / "d.json").write_text(json.dumps({"y": [0.9, 1.1, 1.3]}))
    backend = bdl.backends.available()[0]
    code = cli.main(
        ["fit", f"{tmp_path / 'my_model.py'}:mean_model", "--data", str(tmp_path / "d.json"),
         "--backend", backend, *FIT_SMALL, "--out", str(tmp_path / "m.nc")]
    )  # fmt: skip
    assert code == 0 and (tmp_path / "m.nc").is_file()


@pytest.mark.parametrize(
    "target, data, message",
    [
        ("ppl_bdl.models.regression:nope", {"X": [[1.0]], "y": [1.0]}, "its models"),
        ("ppl_bdl.models.regression", {"X": [[1.0]], "y": [1.0]}, "MODULE:MODEL"),
        ("ppl_bdl.models.posteriordb:kidiq", {"X": [[1.0]], "y": [1.0]}, "does not take"),
        ("ppl_bdl.models.regression:linear_regression", {"y": [1.0]}, "lacks"),
        ("ppl_bdl.models.regression:make_sine_data", {"n": 3}, "not a model"),
    ],
)
def test_fit_errors_are_clear(tmp_path, capsys, target, data, message):
    (tmp_path / "d.json").write_text(json.dumps(data))
    code = cli.main(["fit", target, "--data", str(tmp_path / "d.json")])
    assert code == 2
    assert message in capsys.readouterr().err


def test_fit_unknown_backend_and_method(tmp_path, capsys):
    X, y = make_regression_data(n=5, d=1)
    np.savez(tmp_path / "d.npz", X=X, y=y)
    args = ["fit", "ppl_bdl.models.regression:linear_regression", "--data", str(tmp_path / "d.npz")]
    assert cli.main([*args, "--backend", "tensorflow"]) == 2
    assert "installed" in capsys.readouterr().err
    assert cli.main([*args, "--method", "gibbs"]) == 2
    assert "nuts" in capsys.readouterr().err


def test_demo_quick_writes_results(tmp_path, capsys):
    # The fastest installed backend for a quick demo run (pyro has no compile step).
    backend = "pyro" if "pyro" in bdl.backends.available() else bdl.backends.available()[0]
    out = tmp_path / "demo"
    assert cli.main(["demo", "--quick", "--backends", backend, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "RMSE" in printed and "R-hat" in printed and str(out) in printed
    for name in ("bnn_regression.nc", "eight_schools.nc", "eight_schools_trace.png",
                 "eight_schools_forest.png", "bnn_predictive.png"):  # fmt: skip
        assert (out / f"{backend}_{name}").stat().st_size > 0, name
    post = bdl.load(out / f"{backend}_eight_schools.nc")
    assert post.samples["theta"].shape[-1] == 8


@pytest.mark.slow
def test_demo_console_script_on_every_backend(tmp_path):
    exe = shutil.which("ppl-bdl")
    cmd = [exe] if exe else [sys.executable, "-m", "ppl_bdl.cli"]
    out = tmp_path / "demo"
    run = subprocess.run([*cmd, "demo", "--out", str(out)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    for backend in bdl.backends.available():
        assert (out / f"{backend}_eight_schools.nc").is_file()
        assert f"=== backend: {backend} ===" in run.stdout
