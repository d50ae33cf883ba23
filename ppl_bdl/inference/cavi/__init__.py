"""Coordinate-ascent variational inference for conditionally conjugate models."""
