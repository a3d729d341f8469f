"""The arithmetic floor: every implementation of "round a op b once" gives the correctly rounded IEEE result.

Implementations: the scalar workers (:mod:`simfloat.ops._scalar`, the floor), the attention kernels' ops
(:mod:`simfloat.attention._kernels`, which take an ``OpParams``) and the branch-free lanes (:mod:`simfloat._lanes`,
the vector twin, where a format and mode have a fast lane). The oracle is independent of all of them: the exact
result in rationals (``fractions.Fraction``; square roots through mpmath at 400 bits) rounded by
``tests/oracle.py``, with IEEE 754's rules for special values and for the sign of an exact zero (``x + (-x)`` is
+0 in every mode but roundTowardNegative, where it is -0; a sum of two zeros of one sign keeps it).
"""

from __future__ import annotations

import math
import random
import struct
from collections.abc import Callable
from fractions import Fraction

import mpmath
import numpy as np
import pytest
from oracle import bracket, round_ref

from simfloat import _lanes
from simfloat.attention import _kernels
from simfloat.attention.plan import OpParams
from simfloat.formats import format as sformat
from simfloat.ops import _scalar
from simfloat.rounding import RoundingMode

FORMATS = ("float32", "bfloat16", "float16", "e4m3", "e5m2", "e2m1", "float64")
MODES = tuple(m for m in RoundingMode if m != RoundingMode.STOCHASTIC)
ORACLE_MODE = {
    RoundingMode.NEAREST_EVEN: "nearest_even",
    RoundingMode.NEAREST_AWAY: "nearest_away",
    RoundingMode.TOWARD_ZERO: "toward_zero",
    RoundingMode.UP: "up",
    RoundingMode.DOWN: "down",
    RoundingMode.ODD: "odd",
}
OPS = ("add", "sub", "mul", "div", "fma", "sqrt")
_Z = np.uint64(0)


def _bits(x: float) -> int:
    return struct.unpack("<Q", struct.pack("<d", x))[0]


def _same(x: float, y: float) -> bool:
    return (math.isnan(x) and math.isnan(y)) or _bits(x) == _bits(y)


def _neg(x: float) -> bool:
    return math.copysign(1.0, x) < 0


# -- the oracle ---------------------------------------------------------------------------------------------------


def _exact(op: str, a: float, b: float, c: float, mode: RoundingMode) -> float | Fraction:
    """The exact IEEE result of ``op``: NaN, a signed infinity, a signed zero (as floats) or a nonzero
    Fraction."""
    used = {"sqrt": (a,), "fma": (a, b, c)}.get(op, (a, b))
    if any(math.isnan(x) for x in used):
        return math.nan
    down = mode == RoundingMode.DOWN
    if op == "sub":
        return _exact("add", a, -b, 0.0, mode)
    if op == "add":
        return _sum(a, b, a == 0.0 and b == 0.0, _neg(a), _neg(b), down)
    if op == "mul":
        if math.isinf(a) or math.isinf(b):
            return math.nan if a == 0.0 or b == 0.0 else math.copysign(math.inf, a * b)
        v = Fraction(a) * Fraction(b)
        return v if v != 0 else (-0.0 if _neg(a) != _neg(b) else 0.0)
    if op == "div":
        sign = -1.0 if _neg(a) != _neg(b) else 1.0
        if (math.isinf(a) and math.isinf(b)) or (a == 0.0 and b == 0.0):
            return math.nan
        if math.isinf(a) or b == 0.0:
            return sign * math.inf
        if math.isinf(b) or a == 0.0:
            return sign * 0.0
        return Fraction(a) / Fraction(b)
    if op == "fma":
        if math.isinf(a) or math.isinf(b):
            if a == 0.0 or b == 0.0:
                return math.nan
            p = math.copysign(math.inf, a * b)
            return math.nan if math.isinf(c) and (c > 0) != (p > 0) else p
        if math.isinf(c):
            return c
        prod_zero = a == 0.0 or b == 0.0
        return _sum_exact(
            Fraction(a) * Fraction(b), Fraction(c), prod_zero and c == 0.0, _neg(a) != _neg(b), _neg(c), down
        )
    if op == "sqrt":
        if a == 0.0 or math.isinf(a) and a > 0:
            return a
        if a < 0:
            return math.nan
        with mpmath.workprec(400):
            man, exp = mpmath.sqrt(mpmath.mpf(a)).man_exp
        r = Fraction(man) * Fraction(2) ** exp
        return r  # exact when a is a square; else within 2**-399 (relative), never on a rounding boundary
    raise AssertionError(op)


