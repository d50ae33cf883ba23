"""The ``ppl-bdl`` command line: info, fit (npz / csv / json data, its flags, --force, --strict,
the progress bar, the diagnostics report), demo, and its errors."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import ppl_bdl as bdl
from ppl_bdl.cli import data as cli_data
from ppl_bdl.cli import main as cli
from ppl_bdl.models.regression import make_regression_data
from ppl_bdl.posterior.diagnostics import ConvergenceError, Diagnostics, Finding

#: The example data file docs/cli.md shows (columns X.0, X.1, y for linear_regression).
EXAMPLE_CSV = Path(__file__).resolve().parents[1] / "docs" / "examples" / "regression.csv"
LINEAR = "ppl_bdl.models.regression:linear_regression"

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
        data = cli_data.read_data(tmp_path / f"d.{suffix}")
        np.testing.assert_allclose(data["X"], X)
        np.testing.assert_allclose(data["y"], y)
        if suffix != "csv":
            assert data["K"] == 3 and isinstance(data["K"], int)


def test_read_data_errors(tmp_path):
    with pytest.raises(bdl.DataError, match="no file"):
        cli_data.read_data(tmp_path / "missing.csv")
    (tmp_path / "d.txt").write_text("1")
    with pytest.raises(bdl.DataError, match="unsupported"):
        cli_data.read_data(tmp_path / "d.txt")
    (tmp_path / "gap.csv").write_text("X.0,X.2\n1,2\n")
    with pytest.raises(bdl.DataError, match="numbered"):
        cli_data.read_data(tmp_path / "gap.csv")


def test_fit_writes_netcdf(tmp_path, backend, capsys):
    X, y = make_regression_data(n=30, d=2)
    np.savez(tmp_path / "d.npz", X=X, y=y)
    out = tmp_path / "post.nc"
    code = cli.main(
        [
            "fit",
            "ppl_bdl.models.regression:linear_regression",
            "--data",
            str(tmp_path / "d.npz"),
            "--backend",
            backend,
            *FIT_SMALL,
            "--out",
            str(out),
        ]
    )
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
        [
            "fit",
            f"{tmp_path / 'my_model.py'}:mean_model",
            "--data",
            str(tmp_path / "d.json"),
            "--backend",
            backend,
            *FIT_SMALL,
            "--out",
            str(tmp_path / "m.nc"),
        ]
    )
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


# -- fit's flags, checked before the backend is imported ------------------------------------------
NOT_APPLYING = [
    # (flags, words the error names: the option, the method, what applies or what to do)
    (["--method", "nuts", "--guide", "flow"], ["--guide", "nuts", "vi", "--max-tree-depth"]),
    (["--method", "sgld", "--num-steps", "5"], ["--num-steps", "sgld", "--num-warmup", "hmc, vi"]),
    (["--method", "sghmc", "--lr", "0.1"], ["--lr", "sghmc", "step_size"]),
    (["--method", "vi", "--num-warmup", "2"], ["--num-warmup", "vi", "num_steps"]),
    (["--method", "hmc", "--max-tree-depth", "3"], ["--max-tree-depth", "hmc", "num_steps"]),
    (["--method", "vi", "--option", "foo=1"], ["--option foo", "vi", "--guide"]),
    (["--method", "sgld", "--option", "num_steps=5"], ["--option num_steps", "--num-steps"]),
    (["--method", "vi", "--guide", "flow", "--rank", "2"], ["rank", "flow", "hidden"]),
    (["--method", "vi", "--guide", "nope"], ["guide", "'nope'", "meanfield", "flow"]),
    (["--method", "csgld", "--schedule", "constant"], ["schedule", "csgld", "cyclical"]),
    (["--method", "vi", "--objective", "kl"], ["objective", "elbo"]),
    (["--method", "nuts", "--step-size", "auto"], ["step_size='auto'", "NUTS", "warmup"]),
    (["--method", "vi", "--init", "uniform"], ["--init", "vi", "init_loc"]),
    (["--method", "vi", "--option", "num_samples=3"], ["--num-samples"]),
    (["--method", "vi", "--num-steps", "3", "--option", "num_steps=4"], ["once"]),
    (["--method", "gibbs"], ["gibbs", "nuts", "sgld", "vi"]),
]


def test_flags_that_do_not_apply_fail_before_the_backend_is_imported(tmp_path):
    # A fresh interpreter: this test session has imported jax and torch long ago.
    (tmp_path / "d.json").write_text(json.dumps({"X": [[1.0, 2.0]], "y": [1.0]}))
    script = textwrap.dedent(f"""
        import contextlib, io, json, sys
        from ppl_bdl.cli import main as cli
        results = []
        for flags in {[flags for flags, _ in NOT_APPLYING]!r}:
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                code = cli.main(["fit", {LINEAR!r}, "--data", {str(tmp_path / "d.json")!r}, *flags])
            results.append((code, err.getvalue()))
        heavy = [m for m in ("jax", "torch", "numpyro", "pyro") if m in sys.modules]
        print(json.dumps({{"results": results, "heavy": heavy}}))
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert report["heavy"] == []
    for (flags, words), (code, err) in zip(NOT_APPLYING, report["results"], strict=True):
        assert code == 2, (flags, err)
        for word in words:
            assert word in err, (flags, word, err)


