"""The row kernels' record of an accumulation model (:class:`MMA`, :func:`mma`), their scratch (:class:`Work`), and
the preparation of operands: alignment weights (:func:`operand_powers`), rounding into an input format, and the
range checks that decide which kernel form applies (:func:`tame`, :func:`narrow`, :func:`for_operands`).

The kernels themselves: :mod:`simfloat.accumulate._block` (block FMA, float64 form),
:mod:`simfloat.accumulate._block32` (block FMA, float32 form), :mod:`simfloat.accumulate._seq` (sequential),
:mod:`simfloat.accumulate._f64` (the float64 hardware loops); :mod:`simfloat.accumulate._rows` drives them.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from simfloat._jit import jit, ljit
from simfloat._lanes import Lane, lane, lround, pow2_of
from simfloat.accumulate.models import AccParams, BlockFMA, Chunked, Model, Sequential, acc_params
from simfloat.formats import FloatFormat
from simfloat.formats import format as _format
from simfloat.rounding import RoundingMode, mode_code, round_scalar

_HUGE = 2.0**450  # operands beyond 2**+-450 (and inf/NaN): the reference path


_TINY = 2.0**-450


K_SEQ, K_BLOCK = 0, 1


# Sequential models that are plain hardware arithmetic: float64 nearest-even with exact products (one fused
# rounding: fma), float64 with products rounded to float64 (multiply, then add), float32 nearest-even with
# exact products on float32 operands and accumulator (fma in float32; the caller checks the operands)
N_NONE, N_FMA64, N_MULADD64, N_FMA32 = range(4)


class MMA(NamedTuple):
    """An accumulation model for the row kernels (see :func:`mma`)."""

    kind: int  # K_SEQ or K_BLOCK (of the inner model when chunked)
    fast: bool  # the row kernels apply (else dot_acc per output)
    acc: Lane  # accumulator format and mode
    prod: Lane  # Sequential: product format (round_products)
    round_products: bool
    block: int
    frac: int
    align_sum: bool
    opnd_emin: float  # 2**operand_emin: the least weight an operand counts with (exponent-sum alignment)
    two_f: float  # 2**fraction_bits
    chunk: int  # 0 none; > 0 chunk length; < 0 -(number of splits)
    outer: Lane
    ap: AccParams  # the same model for dot_acc
    exact_products: bool  # Sequential without product rounding: needs products exact in float64
    in_round: bool  # operands are rounded into an input format first (done by the caller, see round_operands)
    inp: Lane
    native: int  # Sequential done by the hardware's own arithmetic: N_FMA64, N_MULADD64, N_FMA32 (else 0)
    tame: bool  # the B operands were checked: zero or within 2**+-450 (block FMA; see for_operands)
    plain_sum: bool  # products rounded into the accumulator's own format, nearest rounding, <= 24 fraction bits
    acc_lo: float  # 2**acc_emin: the least weight a nonzero accumulator counts with (0: none)
    zero_w: float  # 2**zero_exp: the weight a zero accumulator counts with (0: none)
    sums32: bool  # block FMA, exponent-sum alignment, a block's truncated terms sum exactly in int32
    b_shift: float  # 2**sigma: the block float32 form's B operand is B * b_shift (0: none prepared; operand32)
    b_lo: float  # the least weight 2**floor(log2 |b|) of its nonzero values, after the shift
    group: int = 1  # block FMA: consecutive k summed exactly before truncation (block-scaled fp4 kinds; scaled_mma)


class Work(NamedTuple):
    """Scratch space of one thread for outputs of width up to ``n``."""

    em: np.ndarray  # alignment weights 2**emax
    sc: np.ndarray  # 2**-q
    back: np.ndarray  # 2**q
    tot: np.ndarray  # block sums (integers, exact in float64)
    c0: np.ndarray  # the incoming accumulator
    part: np.ndarray  # chunk results
    c32: np.ndarray  # float32 accumulators of the float32 FMA loop
    em32: np.ndarray  # float32 block form: the largest product weight (float32, shifted)
    s32: np.ndarray  # float32 block form: the term scale (float32, shifted)
    t32: np.ndarray  # float32 block form: the block's truncated terms (int32)
    a32: np.ndarray  # float32 block form of row_mma: the row's shifted values (rows of up to n elements)
    e32: np.ndarray  # and weights


@jit
def work(n):
    """Scratch for rows of up to ``n`` outputs (and, for :func:`row_mma`'s float32 block form, of up to ``n``
    operand elements)."""
    f32 = np.float32
    return Work(
        np.empty(n),
        np.empty(n),
        np.empty(n),
        np.empty(n),
        np.empty(n),
        np.empty(n),
        np.empty(n, dtype=f32),
        np.empty(n, dtype=f32),
        np.empty(n, dtype=f32),
        np.empty(n, dtype=np.int32),
        np.empty(n, dtype=f32),
        np.empty(n, dtype=f32),
    )


def mma(model: Model) -> MMA:
    """The :class:`MMA` record of an accumulation model (validated by :func:`acc_params`)."""
    ap = acc_params(model)
    chunk = ap.chunk
    if isinstance(model, Chunked):
        outer = lane(_format(model.outer_fmt), int(mode_code(model.outer_mode)))
    elif isinstance(model, BlockFMA) and not model.fused:  # acc_params made it one chunk per block
        outer = lane(_format(model.out_fmt), int(mode_code(model.acc_add)))
    else:
        outer = lane(_format("float64"), 0)
    inner = model.inner if isinstance(model, Chunked) else model
    if isinstance(inner, Sequential):
        accf = _format(inner.fmt)
        acc = lane(accf, int(mode_code(inner.mode)))
        prodf = _format(inner.product_fmt) if inner.product_fmt is not None else accf
        prod = lane(prodf, int(mode_code(inner.mode)))
        rp = inner.product_fmt is not None
        inf = _format(inner.input_fmt) if inner.input_fmt is not None else accf
        inp = lane(inf, int(mode_code(inner.input_mode)))
        fast = acc.fast and (prod.fast or not rp)
        kind, blk, frac, align_sum, emin = K_SEQ, 1, 0, False, -1074
        exact = not rp
        native = N_NONE
        if acc.native and not rp:
            native, exact = N_FMA64, False
        elif acc.native and prod.native:
            native = N_MULADD64
        elif accf.name == "float32" and acc.mode == RoundingMode.NEAREST_EVEN and not rp:
            native = N_FMA32
        # c + p of two values of one format with <= 24 fraction bits, rounded to nearest: the float64 sum rounds
        # like the exact one (exact when their exponents are close; else within 2**(t - 52) |c| of c, far
        # inside the gap to the nearest midpoint of the format, 2**(-t - 1) |c|, t = precision)
        plain = rp and prodf == accf and acc.mode in (0, 1) and accf.mantissa_bits <= 24
    else:
        assert isinstance(inner, BlockFMA)
        acc = lane(_format(inner.out_fmt), int(mode_code(inner.out_mode)))
        prod = acc
        rp = False
        inf = _format(inner.input_fmt) if inner.input_fmt is not None else _format(inner.out_fmt)
        inp = lane(inf, int(mode_code(inner.input_mode)))
        kind, blk, frac = K_BLOCK, inner.block, inner.fraction_bits
        # the block sums are integers below (block + 1) * 2**(F + 2): exact in float64 up to 2**53
        fast = acc.fast and (blk + 1) * 2.0 ** (frac + 2) <= 2.0**53
        align_sum = inner.align == "exponent_sum"
        emin = inner.operand_emin if inner.operand_emin is not None else -1074
        exact = False
        native = N_NONE
        plain = False
        # mixed operand clamps (both operands' weights come from one emin in the row kernels' callers) and
        # block-scaled kinds (which need their scales) take the reference path
        fast = fast and ap.opnd_emin_b == ap.opnd_emin and inner.scale_block == 0
        # the overflow / zero-sign rules other than IEEE's: the reference kernel
        fast = fast and inner.overflow == "round" and inner.zero_sign == "exact"
    if chunk != 0:
        fast = fast and outer.fast
    in_round = ap.round_inputs
    if in_round:
        fast = fast and inp.fast
        if native == N_FMA32 and not (inp.m <= 23 and inp.emin >= -126):
            native = N_NONE
    return MMA(
        kind,
        bool(fast),
        acc,
        prod,
        rp,
        blk,
        frac,
        align_sum,
        float(2.0 ** max(emin, -1074)),
        float(2.0**frac),
        chunk,
        outer,
        ap,
        exact,
        in_round,
        inp,
        native,
        False,
        bool(plain),
        float(2.0**ap.acc_emin) if ap.acc_emin > -1074 else 0.0,
        float(2.0**ap.zero_exp) if ap.zero_exp > -1074 else 0.0,
        bool(kind == K_BLOCK and align_sum and blk * (2 ** (frac + 2) - 1) <= 2**31 - 1),
        0.0,
        0.0,
    )


@jit
def _opnd_pow(x, emin):
    if x == 0.0:
        return 0.0
    if x - x != 0.0:
        return np.inf
    return max(2.0 ** np.floor(np.log2(np.abs(x))), emin)


@jit
def operand_powers(x, out, emin):
    """``2**max(floor(log2 |x|), emin_exp)`` of the flat array ``x`` (``emin = 2**emin_exp``): the weight a
    tensor core aligns an operand by; 0 for zeros, inf for inf/NaN."""
    for i in range(x.size):
        out[i] = _power(x[i], emin)


@ljit
def _power(x, emin):
    """One weight of :func:`operand_powers`."""
    p = pow2_of(x)
    if p == 0.0 or p == np.inf:
        p = _opnd_pow(x, emin)
    return max(p, emin) if p != 0.0 else 0.0


@jit
def scaled_powers(x, s, out, n, emin, scale_lo, elems):
    """Alignment weights of a block-scaled operand (see :func:`scaled_mma`): out[i] = 2**max(e(s[i]),
    scale_emin) (``scale_lo`` = 2**scale_emin), times 2**max(e(x[i]), emin) where ``elems`` (kinds aligned by
    the operands' and the scales' exponents; the grouped fp4 kinds align by the scales' alone), for i < n; 0
    where x[i] or s[i] is 0. x: the elements, s: their scales (finite, >= 0)."""
    for i in range(n):
        w = _power(s[i], scale_lo) if x[i] != 0.0 else 0.0
        if elems:
            w *= _power(x[i], emin)
        out[i] = w


@jit
def _round_flat(x, out, r, p, mode):
    if r.fast:
        for i in range(x.size):
            out[i] = lround(x[i], r)
    else:
        for i in range(x.size):
            out[i] = round_scalar(x[i], p, mode, np.uint64(0))


def round_operands(x: np.ndarray, mp: MMA) -> np.ndarray:
    """``x`` (float64, contiguous) rounded into the model's input format, as the dot reads it; ``x`` itself when
    the model has none."""
    if not mp.in_round:
        return x
    out = np.empty(x.shape)
    _round_flat(np.ascontiguousarray(x).reshape(-1), out.reshape(-1), mp.inp, mp.ap.in_p, mp.ap.in_mode)
    return out


@jit
def _narrow(x):
    for i in range(x.size):
        v = x[i]
        if v - v == 0.0 and v != 0.0:
            big = pow2_of(v)
            if big < _TINY or big > _HUGE:
                return False
            y = v * (2.0**25 / big)  # at most 26 significant bits: an integer
            if y != np.floor(y):
                return False
    return True


def narrow(*arrays: np.ndarray) -> bool:
    """Whether every finite value has at most 26 significant bits and a magnitude within 2**+-900 (products of
    two are exact in float64 and far from its range limits)."""
    return all(_narrow(np.ascontiguousarray(a).reshape(-1)) for a in arrays)


@jit
def _tame(x, n):
    """x[:n] zero or of magnitude within 2**+-450: products of two stay within 2**+-900."""
    ok = True
    for j in range(n):
        a = np.abs(x[j])
        ok &= (a == 0.0) | ((a >= _TINY) & (a <= _HUGE))
    return ok


@jit
def _all_f32(x):
    for i in range(x.size):
        v = x[i]
        if np.float64(np.float32(v)) != v and v == v:
            return False
    return True


def tame(*arrays: np.ndarray) -> bool:
    """Whether every value is zero or of magnitude within 2**+-450 (so products and sums stay far from float64's
    limits: the block-FMA row kernels need no range checks)."""
    for x in arrays:
        a = np.abs(x)
        if not np.all((a == 0.0) | ((a >= _TINY) & (a <= _HUGE))):
            return False
    return True


def for_operands(mp: MMA, *arrays: np.ndarray) -> MMA:
    """The record for these operands (the B operands of the row kernels, at least): a sequential model whose
    products must be exact in float64 leaves the fast path when they are not; the float32 FMA form needs
    float32 operands; block FMA records whether they are tame (:func:`tame`)."""
    mp = mp._replace(tame=tame(*arrays))
    if mp.fast and mp.exact_products and not narrow(*arrays):
        mp = mp._replace(fast=False)
    if mp.native == N_FMA32 and not all(_all_f32(np.ascontiguousarray(a).reshape(-1)) for a in arrays):
        mp = mp._replace(native=N_NONE)
    return mp


def _span(x: np.ndarray) -> int:
    """Bits from the lowest set bit of the smallest nonzero |x| to the top bit of the largest (0: none)."""
    a = np.abs(np.asarray(x, dtype=np.float64).reshape(-1))
    a = a[np.isfinite(a) & (a != 0.0)]
    if a.size == 0:
        return 0
    m, e = np.frexp(a)  # a = m * 2**e, 0.5 <= m < 1: m * 2**53 is an integer
    ints = (m * 2.0**53).astype(np.int64)
    low = e - 53 + np.log2((ints & -ints).astype(np.float64)).astype(np.int64)
    return int(e.max() - low.min())


def format_span(fmt: FloatFormat) -> int:
    """:func:`_span` of every value of ``fmt`` (its largest against its least subnormal quantum)."""
    return int(fmt.emax + fmt.mantissa_bits - fmt.emin + 1)