def _sum(a: float, b: float, both_zero: bool, na: bool, nb: bool, down: bool) -> float | Fraction:
    if math.isinf(a) or math.isinf(b):
        if math.isinf(a) and math.isinf(b) and (a > 0) != (b > 0):
            return math.nan
        return a if math.isinf(a) else b
    return _sum_exact(Fraction(a), Fraction(b), both_zero, na, nb, down)


def _sum_exact(x: Fraction, y: Fraction, both_zero: bool, nx: bool, ny: bool, down: bool) -> float | Fraction:
    v = x + y
    if v != 0:
        return v
    if both_zero and nx == ny:
        return -0.0 if nx else 0.0  # -0 + -0 = -0, +0 + +0 = +0 in every mode
    return -0.0 if down else 0.0  # an exact zero sum of nonzero (or opposite) terms: IEEE 754 section 6.3


def expected(op: str, a: float, b: float, c: float, fmt: str, mode: RoundingMode) -> float:
    v = _exact(op, a, b, c, mode)
    if isinstance(v, float) and v == 0.0:
        return v  # every format of FORMATS has -0
    return round_ref(v, sformat(fmt), ORACLE_MODE[mode])


# -- the implementations ------------------------------------------------------------------------------------------

Impl = Callable[[float, float, float], float]


def implementations(op: str, fmt: str, mode: RoundingMode) -> dict[str, Impl]:
    f = sformat(fmt)
    p, m = f.params, int(mode)
    out: dict[str, Impl] = {}
    scalar = {
        "add": lambda a, b, c: _scalar.add_scalar(a, b, p, m, _Z),
        "sub": lambda a, b, c: _scalar.sub_scalar(a, b, p, m, _Z),
        "mul": lambda a, b, c: _scalar.mul_scalar(a, b, p, m, _Z),
        "div": lambda a, b, c: _scalar.div_scalar(a, b, p, m, _Z),
        "fma": lambda a, b, c: _scalar.fma_scalar(a, b, c, p, m, _Z),
        "sqrt": lambda a, b, c: _scalar.sqrt_scalar(a, p, m, _Z),
    }
    out["ops._scalar"] = scalar[op]
    o = OpParams(p, m)
    kernels = {
        "add": lambda a, b, c: _kernels.add(a, b, o),
        "sub": lambda a, b, c: _kernels.sub(a, b, o),
        "mul": lambda a, b, c: _kernels.mul(a, b, o),
        "div": lambda a, b, c: _kernels.div(a, b, o),
        "fma": lambda a, b, c: _kernels.fma(a, b, c, o),
    }
    if op in kernels:
        out["attention._kernels"] = kernels[op]
    r = _lanes.lane(f, m)
    if r.fast and op != "sqrt":
        general = {"add": _lanes.ladd, "mul": _lanes.lmul, "div": _lanes.ldiv}
        if op in general:
            out["_lanes.l" + op] = lambda a, b, c, fn=general[op]: fn(a, b, r)
        elif op == "sub":
            out["_lanes.ladd(a, -b)"] = lambda a, b, c: _lanes.ladd(a, -b, r)
        elif op == "fma" and f.mantissa_bits <= 23:  # lfma's contract: products exact in float64 (<= 24 bits)
            out["_lanes.lfma"] = lambda a, b, c: _lanes.lfma(a, b, c, r)
        if mode == RoundingMode.NEAREST_EVEN:
            ne = {"add": _lanes.ladd_ne, "mul": _lanes.lmul_ne, "div": _lanes.ldiv_ne}
            if op in ne:
                out["_lanes.l" + op + "_ne"] = lambda a, b, c, fn=ne[op]: fn(a, b, r)
            elif op == "fma" and f.mantissa_bits <= 23:
                out["_lanes.lfma_ne"] = lambda a, b, c: _lanes.lfma_ne(a, b, c, r)
        if r.f32:
            f32 = {"add": _lanes.ladd_f32, "mul": _lanes.lmul_f32, "div": _lanes.ldiv_f32}
            if op in f32:
                out["_lanes.l" + op + "_f32"] = lambda a, b, c, fn=f32[op]: fn(a, b)
            elif op == "fma":
                out["_lanes.lfma_f32"] = lambda a, b, c: _lanes.lfma_f32(a, b, c)
    return out


# -- the operands -------------------------------------------------------------------------------------------------