def test_numbers_are_checked_by_the_method(capsys):
    cases = (
        ["--method", "vi", "--num-steps", "0"],
        ["--target-accept", "1.5"],
        ["--method", "vi", "--lr", "-1"],
    )
    for flags in cases:
        assert cli.main(["fit", LINEAR, "--data", "d.csv", *flags]) == 2
        err = capsys.readouterr().err
        assert flags[-2].lstrip("-").replace("-", "_") in err and flags[-1] in err, err


class FakeFit:
    """Stands in for ``bdl.fit``: records its keywords and returns a posterior-like stub with the
    given findings (or raises them as ``strict=True`` does)."""

    def __init__(self, findings=()):
        self.calls, self.findings = [], Diagnostics(findings)

    def __call__(self, bound, **kwargs):
        self.calls.append(kwargs)
        if kwargs["strict"] and self.findings:
            raise ConvergenceError("checks failed", findings=self.findings)
        return SimpleNamespace(
            summary=lambda: "SUMMARY",
            sample_stats={},
            diagnostics=self.findings,
            save=lambda path: Path(path).write_text("netcdf"),
        )


@pytest.fixture
def fake_fit(monkeypatch):
    fake = FakeFit()
    monkeypatch.setattr(bdl, "fit", fake)
    return fake


def test_the_issues_command_runs_as_written(tmp_path, monkeypatch, fake_fit, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mymodels.py").write_text(
        "from ppl_bdl.models.bnn import make_bnn_regression\n\nbnn = make_bnn_regression()\n"
    )
    X, y = make_regression_data(n=10, d=1)
    np.savez(tmp_path / "d.npz", X=X, y=y)
    (tmp_path / "fit.nc").write_text("an earlier fit")
    argv = (
        "fit mymodels.py:bnn --data d.npz --method vi --num-steps 20000 --guide flow "
        "--out fit.nc --force"
    ).split()
    assert cli.main(argv) == 0
    (call,) = fake_fit.calls
    assert call["method"] == bdl.VI(num_steps=20000, guide="flow")
    assert call["progress"] is None and call["strict"] is False  # fit's defaults decide
    assert call["backend"] in bdl.backends.available()
    assert (tmp_path / "fit.nc").read_text() == "netcdf"
    assert str(tmp_path / "fit.nc") in capsys.readouterr().out


