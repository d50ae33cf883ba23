"""The README's example runs as written, and its commands are the ones CI runs."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def test_readme_example_runs(tmp_path, monkeypatch):
    text = (ROOT / "README.md").read_text()
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)
    post = namespace["post"]
    np.testing.assert_allclose(post.samples["w"].mean((0, 1)), [1.0, -2.0, 0.5], atol=0.1)
    assert (tmp_path / "linreg.nc").exists()


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "python -m pytest" in readme and "python -m pytest" in ci
    assert "pip install torch==2.13.0" in readme and "torch==2.13.0" in ci
    assert "ppl-bdl demo" in readme.split("\n\n")[2]
