"""Checks of ``fit``'s arguments shared by its methods (kept apart to keep :mod:`ppl_bdl.run.fit`
small).

Example
-------
>>> from ppl_bdl.run.fit_checks import chain_ids_to_run
>>> chain_ids_to_run(None, 3), chain_ids_to_run([2, 0], 3)
([0, 1, 2], [2, 0])
"""

from __future__ import annotations

from typing import Any

from ppl_bdl.errors import ConfigError


def positive_int(name: str, value: Any, minimum: int = 1) -> int:
    """``value`` if it is an int >= ``minimum`` (not a bool), else a ConfigError naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{name} must be an int >= {minimum}, got {value!r}.")
    return value


def chain_ids_to_run(chain_ids, num_chains: int) -> list[int]:
    """The chains to run: all of them, or a checked subset (distinct, in range)."""
    if chain_ids is None:
        return list(range(num_chains))
    ids = list(chain_ids) if isinstance(chain_ids, list | tuple | range) else None
    if (
        not ids
        or any(
            isinstance(c, bool) or not isinstance(c, int) or not 0 <= c < num_chains for c in ids
        )
        or len(set(ids)) != len(ids)
    ):
        raise ConfigError(
            f"chain_ids must be a non-empty list of distinct chain (ensemble: member) numbers in "
            f"[0, {num_chains}), got {chain_ids!r}."
        )
    return ids
