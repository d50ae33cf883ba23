"""Shared fixtures: a backend fixture over every installed backend."""

from __future__ import annotations

import pytest

import ppl_bdl as bdl

BACKENDS = bdl.backends.available()


@pytest.fixture(params=BACKENDS)
def backend(request) -> str:
    return request.param
