"""simfloat.ops against exact references: Fractions / integers and an independent rounding written here,
mpmath for exp, exp2 and log.

Results are compared bit for bit (NaNs of any payload are equal). Stochastic rounding is checked through the
scalar workers with the two extreme random words: ``rbits = 0`` rounds away from zero whenever the value is
inexact, ``rbits = 2**64 - 1`` never rounds away (truncation), plus statistics and determinism through the
array API.
"""

from __future__ import annotations

import functools
import math
from fractions import Fraction

import ml_dtypes
import mpmath
import numba
import numpy as np
import pytest

from simfloat import ops
from simfloat.formats import format as get_format
from simfloat.ops import _api, _elementary
from simfloat.rounding import RoundingMode

F = Fraction
U64MAX = np.uint64(2**64 - 1)
SR_AWAY, SR_TRUNC = 6, 7  # reference pseudo-modes: stochastic rounding with rbits = 0 / 2**64 - 1
ALL_MODES = (0, 1, 2, 3, 4, 5, SR_AWAY, SR_TRUNC)
FORMATS = ("bfloat16", "float16", "float8_e4m3fn", "float32", "tfloat32")
FORMATS64 = FORMATS + ("float64",)


# ------------------------------------------------------------------------------------------------------------
# Independent reference rounding: magnitude man * 2**exp (+ an infinitesimal when t == 1), rounded into fmt.
# ------------------------------------------------------------------------------------------------------------
def _overflow(fmt, neg: bool, mode: int) -> float:
    to_inf = mode in (0, 1, SR_AWAY, SR_TRUNC) or (mode == 3 and not neg) or (mode == 4 and neg)
    if to_inf and fmt.overflow == "inf":
        r = math.inf
    elif to_inf and fmt.overflow == "nan":
        return math.nan
    else:
        r = fmt.max
    return -r if neg else r


def _inf_into(fmt, neg: bool) -> float:
    """What an exact infinity becomes in fmt."""
    if fmt.has_infinity:
        return -math.inf if neg else math.inf
    if fmt.overflow == "nan":
        return math.nan
    return -fmt.max if neg else fmt.max


def ref_round_dyadic(neg: bool, man: int, exp: int, t: int, fmt, mode: int) -> float:
    """Round (-1)**neg * (man * 2**exp + t * eps) into fmt; eps is a positive infinitesimal (t in {0, 1})."""
    assert fmt.subnormals and fmt.nan != "fnuz"
    m = fmt.mantissa_bits
    e = man.bit_length() - 1 + exp if man else fmt.emin
    q = max(e, fmt.emin) - m  # quantum
    sh = q - exp
    if sh <= 0:
        n, rem, half, inexact = man << -sh, 0, 1, bool(t)
        cmp = -1
    else:
        n, rem, half = man >> sh, man & ((1 << sh) - 1), 1 << (sh - 1)
        inexact = rem != 0 or bool(t)
        cmp = (1 if t else 0) if rem == half else (1 if rem > half else -1)
    if not inexact:
        up = False
    elif mode == 0:
        up = cmp > 0 or (cmp == 0 and n & 1 == 1)
    elif mode == 1:
        up = cmp >= 0
    elif mode == 3:
        up = not neg
    elif mode == 4:
        up = neg
    elif mode == SR_AWAY:
        up = True
    else:  # 2 (toward zero), 5 (odd, below), SR_TRUNC
        up = False
    if mode == 5 and inexact:
        n |= 1
    n += up
    max_man, max_exp = _max_parts(fmt)
    if (n << max(q - max_exp, 0)) > (max_man << max(max_exp - q, 0)):  # n * 2**q > fmt.max
        return _overflow(fmt, neg, mode)
    r = math.ldexp(n, q)  # exact: a value of the format
    return -r if neg else r


@functools.cache
def _max_parts(fmt) -> tuple[int, int]:
    man, exp = F(fmt.max).numerator, -(F(fmt.max).denominator.bit_length() - 1)
    return man, exp


def _dyadic(x: float) -> tuple[int, int]:
    """x == man * 2**exp with integers (x finite)."""
    num, den = x.as_integer_ratio()
    return num, -(den.bit_length() - 1)


def ref_round_int(man: int, exp: int, fmt, mode: int) -> float:
    """Round the nonzero man * 2**exp (man a signed integer)."""
    return ref_round_dyadic(man < 0, abs(man), exp, 0, fmt, mode)


def ref_round(x: Fraction, fmt, mode: int, t: int = 0) -> float:
    """Round the exact rational x (nonzero, or zero with t == 1 meaning a tiny positive value) into fmt."""
    neg = x < 0
    a = -x if neg else x
    den = a.denominator
    if den & (den - 1) == 0:
        return ref_round_dyadic(neg, a.numerator, -(den.bit_length() - 1), t, fmt, mode)
    e = a.numerator.bit_length() - den.bit_length()
    exp = min(fmt.emin, e) - fmt.mantissa_bits - 16  # 16 bits finer than any quantum at this magnitude
    scaled = a / F(2) ** exp
    man = scaled.numerator // scaled.denominator
    return ref_round_dyadic(neg, man, exp, 1 if (scaled != man or t) else 0, fmt, mode)


def _zero(neg: bool, fmt) -> float:
    return -0.0 if neg and fmt.has_negative_zero else 0.0


def _sign(x: float) -> bool:
    return math.copysign(1.0, x) < 0


def _sum_zero(a: float, b: float, mode: int) -> float:
    """IEEE sign of an exact zero sum a + b."""
    if a == 0 and b == 0 and _sign(a) == _sign(b):
        return a
    return -0.0 if mode == 4 else 0.0