@pytest.mark.parametrize(
    "flags, expected",
    [
        (
            [
                "--method",
                "vi",
                "--lr",
                "0.001",
                "--schedule",
                "cosine",
                "--batch-size",
                "8",
                "--objective",
                "iwae",
                "--num-particles",
                "4",
                "--init-loc",
                "prior",
                "--no-progress",
            ],
            dict(
                lr=0.001,
                schedule="cosine",
                batch_size=8,
                objective="iwae",
                num_particles=4,
                init_loc="prior",
                progress=False,
            ),
        ),
        (
            [
                "--method",
                "sgld",
                "--step-size",
                "1e-4",
                "--batch-size",
                "5",
                "--schedule",
                "polynomial",
                "--thinning",
                "2",
                "--init",
                '{"sigma": 1.0}',
                "--progress",
                "--temperature",
                "0.5",
                "--strict",
            ],
            dict(
                step_size=1e-4,
                batch_size=5,
                schedule="polynomial",
                thinning=2,
                init={"sigma": 1.0},
                progress=True,
                temperature=0.5,
                strict=True,
            ),
        ),
        (
            [
                "--method",
                "nuts",
                "--target-accept",
                "0.9",
                "--max-tree-depth",
                "6",
                "--dense-mass",
                "--num-warmup",
                "50",
                "--num-chains",
                "2",
                "--chain-method",
                "vectorized",
            ],
            dict(
                target_accept=0.9,
                max_tree_depth=6,
                dense_mass=True,
                num_warmup=50,
                num_chains=2,
                chain_method="vectorized",
            ),
        ),
        (
            ["--method", "hmc", "--num-steps", "7", "--step-size", "0.1"],
            dict(num_steps=7, step_size=0.1),
        ),
    ],
)
def test_flags_reach_fit(tmp_path, fake_fit, flags, expected):
    out = tmp_path / "post.nc"
    assert cli.main(["fit", LINEAR, "--data", str(EXAMPLE_CSV), *flags, "--out", str(out)]) == 0
    (call,) = fake_fit.calls
    method = call["method"]
    fields = {k: v for k, v in expected.items() if k not in ("progress", "strict")}
    # a flag left out keeps the method's default: the object is the one built from the flags
    assert method == type(method)(**fields)
    assert {k: call[k] for k in ("progress", "strict") if k in expected} == {
        k: v for k, v in expected.items() if k in ("progress", "strict")
    }


def test_out_is_not_overwritten_without_force(tmp_path, fake_fit, capsys):
    out = tmp_path / "post.nc"
    out.write_text("an earlier fit")
    args = ["fit", LINEAR, "--data", str(EXAMPLE_CSV), "--out", str(out)]
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert str(out) in err and "--force" in err
    assert fake_fit.calls == [] and out.read_text() == "an earlier fit"  # checked before the fit
    assert cli.main([*args, "--force"]) == 0
    assert out.read_text() == "netcdf"


def test_demo_does_not_overwrite_an_earlier_demo(tmp_path, capsys, monkeypatch):
    backend = bdl.backends.available()[0]
    (tmp_path / f"{backend}_eight_schools.nc").write_text("an earlier demo")
    ran = []
    monkeypatch.setattr("ppl_bdl.cli.demo.run_demo", lambda *a, **k: ran.append(a))
    assert cli.main(["demo", "--out", str(tmp_path), "--backends", backend]) == 2
    err = capsys.readouterr().err
    assert f"{backend}_eight_schools.nc" in err and "--force" in err and not ran
    assert cli.main(["demo", "--out", str(tmp_path), "--backends", backend, "--force"]) == 0
    assert ran


FINDING = Finding("rhat", ("w", "b"), 1.5, 1.01, "run more warmup and samples")


def test_diagnostics_are_reported_after_the_fit(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bdl, "fit", FakeFit([FINDING]))
    args = ["fit", LINEAR, "--data", str(EXAMPLE_CSV), "--out", str(tmp_path / "p.nc")]
    assert cli.main(args) == 0
    captured = capsys.readouterr()
    assert "SUMMARY" in captured.out and "warning" in captured.err
    assert FINDING.message in captured.err and FINDING.message not in captured.out
    assert cli.main([*args[:-2], "--out", str(tmp_path / "q.nc"), "--strict"]) == 1
    assert FINDING.message in capsys.readouterr().err
    assert not (tmp_path / "q.nc").exists()
    monkeypatch.setattr(bdl, "fit", FakeFit())  # a clean fit: nothing said
    assert cli.main([*args[:-2], "--out", str(tmp_path / "r.nc")]) == 0
    assert "warning" not in capsys.readouterr().err


