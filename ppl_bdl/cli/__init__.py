"""The ``ppl-bdl`` command line and its demo."""