def ref_binary(op: str, a: float, b: float, fmt, mode: int) -> float:
    if math.isnan(a) or math.isnan(b):
        return math.nan
    if op == "maximum":
        if a == b == 0:
            return _zero(_sign(a) and _sign(b), fmt)
        m = max(a, b)
        if math.isinf(m):
            return _inf_into(fmt, m < 0)
        return ref_round(F(m), fmt, mode) if m != 0 else _zero(_sign(m), fmt)
    if math.isinf(a) or math.isinf(b) or (op == "div" and b == 0):
        with np.errstate(all="ignore"):
            r = float({"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide}[op](a, b))
        if math.isnan(r):
            return r
        if math.isinf(r):
            return _inf_into(fmt, r < 0)
        return _zero(_sign(r), fmt)
    (ma, ea), (mb, eb) = _dyadic(a), _dyadic(b)
    if op in ("add", "sub"):
        mb = mb if op == "add" else -mb
        e = min(ea, eb)
        man = (ma << (ea - e)) + (mb << (eb - e))
        if man == 0:
            return _zero(_sign(_sum_zero(a, b if op == "add" else -b, mode)), fmt)
        return ref_round_int(man, e, fmt, mode)
    if a == 0 or b == 0:
        return _zero(_sign(a) != _sign(b), fmt)
    if op == "mul":
        return ref_round_int(ma * mb, ea + eb, fmt, mode)
    # quotient: integer division with enough bits below the format's quantum, remainder as sticky
    m = fmt.mantissa_bits
    k = max(0, mb.bit_length() - ma.bit_length() + m + 3, ea - eb - fmt.emin + m + 2)
    qq, rr = divmod(abs(ma) << k, abs(mb))
    return ref_round_dyadic((ma < 0) != (mb < 0), qq, ea - eb - k, 1 if rr else 0, fmt, mode)


def ref_fma(a: float, b: float, c: float, fmt, mode: int) -> float:
    if math.isnan(a) or math.isnan(b) or math.isnan(c):
        return math.nan
    if math.isinf(a) or math.isinf(b):
        if a == 0 or b == 0:
            return math.nan  # 0 * inf
        prod_neg = _sign(a) != _sign(b)
        if math.isinf(c) and _sign(c) != prod_neg:
            return math.nan  # inf - inf
        return _inf_into(fmt, prod_neg)
    if math.isinf(c):
        return _inf_into(fmt, c < 0)  # a finite product (exact, even beyond float64's range) plus an infinity
    x = F(a) * F(b) + F(c)
    if x == 0:
        if (a == 0 or b == 0) and c == 0:
            return _zero(_sign(_sum_zero(-0.0 if _sign(a) != _sign(b) else 0.0, c, mode)), fmt)
        return _zero(mode == 4, fmt)
    return ref_round(x, fmt, mode)


def ref_sqrt(x: float, fmt, mode: int) -> float:
    if math.isnan(x) or x < 0:
        return math.nan
    if x == 0:
        return _zero(_sign(x), fmt)
    if math.isinf(x):
        return _inf_into(fmt, False)
    fx = F(x)
    # sqrt(x) = sqrt(num * 2**(2k)) with num an integer: integer square root with a remainder flag
    den_exp = fx.denominator.bit_length() - 1
    k = -((den_exp + 1) // 2) - 64
    num = fx * F(2) ** (-2 * k)
    assert num.denominator == 1
    r = math.isqrt(num.numerator)
    return ref_round_dyadic(False, r, k, 1 if r * r != num.numerator else 0, fmt, mode)


def _mp_to_dyadic(v) -> tuple[bool, int, int]:
    sign, man, exp, _ = v._mpf_
    return bool(sign), int(man), int(exp)


def ref_unary(fn: str, x: float, fmt, mode: int) -> float:
    """exp/exp2/log via mpmath at 200 bits (exact for the exact cases)."""
    if math.isnan(x):
        return math.nan
    if fn == "sqrt":
        return ref_sqrt(x, fmt, mode)
    if fn == "log":
        if x < 0:
            return math.nan
        if x == 0:
            return _inf_into(fmt, True)
        if math.isinf(x):
            return _inf_into(fmt, False)
        if x == 1:
            return 0.0
    else:
        if x == -math.inf:
            return 0.0
        if x == math.inf:
            return _inf_into(fmt, False)
    if fn != "log":  # beyond every format in both directions (formats lie within float64's range)
        lim = 800 if fn == "exp" else 1100
        if x > lim:
            return _overflow(fmt, False, mode)
        if x < -1.2 * lim:
            return ref_round_dyadic(False, 0, 0, 1, fmt, mode)
    if fn == "exp2" and x == int(x):
        return ref_round(F(2) ** int(x), fmt, mode)
    return ref_round(_mp_value(fn, x), fmt, mode)


@functools.cache
def _mp_value(fn: str, x: float) -> Fraction:
    """The function at x to 200 significant bits, as an exact rational. For |x| < 1, exp and exp2 are formed
    as 1 + expm1(...) (exact addition), so values next to 1 keep their deviation from 1."""
    near1 = fn != "log" and abs(x) < 1
    with mpmath.workprec(200):
        xm = mpmath.mpf(x)
        if fn == "exp":
            v = mpmath.expm1(xm) if near1 else mpmath.exp(xm)
        elif fn == "exp2":
            v = mpmath.expm1(xm * mpmath.log(2)) if near1 else mpmath.power(2, xm)
        else:
            v = mpmath.log(xm)
    neg, man, exp = _mp_to_dyadic(v)
    r = F(man) * F(2) ** exp
    r = -r if neg else r
    return r + 1 if near1 else r


# ------------------------------------------------------------------------------------------------------------
# Driving the element drivers with chosen random words.
# ------------------------------------------------------------------------------------------------------------
_BIN = {"add": 0, "sub": 1, "mul": 2, "div": 3, "maximum": 4}
_UN = {"sqrt": 0, "exp": 1, "exp2": 2, "log": 3}


def run_op(op: str, fmt, mode: int, a, b=None, c=None) -> np.ndarray:
    """The op through the library's element drivers, with stochastic rounding pinned to one random word."""
    a = np.ascontiguousarray(a, dtype=np.float64)
    out = np.empty(a.size)
    m, rb = (6, np.uint64(0)) if mode == SR_AWAY else (6, U64MAX) if mode == SR_TRUNC else (mode, np.uint64(0))
    if op == "fma":
        b, c = np.ascontiguousarray(b, dtype=np.float64), np.ascontiguousarray(c, dtype=np.float64)
        _api._fma_driver(a, b, c, out, fmt.params, m, rb, True)
    elif op in _UN:
        _api._unary_driver(a, out, fmt.params, _UN[op], m, rb, True)
    else:
        b = np.ascontiguousarray(b, dtype=np.float64)
        _api._binary_driver(a, b, out, fmt.params, _BIN[op], m, rb, True)
    return out


def assert_same(got, want, context) -> None:
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    both_nan = np.isnan(got) & np.isnan(want)
    bad = ~both_nan & (got.view(np.uint64) != want.view(np.uint64))
    if bad.any():
        i = np.flatnonzero(bad)
        lines = [f"{context}: {len(i)} mismatches of {got.size}"]
        for k in i[:8]:
            lines.append(f"  [{k}] got {got.flat[k]!r} want {want.flat[k]!r}")
        raise AssertionError("\n".join(lines))


def _below_subnormal(fmt, want: np.ndarray, trunc: np.ndarray) -> np.ndarray:
    """Elements whose exact value is below the smallest subnormal (truncation gives zero): stochastic rounding
    compares only 64 bits of the fraction there, so rbits = 0 does not always round away."""
    return trunc == 0


def check(op: str, fmt_name: str, cols, modes=ALL_MODES) -> None:
    """Compare run_op with the reference for operand columns ``cols`` (lists of floats)."""
    fmt = get_format(fmt_name)
    n = len(cols[0])
    trunc = None
    for mode in (SR_TRUNC,) + tuple(md for md in modes if md != SR_TRUNC):
        if op == "fma":
            want = [ref_fma(a, b, c, fmt, mode) for a, b, c in zip(*cols, strict=True)]
        elif op in ("sqrt", "exp", "exp2", "log"):
            want = [ref_unary(op, x, fmt, mode) for x in cols[0]]
        else:
            want = [ref_binary(op, a, b, fmt, mode) for a, b in zip(*cols, strict=True)]
        got = run_op(op, fmt, mode, *cols)
        want = np.array(want, dtype=np.float64)
        if mode == SR_TRUNC:
            trunc = want
        if mode == SR_AWAY:
            keep = ~_below_subnormal(fmt, want, trunc)
            got, want = got[keep], want[keep]
        if mode in modes:
            assert_same(got, want, f"{op} {fmt_name} mode {mode} (n={n})")


# ------------------------------------------------------------------------------------------------------------
# Input sets
# ------------------------------------------------------------------------------------------------------------
def all_values(name: str) -> np.ndarray:
    """Every non-NaN value of a 16/8-bit format, as float64."""
    if name == "bfloat16":
        v = np.arange(65536, dtype=np.uint16).view(ml_dtypes.bfloat16)
    elif name == "float16":
        v = np.arange(65536, dtype=np.uint16).view(np.float16)
    else:
        v = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn)
    with np.errstate(invalid="ignore"):
        v = v.astype(np.float64)
    return v[~np.isnan(v)]


def bf16_subset(n_exp: int) -> list[float]:
    """4 significands x n_exp exponents (subnormal, smallest normals, around 1, largest) x 2 signs."""
    exps = np.unique(np.round(np.linspace(0, 254, n_exp)).astype(int))
    exps = np.unique(np.concatenate([exps, [0, 1, 126, 127, 128, 254]]))[:n_exp]
    codes = [(e << 7) | m for e in exps for m in (0, 1, 0x40, 0x7F)]
    v = np.array(codes, dtype=np.uint16).view(ml_dtypes.bfloat16).astype(np.float64)
    return sorted(set(v.tolist()) | set((-v).tolist()))


def near_values(rng, fmt, n: int) -> np.ndarray:
    """Values of the format, midpoints and their float64 neighbours: ties and near-ties."""
    m = fmt.mantissa_bits
    e = rng.integers(max(fmt.emin - m, -1000), min(fmt.emax, 1000) + 1, n)
    sig = rng.integers(1 << m, 1 << (m + 1), n) if m < 62 else rng.integers(1 << 52, 1 << 53, n)
    v = np.ldexp(sig.astype(np.float64), e - m)
    kind = rng.integers(0, 4, n)
    half = np.ldexp(1.0, e - m - 1)
    v = np.where(kind == 1, v + half, v)
    v = np.where(kind == 2, np.nextafter(v + half, np.inf), v)
    v = np.where(kind == 3, np.nextafter(v, -np.inf), v)
    return v * rng.choice([-1.0, 1.0], n)


def random_doubles(rng, n: int, lo: int = -60, hi: int = 60) -> np.ndarray:
    return rng.standard_normal(n) * np.ldexp(1.0, rng.integers(lo, hi, n))


# ------------------------------------------------------------------------------------------------------------
# Tests: double-double kernels
# ------------------------------------------------------------------------------------------------------------
def test_ln2_constant() -> None:
    with mpmath.workprec(300):
        ln2 = mpmath.log(2)
        err = abs(mpmath.mpf(_elementary._L1) + _elementary._L2 + _elementary._L3 - ln2) / ln2
        assert err < mpmath.mpf(2) ** -145
        assert abs(mpmath.mpf(_elementary._LN2_HI) + _elementary._LN2_LO - ln2) / ln2 < mpmath.mpf(2) ** -105


@pytest.mark.parametrize("fn", ["exp", "exp2", "log"])
def test_double_double_accuracy(fn: str) -> None:
    rng = np.random.default_rng(1)
    if fn == "log":
        xs = np.concatenate([np.exp(rng.uniform(-700, 700, 400)), 1 + rng.uniform(-1e-3, 1e-3, 300), [5e-324]])
        xs = np.concatenate([xs, 1 + np.ldexp(rng.integers(-20, 20, 100).astype(float), -52)])
        xs = xs[xs != 1.0]
    elif fn == "exp":
        xs = np.concatenate([rng.uniform(-745, 709, 500), rng.uniform(-1, 1, 300) * 1e-8])
    else:
        xs = np.concatenate([rng.uniform(-1074, 1023, 500), rng.uniform(-1, 1, 300) * 1e-8])
    worst = 0.0
    with mpmath.workprec(250):
        for x in xs:
            if fn == "log":
                h, lo = ops.log_dd(float(x))
                k = 0
                ref = mpmath.log(mpmath.mpf(float(x)))
            else:
                h, lo, k = (ops.exp_dd if fn == "exp" else ops.exp2_dd)(float(x))
                ref = mpmath.exp(mpmath.mpf(float(x))) if fn == "exp" else mpmath.power(2, mpmath.mpf(float(x)))
            got = (mpmath.mpf(h) + mpmath.mpf(lo)) * mpmath.mpf(2) ** k
            assert abs(lo) <= math.ulp(h) / 2
            worst = max(worst, float(abs(got - ref) / abs(ref)))
    assert worst < 2.0**-100, f"{fn}: relative error {worst!r}"


# ------------------------------------------------------------------------------------------------------------
# Tests: add, sub, mul, div, maximum
# ------------------------------------------------------------------------------------------------------------
BINARY = ("add", "sub", "mul", "div")


@pytest.mark.parametrize("op", BINARY)
def test_binary_bf16_subset_pairs(op: str) -> None:
    """All pairs of a 64-value exponent-spanning bf16 subset (ties, cancellation, subnormal results,
    overflow)."""
    v = bf16_subset(8)
    a = [x for x in v for _ in v]
    b = [y for _ in v for y in v]
    for name in ("bfloat16", "float16", "float8_e4m3fn"):
        check(op, name, (a, b))
    check(op, "float32", (a, b), modes=(0, 2, 3, 4, 5))


@pytest.mark.parametrize("op", BINARY + ("maximum",))
def test_binary_random_and_near_ties(op: str) -> None:
    rng = np.random.default_rng(hash(op) % 2**32)
    for name in FORMATS64:
        fmt = get_format(name)
        a = np.concatenate([near_values(rng, fmt, 300), random_doubles(rng, 200)])
        b = np.concatenate([near_values(rng, fmt, 300), random_doubles(rng, 200)])
        if op in ("add", "sub"):  # cancellation: b close to +-a
            b[:100] = -a[:100] * (1 + np.ldexp(rng.integers(-8, 8, 100).astype(float), -52))
            b[100:150] = np.ldexp(np.sign(a[100:150]), -fmt.mantissa_bits - 1) * np.abs(a[100:150])  # exact ties
        if op == "mul":  # products landing on midpoints: a = 1 + 2**-k, b = 1 + 2**-j
            k = rng.integers(1, fmt.mantissa_bits + 2, 100)
            a[:100] = 1 + np.ldexp(1.0, -k)
            b[:100] = 1 + np.ldexp(1.0, k - fmt.mantissa_bits - 1)
        if op == "div":
            b[:100] = a[:100] / 3.0
        check(op, name, (a.tolist(), b.tolist()))


@pytest.mark.parametrize("op", BINARY)
def test_binary_float64_extremes(op: str) -> None:
    """Residuals that underflow and results beyond float64's range, for float64 and an 11-bit-exponent
    format."""
    rng = np.random.default_rng(7)
    n = 400
    sig = lambda k: (rng.integers(1 << 52, 1 << 53, k) * rng.choice([-1, 1], k)).astype(np.float64)  # noqa: E731
    if op == "mul":
        a = np.ldexp(sig(n), rng.integers(-600, -480, n) - 52)
        b = np.ldexp(sig(n), rng.integers(-600, -480, n) - 52)
        a[:100], b[:100] = np.ldexp(sig(100), 470), np.ldexp(sig(100), 449)  # overflow edge
        a[100:150], b[100:150] = np.ldexp(sig(50), -1074 - 52 + 60), np.ldexp(sig(50), -90)
        # (2j+1) * 2**-1075 * (1 +- 2**-78): subnormal midpoints decided by the product's rounding error
        x, odd = 2.0**-26, (2 * rng.integers(0, 1 << 20, 100) + 1).astype(np.float64)
        up = rng.random(100) < 0.5
        a[150:250] = np.ldexp(np.where(up, 1 + x, 1 - x) * odd, -500)
        b[150:250] = np.ldexp(np.where(up, 1 - x + x * x, 1 + x + x * x), -575) * rng.choice([-1.0, 1.0], 100)
        a[250:300], b[250:300] = np.ldexp(odd[:50], -500), np.ldexp(1.0, -575)  # exact subnormal midpoints
    elif op == "div":
        a = np.ldexp(sig(n), rng.integers(-1074, -900, n) - 52 + 53)
        b = np.ldexp(sig(n), rng.integers(0, 200, n) - 52)
        a[:100], b[:100] = np.ldexp(sig(100), 1023 - 52), np.ldexp(sig(100), -53)  # overflow edge
        a[100:150] = np.ldexp(1.0, -1074) * rng.integers(1, 1000, 50)
    else:
        a = np.ldexp(sig(n), rng.integers(-1074, -1000, n))
        b = np.ldexp(sig(n), rng.integers(-1074, -1000, n))
        a[:100], b[:100] = (
            np.ldexp(np.abs(sig(100)), 971),
            np.ldexp(np.abs(sig(100)), 971 - rng.integers(0, 60, 100)),
        )
    for name in ("float64", "e11m10"):
        check(op, name, (a.tolist(), b.tolist()))


def test_binary_special_values() -> None:
    inf, nan = math.inf, math.nan
    vals = [0.0, -0.0, 1.0, -1.0, 3.0, inf, -inf, nan, 5e-324, 1e308, -1e308]
    a = [x for x in vals for _ in vals]
    b = [y for _ in vals for y in vals]
    for op in BINARY + ("maximum",):
        for name in ("float32", "float8_e4m3fn", "bfloat16", "float64"):
            check(op, name, (a, b))


def test_maximum_semantics() -> None:
    p = get_format("float32").params
    for a, b, want in [
        (-0.0, 0.0, 0.0),
        (0.0, -0.0, 0.0),
        (-0.0, -0.0, -0.0),
        (1.0, math.nan, math.nan),
        (math.nan, 1.0, math.nan),
        (-math.inf, -1.0, -1.0),
        (2.0, 1.0, 2.0),
    ]:
        got = ops.maximum_scalar(a, b, p, 0, np.uint64(0))
        assert (math.isnan(got) and math.isnan(want)) or (got == want and _sign(got) == _sign(want))


# ------------------------------------------------------------------------------------------------------------
# Tests: fma
# ------------------------------------------------------------------------------------------------------------
def test_fma_small_format_triples() -> None:
    """Triples from e4m3fn values: every product is exact in float64, sums tie and cancel often."""
    v = all_values("float8_e4m3fn")
    v = v[np.isfinite(v)]
    rng = np.random.default_rng(3)
    ab = rng.choice(v, 3000)
    bb = rng.choice(v, 3000)
    cb = rng.choice(v, 3000)
    cb[:1000] = -(ab[:1000] * bb[:1000]) + rng.choice(v[np.abs(v) < 1], 1000)  # cancellation
    for name in ("float8_e4m3fn", "bfloat16"):
        check("fma", name, (ab.tolist(), bb.tolist(), cb.tolist()))


@pytest.mark.slow
def test_fma_e4m3_subset_exhaustive() -> None:
    """All triples of a 34-value exponent-spanning e4m3fn subset (39304 triples), into e4m3fn (every mode) and
    bf16: products are exact in float64, so every tie and cancellation of the 3-term sum is hit."""
    v = all_values("float8_e4m3fn")
    pos = np.sort(v[np.isfinite(v) & (v > 0)])[::8]
    sub = np.concatenate([pos, -pos, [0.0, -0.0]])
    a, b, c = (g.ravel().tolist() for g in np.meshgrid(sub, sub, sub, indexing="ij"))
    check("fma", "float8_e4m3fn", (a, b, c))
    check("fma", "bfloat16", (a, b, c), modes=(0, 2, 3, 4, 5))


@pytest.mark.parametrize("name", ["float64", "float32", "bfloat16"])
def test_fma_integer_lattice_ties(name: str) -> None:
    """a, b, c integers: a*b + c has a few bits too many, so ties and near-ties are frequent; scaled copies
    move the same sums to the subnormal range and next to float64's overflow threshold (both through 2**+-k
    exact scaling of the operands)."""
    fmt = get_format(name)
    p = fmt.precision
    rng = np.random.default_rng(11 + p)
    n = 1500
    half = (p + 6) // 2
    a = rng.integers(1 << (half - 1), 1 << half, n) * rng.choice([-1, 1], n)
    b = rng.integers(1 << (half - 1), 1 << half, n) * rng.choice([-1, 1], n)
    c = rng.integers(-(1 << (p + 4)), 1 << (p + 4), n)
    c[: n // 3] = -(a[: n // 3] * b[: n // 3]) + rng.integers(-(1 << 8), 1 << 8, n // 3)  # cancellation
    af, bf, cf = a.astype(np.float64), b.astype(np.float64), c.astype(np.float64)
    assert np.all(af * bf == a * b) or p == 53  # ints exact in float64 except the float64 case's products
    cols = [(af, bf, cf)]
    if name == "float64":
        sa = -537
        cols.append((np.ldexp(af, sa), np.ldexp(bf, sa - 8), np.ldexp(cf, 2 * sa - 8)))  # subnormal results
        cols.append((np.ldexp(af, 490), np.ldexp(bf, 476), np.ldexp(cf, 966)))  # next to float64's overflow
        cols.append((np.ldexp(af, 600), np.ldexp(bf, 350), np.ldexp(cf, 950)))  # huge product and c
        cols.append((np.ldexp(af, 600), np.ldexp(bf, 350), np.ldexp(cf, -1000)))  # huge product, negligible c
        cols.append((np.ldexp(af, -700), np.ldexp(bf, -400), np.ldexp(cf, -1074)))  # tiny product, tiny c
        cols.append((np.ldexp(af, -700), np.ldexp(bf, -400), np.ldexp(cf, -950)))  # tiny product, larger c
    for x, y, z in cols:
        check("fma", name, (x.tolist(), y.tolist(), z.tolist()))


def test_fma_random_and_cancellation() -> None:
    rng = np.random.default_rng(5)
    n = 800
    a, b = random_doubles(rng, n), random_doubles(rng, n)
    prod = a * b
    lo = np.array([float(F(x) * F(y) - F(pz)) for x, y, pz in zip(a, b, prod, strict=True)])
    c = random_doubles(rng, n)
    c[:200] = -prod[:200]  # result = the product's low part exactly
    c[200:300] = -prod[200:300] / 2  # result prod/2 + lo: the tail can reach a full ulp of the result
    c[300:400] = prod[300:400] * 0.75
    c[400:500] = np.ldexp(lo[400:500], 52) * rng.choice([-1.0, 1.0], 100)
    for name in FORMATS64:
        check("fma", name, (a.tolist(), b.tolist(), c.tolist()))


def fma_tie_tails(rng, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """c plus a product that is a half or quarter ulp of c times (1 +- 2**-78): the product's own rounding
    error (2**-78 relative) decides which side of a float64 midpoint a*b + c lies on, also just below powers
    of two."""
    c = random_doubles(rng, n, -300, 300)
    c[: n // 2] = np.ldexp(np.sign(c[: n // 2]), rng.integers(-300, 300, n // 2))  # powers of two
    x = 2.0**-26
    up = rng.random(n) < 0.5
    a = np.where(up, 1 + x, 1 - x)
    frac = np.where(up, 1 - x + x * x, 1 + x + x * x)  # a * frac = 1 +- 2**-78
    scale = np.array([math.ulp(v) for v in c]) * rng.choice([0.5, 0.25, -0.5, -0.25], n)
    b = frac * scale
    a[::7], b[::7] = 1.0, scale[::7]  # exact midpoints and quarter points
    return a, b, c


def test_fma_tie_breaking_tails() -> None:
    a, b, c = fma_tie_tails(np.random.default_rng(17), 1200)
    for name in ("float64", "e11m51", "float32"):
        check("fma", name, (a.tolist(), b.tolist(), c.tolist()))


def test_fma_special_values() -> None:
    inf, nan = math.inf, math.nan
    vals = [0.0, -0.0, 1.0, -2.0, inf, -inf, nan, 1e300]
    trip = [(x, y, z) for x in vals for y in vals for z in vals]
    cols = [list(t) for t in zip(*trip, strict=True)]
    for name in ("float32", "float8_e4m3fn", "float64"):
        check("fma", name, cols)
    # exact zero results: x*y + c == 0
    for mode in (0, 3, 4):
        fmt = get_format("float32")
        assert _sign(ops.fma_scalar(2.0, 3.0, -6.0, fmt.params, mode, np.uint64(0))) == (mode == 4)
        assert _sign(ops.fma_scalar(-0.0, 3.0, -0.0, fmt.params, mode, np.uint64(0)))
        assert _sign(ops.fma_scalar(0.0, 3.0, -0.0, fmt.params, mode, np.uint64(0))) == (mode == 4)


# ------------------------------------------------------------------------------------------------------------
# Tests: sqrt, exp, exp2, log
# ------------------------------------------------------------------------------------------------------------
def test_sqrt_bf16_inputs() -> None:
    """Every 7th bf16 value (all of them in the slow exhaustive test)."""
    x = all_values("bfloat16")[::7].tolist()
    check("sqrt", "bfloat16", (x,))
    check("sqrt", "float32", (x,), modes=(0, 3, 4))


def test_sqrt_float64_and_extremes() -> None:
    rng = np.random.default_rng(9)
    x = np.concatenate(
        [
            np.abs(random_doubles(rng, 300)),
            np.ldexp(rng.integers(1, 1 << 52, 200).astype(float), -1074),
            [5e-324, 1.7976931348623157e308],
        ]
    )
    sq = rng.integers(1 << 20, 1 << 26, 100).astype(np.float64)
    x = np.concatenate([x, sq * sq, np.ldexp(sq * sq, -1100)])  # exact squares, also subnormal ones
    for name in ("float64", "float32", "bfloat16", "e11m10"):
        check("sqrt", name, (x.tolist(),))


UNARY_T = ("exp", "exp2", "log")


def _unary_inputs(rng) -> np.ndarray:
    bf = all_values("bfloat16")
    h = all_values("float16")
    return np.concatenate(
        [
            rng.choice(bf, 600),
            rng.choice(h, 600),
            rng.uniform(-20, 20, 200),
            rng.uniform(0, 1e-6, 50),
            [
                0.0,
                -0.0,
                1.0,
                math.inf,
                -math.inf,
                math.nan,
                -1.0,
                5e-324,
                88.72283935546875,
                -103.97208404541016,
            ],
        ]
    )


@pytest.mark.parametrize("fn", UNARY_T)
def test_transcendental_sampled(fn: str) -> None:
    rng = np.random.default_rng(21)
    x = _unary_inputs(rng).tolist()
    for name in ("bfloat16", "float16", "float8_e4m3fn", "float32", "tfloat32"):
        check(fn, name, (x,), modes=(0, 1, 2, 3, 4, 5, SR_AWAY, SR_TRUNC) if name != "float32" else (0, 3, 4, 5))


@pytest.mark.parametrize("fn", UNARY_T)
def test_transcendental_extreme_ranges(fn: str) -> None:
    """Results near float64's overflow and in its subnormal range, for an 11-bit-exponent 24-bit format."""
    rng = np.random.default_rng(22)
    if fn == "exp":
        x = np.concatenate([rng.uniform(700, 712, 100), rng.uniform(-746, -700, 100)])
    elif fn == "exp2":
        x = np.concatenate([rng.uniform(1015, 1025, 100), rng.uniform(-1100, -1010, 100), np.arange(-1080, -1070)])
    else:
        x = np.concatenate(
            [np.ldexp(rng.uniform(1, 2, 100), -1074 + rng.integers(0, 60, 100)), [1.7976931348623157e308]]
        )
    for name in ("e11m23", "e11m10", "bfloat16"):
        check(fn, name, (x.tolist(),), modes=(0, 2, 3, 4, 5))


def test_exp2_integers_exact() -> None:
    k = np.arange(-1100, 1030).astype(np.float64)
    for name in ("float64", "float32", "bfloat16", "float8_e4m3fn"):
        check("exp2", name, (k.tolist(),), modes=(0, 2, 3, 4, 5))


@pytest.mark.parametrize("fn", UNARY_T)
def test_transcendental_float64_faithful(fn: str) -> None:
    rng = np.random.default_rng(23)
    x = rng.uniform(-30, 30, 300) if fn != "log" else np.exp(rng.uniform(-700, 700, 300))
    fmt = get_format("float64")
    for mode in (0, 3, 4):
        got = run_op(fn, fmt, mode, x)
        with mpmath.workprec(120):
            for g, xi in zip(got, x, strict=True):
                xm = mpmath.mpf(float(xi))
                ref = {"exp": mpmath.exp, "log": mpmath.log}.get(fn, lambda t: mpmath.power(2, t))(xm)
                assert abs(mpmath.mpf(float(g)) - ref) < math.ulp(float(g)), (fn, xi, g)


@pytest.mark.slow
@pytest.mark.parametrize("src", ["bfloat16", "float16"])
@pytest.mark.parametrize("fn", ("sqrt",) + UNARY_T)
def test_unary_exhaustive(src: str, fn: str) -> None:
    """Every bf16 / fp16 input, into its own format and fp32, in every mode, against mpmath (integers for
    sqrt)."""
    x = all_values(src).tolist()
    check(fn, src, (x,))
    check(fn, "float32", (x,), modes=(0, 2, 3, 4, 5))


@pytest.mark.slow
@pytest.mark.parametrize("op", BINARY)
def test_binary_bf16_subset_exhaustive(op: str) -> None:
    """All pairs of a 256-value exponent-spanning bf16 subset, into bf16 and fp16, every mode."""
    v = bf16_subset(32)
    a = [x for x in v for _ in v]
    b = [y for _ in v for y in v]
    check(op, "bfloat16", (a, b))
    check(op, "float16", (a, b), modes=(0, 2, 4, 5))


# ------------------------------------------------------------------------------------------------------------
# Tests: array API
# ------------------------------------------------------------------------------------------------------------
def test_api_matches_scalar_workers_and_broadcasts() -> None:
    rng = np.random.default_rng(31)
    a = random_doubles(rng, 12).reshape(3, 4)
    b = random_doubles(rng, 4)
    fmt = get_format("bf16")
    for op in BINARY + ("maximum",):
        got = getattr(ops, op)(a, b, "bf16", "rz")
        want = run_op(op, fmt, 2, a.ravel(), np.broadcast_to(b, a.shape).ravel()).reshape(3, 4)
        assert got.shape == (3, 4) and got.dtype == np.float64
        assert_same(got, want, op)
    got = ops.fma(a, b, 1.0, "fp16", RoundingMode.UP)
    assert_same(got, run_op("fma", get_format("fp16"), 3, a.ravel(), np.tile(b, 3), np.ones(12)).reshape(3, 4), "fma")
    for fn in ("sqrt", "exp", "exp2", "log"):
        x = np.abs(a)
        assert_same(getattr(ops, fn)(x, "e4m3"), run_op(fn, get_format("e4m3"), 0, x.ravel()).reshape(3, 4), fn)


def test_api_dtypes() -> None:
    x32 = np.array([1.0, 2.0, 3.0], dtype=np.float32)
    assert ops.add(x32, x32, "bf16").dtype == np.float32
    assert ops.add(x32, 0.5, "bf16").dtype == np.float32  # Python numbers do not vote
    assert ops.add(x32, x32.astype(np.float64), "bf16").dtype == np.float64
    assert ops.add(x32, x32, "float64").dtype == np.float64  # fp64 values do not fit float32
    assert ops.add(x32, x32, "e11m10").dtype == np.float64  # exponent range beyond float32
    assert ops.sqrt(x32, "fp32").dtype == np.float32
    assert ops.sum(x32, "fp32").dtype == np.float32
    assert ops.max(x32).dtype == np.float32
    assert ops.add(1.0, 2.0, "bf16").shape == ()


def test_api_validation() -> None:
    x = np.ones(3)
    with pytest.raises(TypeError, match="dtype"):
        ops.add(np.ones(3, dtype=np.int64), x, "bf16")
    with pytest.raises(TypeError, match="b must"):
        ops.mul(x, "1", "bf16")
    with pytest.raises(TypeError, match="got complex64"):
        ops.sqrt(np.ones(2, dtype=np.complex64), "bf16")
    with pytest.raises(TypeError, match="got str"):
        ops.add(["1.5"], x, "bf16")
    with pytest.raises(ValueError, match="unknown format"):
        ops.add(x, x, "bf17")
    with pytest.raises(ValueError, match="rounding mode"):
        ops.add(x, x, "bf16", "nearest_odd")
    with pytest.raises(ValueError, match="broadcast"):
        ops.add(x, np.ones(4), "bf16")
    with pytest.raises(TypeError, match="seed"):
        ops.add(x, x, "bf16", "sr", seed=1.5)
    with pytest.raises(ValueError, match="order"):
        ops.sum(x, "bf16", order="random")
    with pytest.raises(ValueError, match="fan_in"):
        ops.sum(x, "bf16", order="pairwise", fan_in=1)
    with pytest.raises(TypeError, match="chunk"):
        ops.sum(x, "bf16", order="chunked", chunk=2.0)
    with pytest.raises(ValueError, match="axis"):
        ops.sum(x, "bf16", axis=1)
    with pytest.raises(ValueError, match="zero-size"):
        ops.max(np.ones((2, 0)))


def test_api_operands_must_be_exact_float64_numbers() -> None:
    """The ops compute exactly with float64 operands: a number float64 cannot hold is an error, not rounded."""
    x = np.ones(2)
    for bad in (2**60 + 2**52 + 1, [1.0, 2**53 + 1], np.uint64(2**64 - 1), 2**1100):
        with pytest.raises(ValueError, match="not a float64 number"):
            ops.add(x, bad, "bf16")
    assert ops.add(2**60 + 2**52, 0.0, "bf16").tolist() == 2.0**60  # exact operand: a bfloat16 tie, to even
    assert ops.mul(np.int64(-3), 0.5, "fp16").tolist() == -1.5
    if np.finfo(np.longdouble).nmant > 52:
        with pytest.raises(ValueError, match="not a float64 number"):
            ops.add(np.longdouble(1) + np.longdouble(2) ** -60, 0.0, "bf16")
    assert ops.add(np.longdouble(1.5), 0.0, "bf16").tolist() == 1.5
    for bad in (True, np.bool_(False), [1.0, True]):
        with pytest.raises(TypeError, match="bool"):
            ops.add(x, bad, "bf16")


def test_api_nan_results_are_quiet() -> None:
    """A signalling NaN operand gives a quiet NaN in every op (sign and payload as the hardware keeps them)."""
    for dtype, bits, quiet in (
        (np.float64, np.array([0x7FF0000000000001, 0xFFF4000000000000], np.uint64), 1 << 51),
        (np.float32, np.array([0x7F800001, 0xFFA00000], np.uint32), 1 << 22),
    ):
        s = bits.view(dtype)
        u = np.uint64 if dtype == np.float64 else np.uint32
        for mode in ("rne", "sr"):
            results = {
                "add": ops.add(s, 1.0, "bf16", mode, seed=1),
                "mul": ops.mul(1.0, s, "bf16", mode, seed=1),
                "maximum": ops.maximum(s, 1.0, "bf16", mode, seed=1),
                "fma": ops.fma(1.0, 1.0, s, "bf16", mode, seed=1),
                "exp": ops.exp(s, "bf16", mode, seed=1),
                "exp2": ops.exp2(s, "bf16", mode, seed=1),
                "sqrt": ops.sqrt(s, "bf16", mode, seed=1),
                "sum": ops.sum(s, "bf16", mode, axis=None, seed=1),
                "sum1": ops.sum(s[:1], "bf16", mode, seed=1),
                "max": ops.max(s[:1]),
            }
            for name, r in results.items():
                r = np.atleast_1d(r)
                assert np.isnan(r).all(), name
                q = np.uint64(quiet) if r.dtype == np.float64 else np.uint32(quiet)
                assert np.all(r.view(np.uint64 if r.dtype == np.float64 else np.uint32) & q), (name, dtype, mode)
            assert results["maximum"].view(u).tolist() == (bits | u(quiet)).tolist()


def test_stochastic_rounding_statistics_and_determinism() -> None:
    x = np.full(20000, 1.0 + 2.0**-10)  # bf16 neighbours 1 and 1 + 2**-7: P(up) = 1/8
    y = ops.add(x, 0.0, "bf16", "stochastic", seed=42)
    assert set(np.unique(y)) == {1.0, 1.0 + 2.0**-7}
    assert abs(np.mean(y == 1.0 + 2.0**-7) - 0.125) < 0.01
    assert_same(ops.add(x, 0.0, "bf16", "stochastic", seed=42), y, "same seed")
    assert not np.array_equal(ops.add(x, 0.0, "bf16", "stochastic", seed=43), y)
    e = ops.exp(np.full(20000, 0.1), "bf16", "stochastic", seed=1)  # exp(0.1) = 1.10517...
    lo, hi = 1.1015625, 1.109375
    assert set(np.unique(e)) == {lo, hi}
    assert abs(np.mean(e) - math.exp(0.1)) < 2e-4


def test_results_independent_of_thread_count() -> None:
    rng = np.random.default_rng(4)
    a = random_doubles(rng, 50000)
    rows = random_doubles(rng, 64 * 300).reshape(64, 300)
    before = numba.get_num_threads()
    try:
        outs = []
        for t in sorted({1, before}):
            numba.set_num_threads(t)
            outs.append(
                (
                    ops.mul(a, a[::-1], "bf16", "sr", seed=5),
                    ops.exp(a / 1e12, "fp16", "sr", seed=5),
                    ops.sum(rows, "bf16", "sr", order="pairwise", seed=5),
                )
            )
        for other in outs[1:]:
            for g, w in zip(other, outs[0], strict=True):
                assert_same(g, w, "threads")
    finally:
        numba.set_num_threads(before)


# ------------------------------------------------------------------------------------------------------------
# Tests: reductions
# ------------------------------------------------------------------------------------------------------------
def _tree_reference(x: list[float], fmt, mode: int, order: str, fan_in: int = 2, chunk: int = 32) -> float:
    """The documented summation trees, with the reference rounding."""

    def add(u: float, v: float) -> float:
        return ref_binary("add", u, v, fmt, mode)

    vals = [ref_round(F(v), fmt, mode) if v != 0 else v for v in x]
    if not vals:
        return 0.0
    if order == "sequential":
        acc = vals[0]
        for v in vals[1:]:
            acc = add(acc, v)
        return acc
    if order == "chunked":
        sums = []
        for i in range(0, len(vals), chunk):
            acc = vals[i]
            for v in vals[i + 1 : i + chunk]:
                acc = add(acc, v)
            sums.append(acc)
        total = sums[0]
        for s in sums[1:]:
            total = add(total, s)
        return total
    if order == "pairwise":
        while len(vals) > 1:
            nxt = []
            for g in range(0, len(vals), fan_in):
                acc = vals[g]
                for v in vals[g + 1 : g + fan_in]:
                    acc = add(acc, v)
                nxt.append(acc)
            vals = nxt
        return vals[0]

    def pw(a: list[float]) -> float:  # numpy's pairwise_sum
        n = len(a)
        if n < 8:
            res = 0.0
            for v in a:
                res = add(res, v)
            return res
        if n <= 128:
            r = a[:8]
            i = 8
            while i < n - n % 8:
                r = [add(r[j], a[i + j]) for j in range(8)]
                i += 8
            res = add(add(add(r[0], r[1]), add(r[2], r[3])), add(add(r[4], r[5]), add(r[6], r[7])))
            for v in a[i:]:
                res = add(res, v)
            return res
        n2 = n // 2
        n2 -= n2 % 8
        return add(pw(a[:n2]), pw(a[n2:]))

    return add(0.0, pw(vals))


@pytest.mark.parametrize("order", ops.ORDERS)
def test_sum_orders_match_reference_trees(order: str) -> None:
    rng = np.random.default_rng(hash(order) % 2**32)
    fmt = get_format("bf16")
    lengths = [0, 1, 2, 3, 5, 8, 9, 16, 17, 31, 40, 129, 300]
    for n in lengths:
        x = (rng.standard_normal(n) * np.ldexp(1.0, rng.integers(-8, 8, n))).astype(np.float32)
        for mode in (0, 2, 3, 5):
            for kw in ({"fan_in": 2}, {"fan_in": 3}, {"chunk": 4}) if order != "numpy" else ({},):
                got = ops.sum(x, fmt, mode, order=order, **kw)
                want = _tree_reference(x.astype(np.float64).tolist(), fmt, mode, order, **kw)
                assert_same(got, want, f"{order} n={n} mode={mode} {kw}")


def test_sum_orders_differ_on_designed_input() -> None:
    # bf16: 1 + 2**-8 is a tie that rounds back to 1; summing the small terms first keeps them.
    x = np.array([1.0] + [2.0**-8] * 15, dtype=np.float32)
    seq = float(ops.sum(x, "bf16", order="sequential"))
    pair = float(ops.sum(x, "bf16", order="pairwise"))
    chunked = float(ops.sum(x, "bf16", order="chunked", chunk=4))
    assert seq == 1.0
    assert pair == 1.0 + 7 * 2.0**-7  # (1 + 2**-8) ties back to 1, the other seven pairs make 2**-7 each
    assert chunked not in (seq,) and chunked == 1.0 + 3 * 2.0**-6
    assert float(ops.sum(x, "float32", order="sequential")) == 1.0 + 15 * 2.0**-8


def test_sum_numpy_order_equals_np_sum_float32() -> None:
    """Every length 1..1000 through the slice worker (a plain njit call), some through the array API."""
    rng = np.random.default_rng(8)
    x = (rng.standard_normal(1000) * np.ldexp(1.0, rng.integers(-12, 12, 1000))).astype(np.float32)
    x64 = x.astype(np.float64)
    p = get_format("float32").params
    for n in range(1, 1001):
        got = np.float32(ops.sum_numpy(x64[:n], p, 0, np.uint64(0), np.uint64(0)))
        assert got.view(np.uint32) == np.sum(x[:n]).view(np.uint32), n
    for n in (1, 7, 8, 127, 128, 129, 999):
        rows = np.stack([x[:n], x[::-1][:n]])
        got = ops.sum(rows, "float32", order="numpy", axis=-1)
        want = np.array([np.sum(r) for r in rows], dtype=np.float32)
        assert got.dtype == np.float32 and np.array_equal(got.view(np.uint32), want.view(np.uint32)), n
    assert ops.sum(np.full(9, -0.0, np.float32), "fp32", order="numpy").view(np.uint32) == 0  # +0 like numpy
    assert ops.sum(np.full(9, -0.0, np.float32), "fp32", order="sequential").view(np.uint32) == 1 << 31


def test_sum_axes_and_shapes() -> None:
    rng = np.random.default_rng(12)
    x = rng.standard_normal((3, 4, 5))
    for axis in (0, 1, 2, -1, None):
        got = ops.sum(x, "float64", order="sequential", axis=axis)
        ref = np.sum(x, axis=axis)
        assert got.shape == np.shape(ref)
        assert np.allclose(got, ref, rtol=1e-12)
    assert ops.sum(np.zeros((2, 0)), "bf16").tolist() == [0.0, 0.0]


def test_max_reduction() -> None:
    x = np.array([[1.0, np.nan, 3.0], [-0.0, 0.0, -1.0], [-0.0, -0.0, -5.0]])
    got = ops.max(x, axis=1)
    assert np.isnan(got[0]) and got[1] == 0.0 and not _sign(got[1]) and _sign(got[2]) and got[2] == 0.0
    assert ops.max(x[1:], axis=None) == 0.0
    assert_same(ops.max(x[1:], axis=0), [-0.0, 0.0, -1.0], "axis 0")


def test_workers_callable_from_njit() -> None:
    @numba.njit
    def user(x, p):  # type: ignore[no-untyped-def]
        s = ops.sum_sequential(x[1], p, 0, np.uint64(0), np.uint64(0))
        return ops.add_scalar(s, ops.max_slice(x[0]), p, 0, np.uint64(0))

    x = np.arange(12.0).reshape(2, 6)
    assert user(x, get_format("bf16").params) == 56.0  # 51 + 5
