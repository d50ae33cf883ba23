"""What one step of our compiled SG-MCMC loop runs, against the hand-written loop's step: a
profile without a clock, per network size.

XLA's CPU backend runs a loop body's instructions one after another, each a kernel (a fusion, a
matrix product, a copy); at a toy network's size each costs about a microsecond and a step a few
dozen, so their number is the per-step cost that the matrix products of a big network hide.
For each size this lists the kernels of ours (the loop ``bdl.fit`` runs, SGLD, as compiled for
the CPU) and of the hand-written ``jit(lax.scan)`` of the same update (benchmarks/anchors.py),
and the selects over float arrays or conditionals in each (a per-step gate on the state would be
one; a ReLU's or a softmax's gradient has some of its own, so compare ours with the hand-written
loop's, not with zero).

Usage::

    python benchmarks/step_ops.py                      # every size, counts
    python benchmarks/step_ops.py --sizes 8-50-1 --list  # and the kernels themselves
"""

from __future__ import annotations

import argparse
from collections import Counter

import anchors

from ppl_bdl.backends.numpyro.loop_ops import body_kernels, float_gates

STEPS = 50


def programs(name: str):
    """Ours and the hand-written SGLD loop at size ``name``, lowered."""
    size = anchors.SIZES[name]
    data = anchors.make_data(size)
    ours = anchors.ours_loop(
        "numpyro", "sgld", anchors.model(size)(*data), size.batch, size.sgld_step
    )
    return ours.lower(STEPS), anchors.make_jax(size, "sgld", data).lower(STEPS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=",".join(anchors.SIZES))
    parser.add_argument("--list", action="store_true", help="list each body's kernels")
    args = parser.parse_args()
    print(f"{'size':>17s}  kernels per step: ours  hand  (extra)   float selects: ours  hand")
    for name in args.sizes.split(","):
        ours, hand = programs(name)
        k_ours = body_kernels(ours.compile().as_text())
        k_hand = body_kernels(hand.compile().as_text())
        g_ours, g_hand = float_gates(ours.as_text()), float_gates(hand.as_text())
        print(
            f"{name:>17s}  {len(k_ours):22d} {len(k_hand):5d}  ({len(k_ours) - len(k_hand):+d})"
            f"   {g_ours:19d} {g_hand:5d}"
        )
        if args.list:
            for label, kernels in (("ours", k_ours), ("hand", k_hand)):
                counts = Counter(f"{op} {shape}" for op, shape in kernels)
                print(f"    {label}: " + ", ".join(f"{k} x{v}" for k, v in counts.most_common()))


if __name__ == "__main__":
    main()