def _values(fmt: str, n: int, seed: int) -> list[float]:
    """Specials and ``n`` random values of the format (random codes: every binade, subnormals included)."""
    import ml_dtypes

    p = sformat(fmt).params
    tiny = 2.0 ** (p.emin - p.mantissa_bits)
    vals = [0.0, -0.0, 1.0, -1.0, 1.5, -3.0, p.max_value, -p.max_value, tiny, -tiny, 2.0**p.emin, math.inf, -math.inf]
    vals += [math.nan]
    dtypes = {
        "float32": np.float32,
        "bfloat16": ml_dtypes.bfloat16,
        "float16": np.float16,
        "e4m3": ml_dtypes.float8_e4m3fn,
        "e5m2": ml_dtypes.float8_e5m2,
        "e2m1": ml_dtypes.float4_e2m1fn,
        "float64": np.float64,
    }
    dt = np.dtype(dtypes[fmt])
    rng = np.random.default_rng(seed)
    if dt.itemsize == 8:
        codes = rng.integers(0, 2**63, n, dtype=np.uint64) | (rng.integers(0, 2, n, dtype=np.uint64) << 63)
    else:
        codes = rng.integers(0, 2 ** (8 * dt.itemsize), n).astype(f"u{dt.itemsize}")
    if fmt == "e2m1":
        codes = codes & 0xF
    with np.errstate(invalid="ignore"):
        rand = codes.view(dt).astype(np.float64)
    vals += [float(x) for x in rand if math.isfinite(x)]
    return vals


def cases(op: str, fmt: str) -> list[tuple[float, float, float]]:
    """Operand triples: random pairs and triples of format values, and exact cancellations (``x - x``,
    ``a*b - a*b``, zeros of each sign)."""
    vals = _values(fmt, 48, seed=FORMATS.index(fmt))
    rnd = random.Random(OPS.index(op) * 31 + FORMATS.index(fmt))
    out = [(a, b, 0.0) for a in vals[:24] for b in vals[:24]]
    out += [(rnd.choice(vals), rnd.choice(vals), rnd.choice(vals)) for _ in range(300)]
    out += [(x, -x, 0.0) for x in vals] + [(x, x, -(x * x)) for x in vals[:20]]
    out += [(1.0, -1.0, 0.0), (-0.0, -0.0, -0.0), (0.0, -0.0, 0.0), (-0.0, 0.0, -0.0), (1.0, 0.0, -0.0)]
    out += [(0.0, 1.0, -0.0), (-0.0, 1.0, 0.0), (1.5, -1.0, 1.5), (-1.5, 2.0, 3.0)]
    if op == "fma":  # c = -(a*b) where that is a value of the format: an exact zero result
        f = sformat(fmt)
        for a, b, _ in out[:200]:
            pr = Fraction(a) * Fraction(b) if math.isfinite(a) and math.isfinite(b) else None
            if pr is not None and pr != 0 and round_ref(-pr, f, "toward_zero") == -pr:
                out.append((a, b, float(-pr)))
    if op == "add":
        out += [(a, -b, 0.0) for a, b, _ in out[:100]]
    return out


# -- the tests ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name.lower())
@pytest.mark.parametrize("fmt", FORMATS)
def test_every_implementation_rounds_once_like_the_oracle(fmt, mode, op):
    impls = implementations(op, fmt, mode)
    assert "ops._scalar" in impls
    bad = []
    for a, b, c in cases(op, fmt):
        want = expected(op, a, b, c, fmt, mode)
        for name, fn in impls.items():
            got = fn(a, b, c)
            if not _same(got, want):
                bad.append(f"{name}({a!r}, {b!r}, {c!r}) = {got!r}, the oracle says {want!r}")
    assert not bad, f"{len(bad)} wrong results, the first: " + "; ".join(bad[:6])


