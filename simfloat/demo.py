"""`simfloat demo`: one value rounded in every format and mode, and one dot product under several
accumulation models. A quick look at what the core does."""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from simfloat.accumulate import BlockFMA, Sequential, dot, tensor_core
from simfloat.formats import formats
from simfloat.rounding import RoundingMode, round

__all__ = ["run_demo"]


def _rounding_table(x: float) -> list[str]:
    modes = [m for m in RoundingMode if m != RoundingMode.STOCHASTIC]
    head = f"{'format':<16}" + "".join(f"{m.name.lower():>16}" for m in modes)
    lines = [f"{x!r} rounded into every format and mode", head, "-" * len(head)]
    for name, fmt in formats().items():
        vals = [float(round(np.array(x), fmt, m)[()]) for m in modes]
        lines.append(f"{name:<16}" + "".join(f"{v:>16.9g}" for v in vals))
    return lines


def _dot_table(k: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    a = round(rng.standard_normal(k), "bf16")
    b = round(rng.standard_normal(k), "bf16")
    exact = sum((Fraction(float(x)) * Fraction(float(y)) for x, y in zip(a, b, strict=True)), Fraction(0))
    models: dict[str, Sequential | BlockFMA] = {
        "sequential fp32 (FMA loop)": Sequential("fp32"),
        "sequential bf16": Sequential("bf16"),
        "tensor core sm80 (8, F=24)": tensor_core("sm80", "bf16"),
        "tensor core sm90 (16, F=25)": tensor_core("sm90", "bf16"),
    }
    lines = [
        f"dot product of {k} bf16 x bf16 products (seed {seed}); exact value {float(exact):.12g}",
        f"{'accumulation':<30}{'result':>20}{'abs error':>14}{'rel error':>12}",
    ]
    for label, model in models.items():
        r = dot(a, b, acc=model)
        err = abs(Fraction(r) - exact)
        lines.append(f"{label:<30}{r:>20.12g}{float(err):>14.3e}{float(err / abs(exact)):>12.2e}")
    return lines


def run_demo(value: float = 0.1, k: int = 4096, seed: int = 0) -> str:
    """The demo's text (rounding table, then the dot-product table)."""
    return "\n".join(_rounding_table(value) + [""] + _dot_table(k, seed))
