"""The docs' inference examples run as written on the shipped models (their settings work)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _first_block(page: str) -> str:
    return re.search(r"```python\n(.*?)```", (ROOT / "docs" / page).read_text(), re.S).group(1)


@pytest.mark.slow  # ~15 s; the default suite runs the same settings in test_step_size.py
def test_sgmcmc_page_example_runs_as_written():
    namespace: dict = {}
    exec(compile(_first_block("sgmcmc.md"), "docs/sgmcmc.md", "exec"), namespace)
    post, model, X, y = (namespace[k] for k in ("post", "model", "X", "y"))
    assert post.samples["net.0.weight"].shape == (4, 500, 1, 20)
    assert post.predict(model(X)).rmse(y) < 0.5 * y.std()


@pytest.mark.slow  # ~30 s: 10,000 steps on Pyro
def test_vi_page_example_runs_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(_first_block("vi.md"), "docs/vi.md", "exec"), namespace)
    post, back, model, X, y = (namespace[k] for k in ("post", "back", "model", "X", "y"))
    assert post.losses.shape == (10_000,) and back.guide.name == "lowrank"
    assert post.predict(model(X)).rmse(y) < 0.5 * y.std()
