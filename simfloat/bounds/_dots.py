"""What an accumulation model does to a dot product's terms (B3): its chains and absolute terms."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import cast

import numpy as np

from simfloat.accumulate import BlockFMA, Chunked, Model, Sequential
from simfloat.bounds._chains import Rounding, _Chain, rounding
from simfloat.formats import FloatFormat


@dataclass
class _Dot:
    """What a dot model does to its terms: the chain every product goes through, the chain of the incoming
    accumulator, the number of roundings (each an absolute ``eta``) and the absolute alignment term."""

    term: _Chain
    acc: _Chain
    abs_steps: float  # sum of the absolute terms of one full dot: eta per rounding
    align: float  # coefficient of (max|a| + max|b|) + 2^(2 emin) per block (subnormal operands, B3)
    align_const: float
    out: Rounding
    inputs: Rounding | None = None
    extra: dict = field(default_factory=dict)


def _block_rounding(m: BlockFMA) -> tuple[tuple[float, bool], Rounding]:
    out = rounding(m.out_fmt, m.out_mode)
    t = (m.block + 1) * 2.0 ** (-m.fraction_bits)  # (B3): (block + 1) truncated terms below 2^(E - F)
    return (((1 + t) * (1 + out.u) - 1), False), out


def _inner(model: Sequential | BlockFMA, n: int) -> _Dot:
    if isinstance(model, Sequential):
        acc = rounding(model.fmt, model.mode)
        term = _Chain().add(n, acc)
        abs_steps = n * acc.eta
        if model.product_fmt is not None:
            prod = rounding(model.product_fmt, model.mode)
            term.add(1, prod)
            abs_steps += n * prod.eta
        inputs = rounding(model.input_fmt, model.input_mode) if model.input_fmt is not None else None
        return _Dot(term, _Chain().add(n, acc), abs_steps, 0.0, 0.0, acc, inputs, {"n": n})
    steps = -(-n // model.block)
    step, out = _block_rounding(model)
    inputs = rounding(model.input_fmt, model.input_mode) if model.input_fmt is not None else None
    align = align_const = 0.0
    if model.align == "exponent_sum" and model.operand_emin is not None:
        # (B3): a subnormal operand counts with 2^emin, so 2^E <= (|a| + 2^emin)(|b| + 2^emin)
        e = 2.0**model.operand_emin
        tr = (model.block + 1) * 2.0 ** (-model.fraction_bits)
        align, align_const = steps * tr * e, steps * tr * e * e
    return _Dot(
        _Chain().add(steps, step), _Chain().add(steps, step), steps * out.eta, align, align_const, out, inputs, {"n": n}
    )


def _dot(model: Model, n: int) -> _Dot:
    if isinstance(model, Chunked):
        size = model.chunk if model.chunk is not None else max(1, -(-n // int(model.splits or 1)))
        size = min(size, max(n, 1))
        chunks = -(-n // size)
        d = _inner(model.inner, size)
        outer = rounding(model.outer_fmt, model.outer_mode)
        d.align *= chunks
        d.align_const *= chunks
        d.abs_steps = d.abs_steps * chunks + chunks * outer.eta
        d.term.add(chunks, outer)
        d.acc = _Chain().add(chunks, outer)
        d.out = outer
        return d
    return _inner(model, n)


def dot_constant(model: Model, n: int, *, lam: float | None = None) -> float:
    """The relative constant of an accumulation model: ``|dot_hat - dot| <= C sum |a_k b_k|`` (+ absolute
    underflow terms) for n terms from zero, operands already in the input format (B3); with ``lam`` the
    probabilistic constant (B4, round-to-nearest chains only)."""
    d = _dot(model, n)
    if d.inputs is not None:
        d.term.add(2, d.inputs)
    return float(d.term.bounds(lam)[0]) - 1.0


def _with_inputs(d: _Dot) -> _Chain:
    c = _Chain().extend(d.term)
    if d.inputs is not None:
        c.add(2, d.inputs)
    return c


def _dot_abs(d: _Dot, amax: float, bmax: float) -> float:
    """Absolute error of one dot (B3): eta per rounding, subnormal alignment, input underflow."""
    a = d.abs_steps + d.align * (amax + bmax) + d.align_const
    if d.inputs is not None:
        e = d.inputs.eta
        a += d.extra.get("n", 1) * (e * (amax + bmax) + e * e)
    return a


def _exact_inputs(x: np.ndarray, d: _Dot, model: Model) -> bool:
    """Whether the operands are already values of the dot's input format (then its conversion is exact)."""
    inner = model.inner if isinstance(model, Chunked) else model
    if d.inputs is None:
        return True
    from simfloat.rounding import round as sround

    return bool(np.array_equal(sround(x, cast(FloatFormat, inner.input_fmt), inner.input_mode), x))
