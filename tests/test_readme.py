"""The README's example runs as written, and its commands are the ones CI runs."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import numpy as np

from ppl_bdl.posterior.diagnostics import ConvergenceWarning

ROOT = Path(__file__).resolve().parents[1]


def test_readme_example_runs(tmp_path, monkeypatch):
    text = (ROOT / "README.md").read_text()
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)  # a good fit: the checks find nothing
        exec(compile(code, "README.md", "exec"), namespace)
    post = namespace["post"]
    assert post.diagnostics == ()
    np.testing.assert_allclose(post.samples["w"].mean((0, 1)), [1.0, -2.0, 0.5], atol=0.1)
    assert (tmp_path / "linreg.nc").exists()


def _readme_commands() -> list[str]:
    """The command of each line of README.md's install block (its trailing comment dropped)."""
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"```bash\n(.*?)```", readme, re.S).group(1)
    return [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]


def test_ci_runs_the_readme_commands_verbatim():
    """.ci/run runs README's two commands as README gives them, each in a subshell (so a failing
    step of its && chain fails CI), in a clean virtual environment on a fresh copy of the tree."""
    commands = _readme_commands()
    assert commands == [
        'pip install torch==2.13.0 && pip install -e ".[all]" && ppl-bdl demo',
        'pip install -e ".[all,test]" && python -m pytest',
    ]
    ci = (ROOT / ".ci" / "run").read_text()
    ci_lines = [line.split("#")[0].strip() for line in ci.splitlines()]
    for command in commands:
        assert f"({command})" in ci_lines, command
    assert "git archive HEAD" in ci and "python -m venv" in ci and "unset PPL_BDL_DATA" in ci
