"""What a compiled JAX loop runs per step, read off its program text (no clock): the guard of
``tests/test_loop_ops.py`` and ``benchmarks/step_ops.py``.

Example
-------
>>> from ppl_bdl.backends.numpyro.loop_ops import float_gates
>>> float_gates("%0 = stablehlo.select %a, %b, %c : tensor<i1>, tensor<4xf32>")
1
"""

from __future__ import annotations

import re

#: Instructions that run no kernel: parameters, constants, tuples and their elements, bitcasts.
_FREE = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast"}


def body_kernels(compiled_hlo: str) -> list[tuple[str, str]]:
    """The instructions XLA's CPU backend runs per iteration of a compiled program's step loop,
    as (opcode, result shape), free instructions left out: of the non-fusion computations that
    hold the most matrix products (the network's), the one with the fewest kernels (our CPU
    loop holds two copies of the step: the lean one between kept steps, which runs almost every
    step, and the whole one at a kept step). ``compiled_hlo`` is
    ``jax.jit(f).lower(...).compile().as_text()``."""
    bodies: dict[str, list[tuple[str, str]]] = {}
    name = None
    for line in compiled_hlo.splitlines():
        header = re.match(r"^(?:ENTRY )?%?([\w.\-]+) .*\{$", line)
        if header:
            name = header.group(1)
            bodies[name] = []
        elif name is not None and (op := re.search(r"=\s*(\S+)\s+([\w\-]+)\(", line)):
            bodies[name].append((op.group(2), op.group(1)))
    loops = [
        [(op, shape) for op, shape in ops if op not in _FREE]
        for name, ops in bodies.items()
        if "fus" not in name and not name.startswith("wrapped")
    ]
    most = max(sum(op == "dot" for op, _ in ops) for ops in loops)
    return min((ops for ops in loops if sum(op == "dot" for op, _ in ops) == most), key=len)


def float_gates(lowered_text: str) -> int:
    """Selects over floating-point arrays and conditionals in a lowered program
    (``jax.jit(f).lower(...).as_text()``): a per-step gate on the state is such a select."""
    selects = re.findall(r"stablehlo\.select[^\n]*", lowered_text)
    floats = sum(bool(re.search(r"tensor<\d[\dx]*xf\d+>", s.rsplit(",", 1)[-1])) for s in selects)
    return floats + len(re.findall(r"stablehlo\.(case|if)\b", lowered_text))
