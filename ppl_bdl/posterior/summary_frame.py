"""The frame :meth:`Posterior.summary` returns: ArviZ's summary table that shows its note and the
fit's diagnostics report whenever it is displayed.

:class:`SummaryFrame` is a :class:`pandas.DataFrame` in every way (indexing, arithmetic, ``to_csv``,
``to_string``; a frame derived from it is a plain DataFrame); only its ``repr`` (the REPL,
``print``) and its HTML form (Jupyter) add, below the table, ``attrs["note"]`` when there is one
and ``attrs["diagnostics"]``: the report ``fit`` warned with, so that a summary read later still
says what is off. pandas is imported when the first summary is made (``import ppl_bdl`` stays
light), so the class is built then; ``ppl_bdl.posterior.summary_frame.SummaryFrame`` names it (pickling
included).

Example
-------
>>> import pandas as pd
>>> frame = pd.DataFrame({"mean": [1.0]}, index=["mu"])
>>> frame.attrs["diagnostics"] = "Diagnostics: no problems found."
>>> shown = summary_frame(frame)
>>> isinstance(shown, pd.DataFrame), type(shown[["mean"]]) is pd.DataFrame
(True, True)
>>> print(shown)
    mean
mu   1.0
<BLANKLINE>
Diagnostics: no problems found.
"""

from __future__ import annotations

import functools
import html
from typing import Any


def summary_frame(frame: Any) -> Any:
    """``frame`` (a DataFrame; anything else, e.g. ArviZ's ``fmt="xarray"``, as it is) as a
    :class:`SummaryFrame`, its ``attrs`` kept."""
    import pandas as pd

    if type(frame) is not pd.DataFrame:
        return frame
    shown = _summary_class()(frame)
    shown.attrs.update(frame.attrs)
    return shown


def _footer(attrs: dict) -> str:
    """The note (when there is one) and the diagnostics report, as shown under the table."""
    return "\n".join(str(attrs[k]) for k in ("note", "diagnostics") if attrs.get(k))


@functools.cache
def _summary_class():
    import pandas as pd

    class SummaryFrame(pd.DataFrame):
        """A DataFrame whose display adds ``attrs["note"]`` and ``attrs["diagnostics"]``."""

        @property
        def _constructor(self):
            return pd.DataFrame  # a frame derived from a summary is a plain one

        def __repr__(self) -> str:
            footer = _footer(self.attrs)
            table = super().__repr__()
            return f"{table}\n\n{footer}" if footer else table

        def _repr_html_(self) -> str | None:
            table = super()._repr_html_()
            footer = _footer(self.attrs)
            if table is None or not footer:
                return table
            return f"{table}<pre>{html.escape(footer)}</pre>"

    SummaryFrame.__module__, SummaryFrame.__qualname__ = __name__, "SummaryFrame"
    return SummaryFrame


def __getattr__(name: str):
    """``SummaryFrame`` is built on first use (it needs pandas)."""
    if name == "SummaryFrame":
        return _summary_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
