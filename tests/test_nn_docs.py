"""docs/nn.md's examples run as written, in order, and print what the page says they print."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # ~40 s: five fits on both backends; the same code runs by default in test_nn_*
@pytest.mark.filterwarnings("ignore:could not trace")
def test_nn_docs_examples_run(capsys):
    text = (ROOT / "docs" / "nn.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) == 7
    namespace: dict = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        for i, code in enumerate(blocks):
            exec(compile(code, f"docs/nn.md block {i}", "exec"), namespace)
    out = capsys.readouterr().out
    assert "'cnn.conv.weight': (6, 1, 3, 3)" in out
    accuracy = float(re.search(r"accuracy ([0-9.]+)", out).group(1))
    assert accuracy > 0.8
    assert "(5, 3)" in out and "scale=0.272166" in out
    assert "['net.layers.1.bias', 'net.layers.1.weight']" in out
    assert "(1, 2, 64, 64, 3, 3)" in out
    scores = namespace["scores"]  # LeNet-5's cSGHMC fit on the stroke images (4 classes)
    assert scores["accuracy"] > 0.6 and np.isfinite(scores["nll"]) and 0 <= scores["ece"] < 0.3
    probs = namespace["post"]  # the last fit: ResNet-20 on Pyro
    assert np.all(np.isfinite(probs.samples["resnet20.fc.weight"]))