@pytest.mark.parametrize("fmt", ("float32", "bfloat16", "e4m3"))
@pytest.mark.parametrize("op", ("add", "mul", "div", "fma"))
def test_stochastic_rounding_gives_a_neighbour(fmt, op):
    """Stochastic rounding (the floor only takes random bits): one of the two neighbours of the exact result."""
    f = sformat(fmt)
    p, m = f.params, int(RoundingMode.STOCHASTIC)
    fn = {
        "add": lambda a, b, c, r: _scalar.add_scalar(a, b, p, m, r),
        "mul": lambda a, b, c, r: _scalar.mul_scalar(a, b, p, m, r),
        "div": lambda a, b, c, r: _scalar.div_scalar(a, b, p, m, r),
        "fma": lambda a, b, c, r: _scalar.fma_scalar(a, b, c, p, m, r),
    }[op]
    rng = np.random.default_rng(7)
    seen = 0
    for a, b, c in cases(op, fmt):
        v = _exact(op, a, b, c, RoundingMode.NEAREST_EVEN)
        if not isinstance(v, Fraction) or abs(v) > f.params.max_value:
            continue
        lo, hi, _ = bracket(v, f)
        got = fn(a, b, c, np.uint64(rng.integers(0, 2**63)))
        assert _same(got, lo) or _same(got, hi), (a, b, c, got, lo, hi)
        seen += 1
    assert seen > 100


def test_an_exact_zero_sum_is_minus_zero_when_rounding_down():
    """IEEE 754: 1 + (-1) is -0 under roundTowardNegative and +0 otherwise, in every implementation (the
    attention kernels and the lanes once gave +0)."""
    for fmt in ("float32", "bfloat16", "e4m3"):
        for mode in MODES:
            want = -0.0 if mode == RoundingMode.DOWN else 0.0
            for op, (a, b, c) in (("add", (1.0, -1.0, 0.0)), ("sub", (2.0, 2.0, 0.0)), ("fma", (1.0, 1.0, -1.0))):
                for name, fn in implementations(op, fmt, mode).items():
                    got = fn(a, b, c)
                    assert _same(got, want), f"{name} {fmt} {mode.name}: {op}{(a, b, c)} = {got!r}, not {want!r}"


def test_the_oracle_agrees_with_ml_dtypes_casts():
    """The oracle's nearest-even rounding is that of ml_dtypes' casts (an independent check of the oracle)."""
    import ml_dtypes

    rng = np.random.default_rng(3)
    x = rng.standard_normal(2000) * np.exp2(rng.integers(-20, 20, 2000))
    for fmt, dt in (("bfloat16", ml_dtypes.bfloat16), ("e5m2", ml_dtypes.float8_e5m2), ("float16", np.float16)):
        with np.errstate(over="ignore"):
            want = x.astype(dt).astype(np.float64)
        got = [round_ref(float(v), sformat(fmt), "nearest_even") for v in x]
        assert all(_same(g, float(w)) for g, w in zip(got, want, strict=True)), fmt


def test_op_indices_are_positions_in_the_op_lists():
    """Each kernel module's op constant (the op's name in capitals) is that op's position in the list the tracer
    reads, and so are the state constants: a renamed or reordered op moves its index with it."""
    import importlib

    from simfloat.attention.plan import BASELINE_OPS, FLASH_OPS
    from simfloat.attention.quant_plan import QUANT_OPS
    from simfloat.trace import STATES

    baseline, backward, _quant_kernels, forward, fwd_trace = (
        importlib.import_module(f"simfloat.attention.{m}")
        for m in ("baseline", "reference.backward", "_quant_kernels", "reference.forward", "reference._trace")
    )
    tables = [
        (baseline, BASELINE_OPS, ""),
        (_quant_kernels, QUANT_OPS, ""),
        (forward, forward.LOGICAL_OPS, "R_"),
        (backward, backward.TRACED_BACKWARD_OPS, "B_"),
        (backward, backward.BACKWARD_STATES, "S_"),
    ]
    for module, names, prefix in tables:
        got = [getattr(module, prefix + n.upper()) for n in names]
        assert got == list(range(len(names))), (module.__name__, names)
    for module in (fwd_trace, baseline):  # S_M, S_L, S_ACC, S_OUT: m_i, l_i, acc, out
        got = [module.S_M, module.S_L, module.S_ACC, module.S_OUT]
        assert got == [STATES.index(n) for n in ("m_i", "l_i", "acc", "out")] == [0, 1, 2, 3], module.__name__
    # the forward loop records its logical ops into each plan's own tracer columns
    cols = forward.trace_columns(FLASH_OPS, False)
    assert [FLASH_OPS[c] if c >= 0 else None for c in cols] == [
        n if n in FLASH_OPS else None for n in forward.LOGICAL_OPS
    ]
    qcols = forward.trace_columns(QUANT_OPS, True)
    assert [QUANT_OPS[c] for c in qcols] == [{"l_ij": "l_i", "p": "p_quant"}.get(n, n) for n in forward.LOGICAL_OPS]
    assert _quant_kernels.QUANT_OPS is QUANT_OPS
