"""Variational inference: guides (``guides/``), objectives, the VI run and its monitor, natural-gradient
mean-field VI (VOGN) and the Pareto k̂ check."""