def test_a_short_sgld_run_warns_and_strict_fails(tmp_path, backend, monkeypatch, capsys):
    # The issue's run: too few SG-MCMC steps exited 0 without a word. On a terminal (faked) the
    # progress bar is on without --progress.
    monkeypatch.delenv("CI", raising=False)
    args = [
        "fit",
        LINEAR,
        "--data",
        str(EXAMPLE_CSV),
        "--backend",
        backend,
        "--method",
        "sgld",
        "--num-warmup",
        "10",
        "--num-samples",
        "20",
        "--num-chains",
        "2",
        "--step-size",
        "1e-6",
    ]
    capsys.readouterr()
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert cli.main([*args, "--out", str(tmp_path / "post.nc")]) == 0
    captured = capsys.readouterr()
    assert "sgld:" in captured.err and "step/s]" in captured.err  # tqdm's bar
    assert "R-hat" in captured.err and "ESS" in captured.err and "warning" in captured.err
    assert bdl.load(tmp_path / "post.nc").samples["w"].shape == (2, 20, 2)
    assert cli.main([*args, "--out", str(tmp_path / "strict.nc"), "--strict", "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "--strict" in err and "R-hat" in err and not (tmp_path / "strict.nc").exists()
    assert "step/s]" not in err  # --no-progress wins over the terminal


def test_the_example_data_file_reads_as_documented():
    data = cli_data.read_data(EXAMPLE_CSV)
    assert data["X"].shape == (40, 2) and data["y"].shape == (40,)
    assert str(EXAMPLE_CSV.relative_to(EXAMPLE_CSV.parents[2])) in DOCS.read_text()


DOCS = Path(__file__).resolve().parents[1] / "docs" / "cli.md"


def test_every_flag_is_documented():
    parser = cli.build_parser()
    # the method flags are documented in the generated option tables (docs/methods.md)
    text = DOCS.read_text() + (DOCS.parent / "methods.md").read_text()
    for command, sub in parser._subparsers._group_actions[0].choices.items():
        for action in sub._actions:
            for option in action.option_strings:
                option = option.replace("--no-", "--")  # a switch's negation: the switch
                if option not in ("-h", "--help"):
                    assert f"`{option}" in text or f"{option}`" in text, (command, option)


def test_demo_quick_writes_results(tmp_path, capsys):
    # The fastest installed backend for a quick demo run (pyro has no compile step).
    backend = "pyro" if "pyro" in bdl.backends.available() else bdl.backends.available()[0]
    out = tmp_path / "demo"
    assert cli.main(["demo", "--quick", "--backends", backend, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "RMSE" in printed and "R-hat" in printed and str(out) in printed
    for name in (
        "bnn_regression.nc",
        "eight_schools.nc",
        "eight_schools_trace.png",
        "eight_schools_forest.png",
        "bnn_predictive.png",
    ):
        assert (out / f"{backend}_{name}").stat().st_size > 0, name
    post = bdl.load(out / f"{backend}_eight_schools.nc")
    assert post.samples["theta"].shape[-1] == 8
    # Each fit's diagnostics report is echoed in its own words (the saved posterior keeps it).
    for name in ("bnn_regression", "eight_schools"):
        saved = bdl.load(out / f"{backend}_{name}.nc")
        report = saved.diagnostics.report()
        assert f"diagnostics of the {saved.method} fit:\n{report}" in printed, (name, report)


@pytest.mark.slow
def test_demo_console_script_on_every_backend(tmp_path):
    exe = shutil.which("ppl-bdl")
    cmd = [exe] if exe else [sys.executable, "-m", "ppl_bdl.cli.main"]
    out = tmp_path / "demo"
    run = subprocess.run([*cmd, "demo", "--out", str(out)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    for backend in bdl.backends.available():
        assert (out / f"{backend}_eight_schools.nc").is_file()
        assert f"=== backend: {backend} ===" in run.stdout
