"""Vectorized accumulation kernels: ``c[j] = model(c[j] + sum_k a[k] * B[k, j])`` for a row of outputs at once.

Every accumulation model of :mod:`simfloat.accumulate` has a row kernel here whose innermost loops run over the
independent outputs ``j`` (contiguous in ``B`` and ``c``), so LLVM vectorizes them. Each gives, bit for bit,
what :func:`simfloat.accumulate.dot_acc` gives for every output (tests compare them on random and adversarial
inputs). Block FMA needs operands within 2**+-450 (checked: the B operand once by :func:`for_operands`, the
row and the accumulator per call) and recomputes with ``dot_acc`` itself any output that overflowed to inf or NaN
on the way; other rows go to ``dot_acc`` whole.

* Block FMA (tensor cores): per block of k, the alignment exponent of every output (the largest exponent among
  the incoming accumulator and the block's products, a product counting with its own exponent or with the sum
  of its operands' exponents) is found first; then each term, scaled exactly by ``2**-(emax - F)``, is truncated
  toward zero and summed exactly; the sum is scaled back (exact) and rounded into the accumulator format by
  :func:`simfloat._lanes.lround`. Two forms give these bits: float64 (terms truncated by ``trunc``, summed as
  integers held in float64) and, where the operands allow, float32 (twice the lanes per vector): operands of at
  most 12 significant bits, shifted by powers of two so that every weight, product and term scale is a normal
  float32 (:func:`operand32` for B once per call, ``_shift32`` per row), terms truncated by the conversion to
  int32 and summed in int32 (a block's sum fits: ``MMA.sums32``); the accumulator's own term stays float64.
* Sequential: one exact ``c + a*b`` per step (products exact in float64, or rounded first into the product
  format), rounded once by :func:`simfloat._lanes.ladd`.
* Chunked: each chunk from zero with the inner model, then ``round(c + part)`` into the outer format.
"""

from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

import numpy as np

from simfloat._jit import bits_f64, f64_bits, fma32, fma64, jit, ljit
from simfloat._lanes import Lane, ladd, lane, lround, lround_ne, lround_rz, pow2_of, recip_pow2
from simfloat._parallel import run_rows
from simfloat.accumulate.models import AccParams, BlockFMA, Chunked, Model, Sequential, acc_params
from simfloat.accumulate.scalar import dot_acc
from simfloat.formats import FloatFormat
from simfloat.formats import format as _format
from simfloat.rounding import RoundingMode, mode_code, round_scalar

__all__ = [
    "MMA",
    "BStack",
    "b_stack",
    "tile_of",
    "Rows",
    "Work",
    "for_operands",
    "format_span",
    "matmul_rows",
    "mma",
    "narrow",
    "operand32",
    "operand_powers",
    "round_operands",
    "row_mma",
    "rows_mma",
    "rows_work",
    "scaled_mma",
    "scaled_ok",
    "scaled_powers",
    "scaled_rows",
    "scaled_weights",
    "tame",
    "work",
]

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


@ljit
def _raise(m, x):
    """max(m, x) for weights (non-negative, never NaN) as a select whose result is not ``m`` itself: LLVM turns
    ``p[j] = max(p[j], x)`` into a masked store, which is slow on some CPUs; ``m + 0.0`` (the same value) keeps
    the store unconditional."""
    return x if x > m else m + 0.0


@ljit
def _weights(a, ea, B, EB, em, lo, hi, n, align_sum):
    """em[j] = max(em[j], weight of the product a[k] * B[k, j]) over k in [lo, hi); four k per pass over j."""
    k = lo
    if align_sum:
        while k + 4 <= hi:
            e0, e1, e2, e3 = ea[k], ea[k + 1], ea[k + 2], ea[k + 3]
            r0, r1, r2, r3 = EB[k], EB[k + 1], EB[k + 2], EB[k + 3]
            for j in range(n):
                em[j] = _raise(em[j], max(max(e0 * r0[j], e1 * r1[j]), max(e2 * r2[j], e3 * r3[j])))
            k += 4
        while k < hi:
            e0, r0 = ea[k], EB[k]
            for j in range(n):
                em[j] = _raise(em[j], e0 * r0[j])
            k += 1
    else:
        while k + 4 <= hi:
            a0, a1, a2, a3 = a[k], a[k + 1], a[k + 2], a[k + 3]
            r0, r1, r2, r3 = B[k], B[k + 1], B[k + 2], B[k + 3]
            for j in range(n):
                w01 = max(pow2_of(a0 * r0[j]), pow2_of(a1 * r1[j]))
                w23 = max(pow2_of(a2 * r2[j]), pow2_of(a3 * r3[j]))
                em[j] = _raise(em[j], max(w01, w23))
            k += 4
        while k < hi:
            a0, r0 = a[k], B[k]
            for j in range(n):
                em[j] = _raise(em[j], pow2_of(a0 * r0[j]))
            k += 1


@ljit
def _terms(a, B, sc, tot, lo, hi, n):
    """tot[j] += sum over k in [lo, hi) of trunc(a[k] * B[k, j] * sc[j]): integers, so the sum is exact in any
    order; four k per pass over j."""
    k = lo
    while k + 4 <= hi:
        a0, a1, a2, a3 = a[k], a[k + 1], a[k + 2], a[k + 3]
        r0, r1, r2, r3 = B[k], B[k + 1], B[k + 2], B[k + 3]
        for j in range(n):
            s = sc[j]
            t01 = np.trunc((a0 * r0[j]) * s) + np.trunc((a1 * r1[j]) * s)
            t23 = np.trunc((a2 * r2[j]) * s) + np.trunc((a3 * r3[j]) * s)
            tot[j] += t01 + t23
        k += 4
    while k < hi:
        a0, r0 = a[k], B[k]
        for j in range(n):
            tot[j] += np.trunc((a0 * r0[j]) * sc[j])
        k += 1


@jit
def _terms_grouped(a, B, sc, tot, part, lo, hi, n, g):
    """:func:`_terms` with the terms summed exactly in groups of ``g`` consecutive k (from ``lo``) before
    truncation: tot[j] += trunc(part[j] * sc[j]), part[j] = the group's sum of a[k] * B[k, j] (exact: the
    block-scaled kinds' scaled fp4 products within a group share their scales; see :func:`scaled_mma`)."""
    for k0 in range(lo, hi, g):
        for j in range(n):
            part[j] = 0.0
        for k in range(k0, min(hi, k0 + g)):
            ak, r = a[k], B[k]
            for j in range(n):
                part[j] += ak * r[j]
        for j in range(n):
            tot[j] += np.trunc(part[j] * sc[j])


@ljit
def _weights2(a, ea, a2, ea2, B, EB, em, em2, lo, hi, n, align_sum):
    """:func:`_weights` for two rows ``a``, ``a2`` at once (each load of B or EB serves both)."""
    k = lo
    if align_sum:
        while k + 4 <= hi:
            e0, e1, e2, e3 = ea[k], ea[k + 1], ea[k + 2], ea[k + 3]
            f0, f1, f2, f3 = ea2[k], ea2[k + 1], ea2[k + 2], ea2[k + 3]
            r0, r1, r2, r3 = EB[k], EB[k + 1], EB[k + 2], EB[k + 3]
            for j in range(n):
                x0, x1, x2, x3 = r0[j], r1[j], r2[j], r3[j]
                em[j] = _raise(em[j], max(max(e0 * x0, e1 * x1), max(e2 * x2, e3 * x3)))
                em2[j] = _raise(em2[j], max(max(f0 * x0, f1 * x1), max(f2 * x2, f3 * x3)))
            k += 4
        while k < hi:
            e0, f0, r0 = ea[k], ea2[k], EB[k]
            for j in range(n):
                em[j] = _raise(em[j], e0 * r0[j])
                em2[j] = _raise(em2[j], f0 * r0[j])
            k += 1
    else:
        while k + 4 <= hi:
            a0, a1, a2_, a3 = a[k], a[k + 1], a[k + 2], a[k + 3]
            b0, b1, b2, b3 = a2[k], a2[k + 1], a2[k + 2], a2[k + 3]
            r0, r1, r2, r3 = B[k], B[k + 1], B[k + 2], B[k + 3]
            for j in range(n):
                x0, x1, x2, x3 = r0[j], r1[j], r2[j], r3[j]
                w01 = max(pow2_of(a0 * x0), pow2_of(a1 * x1))
                w23 = max(pow2_of(a2_ * x2), pow2_of(a3 * x3))
                em[j] = _raise(em[j], max(w01, w23))
                v01 = max(pow2_of(b0 * x0), pow2_of(b1 * x1))
                v23 = max(pow2_of(b2 * x2), pow2_of(b3 * x3))
                em2[j] = _raise(em2[j], max(v01, v23))
            k += 4
        while k < hi:
            a0, b0, r0 = a[k], a2[k], B[k]
            for j in range(n):
                em[j] = _raise(em[j], pow2_of(a0 * r0[j]))
                em2[j] = _raise(em2[j], pow2_of(b0 * r0[j]))
            k += 1


@ljit
def _terms2(a, a2, B, sc, sc2, tot, tot2, lo, hi, n):
    """:func:`_terms` for two rows ``a``, ``a2`` at once (each load of B serves both)."""
    k = lo
    while k + 4 <= hi:
        a0, a1, a2_, a3 = a[k], a[k + 1], a[k + 2], a[k + 3]
        b0, b1, b2, b3 = a2[k], a2[k + 1], a2[k + 2], a2[k + 3]
        r0, r1, r2, r3 = B[k], B[k + 1], B[k + 2], B[k + 3]
        for j in range(n):
            x0, x1, x2, x3 = r0[j], r1[j], r2[j], r3[j]
            s, s2 = sc[j], sc2[j]
            t01 = np.trunc((a0 * x0) * s) + np.trunc((a1 * x1) * s)
            t23 = np.trunc((a2_ * x2) * s) + np.trunc((a3 * x3) * s)
            tot[j] += t01 + t23
            u01 = np.trunc((b0 * x0) * s2) + np.trunc((b1 * x1) * s2)
            u23 = np.trunc((b2 * x2) * s2) + np.trunc((b3 * x3) * s2)
            tot2[j] += u01 + u23
        k += 4
    while k < hi:
        a0, b0, r0 = a[k], a2[k], B[k]
        for j in range(n):
            x0 = r0[j]
            tot[j] += np.trunc((a0 * x0) * sc[j])
            tot2[j] += np.trunc((b0 * x0) * sc2[j])
        k += 1


@ljit
def _scales(c, n, mp, w):
    """From the alignment weights ``w.em``: the scale 2**F / em of every term, the scale back em / 2**F, and the
    incoming accumulator's own term ``trunc(c * scale)``."""
    em, sc, back, tot = w.em, w.sc, w.back, w.tot
    two_f = mp.two_f
    inv_f = 1.0 / two_f
    for j in range(n):
        e = em[j]
        s = two_f * recip_pow2(e) if e != 0.0 else 0.0
        sc[j] = s
        back[j] = e * inv_f
        tot[j] = np.trunc(c[j] * s) + 0.0


@jit
def _normalize(c, n, r, w):
    """c[j] = the block sum ``tot[j] * back[j]`` (exact) rounded into the accumulator lane ``r`` (its mode
    dispatched here, outside the loop)."""
    tot, back = w.tot, w.back
    if r.mode == RoundingMode.TOWARD_ZERO:
        for j in range(n):
            c[j] = lround_rz(tot[j] * back[j], r)
    elif r.mode == RoundingMode.NEAREST_EVEN:
        for j in range(n):
            c[j] = lround_ne(tot[j] * back[j], r)
    else:
        for j in range(n):
            c[j] = lround(tot[j] * back[j], r)


@ljit
def _acc_weight(c, mp):
    """The alignment weight of the incoming accumulator: 2**exponent, at least ``acc_lo``; ``zero_w`` for 0."""
    p = pow2_of(c)
    return (p if p > mp.acc_lo else mp.acc_lo) if p != 0.0 else mp.zero_w


@jit
def _block_step(a, ea, B, EB, c, n, lo, hi, mp, w):
    """One block-FMA step, k in [lo, hi) (at most one block), for outputs c[:n] (updated in place). Alignment
    weights are powers of two held as float64 (``em[j]`` = 2**emax of output j), so every loop vectorizes (see
    simfloat._lanes). The caller has checked that every weight lies within 2**+-450 (see :func:`row_mma`)."""
    em = w.em
    for j in range(n):
        em[j] = _acc_weight(c[j], mp)
    _weights(a, ea, B, EB, em, lo, hi, n, mp.align_sum)
    _scales(c, n, mp, w)
    if mp.group > 1:
        _terms_grouped(a, B, w.sc, w.tot, w.part, lo, hi, n, mp.group)
    else:
        _terms(a, B, w.sc, w.tot, lo, hi, n)
    _normalize(c, n, mp.acc, w)


@jit
def _block_step2(a, ea, a2, ea2, B, EB, c, c2, n, lo, hi, mp, w, w2):
    """:func:`_block_step` for two rows (``a`` into ``c`` with scratch ``w``, ``a2`` into ``c2`` with ``w2``),
    the same bits as two calls."""
    em, em2 = w.em, w2.em
    for j in range(n):
        em[j] = _acc_weight(c[j], mp)
        em2[j] = _acc_weight(c2[j], mp)
    _weights2(a, ea, a2, ea2, B, EB, em, em2, lo, hi, n, mp.align_sum)
    _scales(c, n, mp, w)
    _scales(c2, n, mp, w2)
    if mp.group > 1:
        _terms_grouped(a, B, w.sc, w.tot, w.part, lo, hi, n, mp.group)
        _terms_grouped(a2, B, w2.sc, w2.tot, w2.part, lo, hi, n, mp.group)
    else:
        _terms2(a, a2, B, w.sc, w2.sc, w.tot, w2.tot, lo, hi, n)
    _normalize(c, n, mp.acc, w)
    _normalize(c2, n, mp.acc, w2)


@jit
def _block_row(a, ea, B, EB, c, n, k0, k1, mp, w):
    """Block-FMA steps over k in [k0, k1) for outputs c[:n] (updated in place), block by block."""
    lo = k0
    while lo < k1:
        hi = min(k1, lo + mp.block)
        _block_step(a, ea, B, EB, c, n, lo, hi, mp, w)
        lo = hi


_F32_LO = 2.0**-126  # float32's least normal magnitude
_B32_TOP = 2.0**100  # the block float32 form shifts B so that its largest weight is this


@ljit
def _raise32(m, x):
    """:func:`_raise` in float32."""
    return x if x > m else m + np.float32(0.0)


_LOW41 = np.uint64((1 << 41) - 1)  # a float64's fraction bits below its 11 leading ones
_EXP_BITS = np.uint64(0x7FF << 52)  # a float64's exponent field (inf's bits: the least weight of no value)


@ljit
def _span32(x, ex, kk):
    """For the block float32 form: (the largest weight in ``ex[:kk]``, the least weight 2**floor(log2 |x|) of a
    nonzero ``x[:kk]`` (inf if none), whether every value has at most 12 significant bits, so that a product of
    two is exact in float32). Values are zero or normal float64 (tame); the reductions run on the bits (integer
    max, min and or vectorize, float ones do not without fastmath)."""
    hi = np.uint64(0)
    lo = _EXP_BITS
    low = np.uint64(0)
    for k in range(kk):
        bx = f64_bits(x[k])
        pb = bx & _EXP_BITS
        hi = max(hi, f64_bits(ex[k]))
        lo = min(lo, pb if pb != 0 else _EXP_BITS)
        low |= bx & _LOW41
    return bits_f64(hi), bits_f64(lo), low == 0


@ljit
def _shift32(a, ea, kk, mp):
    """The power of two a row ``a`` is scaled by in the block float32 form (its largest weight becomes 1), or 0
    when the form does not apply to it: values with over 12 significant bits, or a nonzero product that would
    not be a normal float32, or whose block's term scale 2**F / emax would pass 2**126, or a weight below
    float32's normal range. With B shifted by ``mp.b_shift`` (largest weight 2**100), every product is below
    2**102 and every weight and product is exact in float32."""
    hi, lo, ok = _span32(a, ea, kk)
    if not ok:
        return 0.0
    if hi == 0.0:
        return 1.0
    sh = recip_pow2(hi)
    need = max(_F32_LO, mp.two_f * 2.0**-126)
    if lo * sh < _F32_LO or lo * sh * mp.b_lo < need:
        return 0.0
    return sh


@ljit
def _load32(a, ea, sh, a32, e32, kk):
    for k in range(kk):
        a32[k] = np.float32(a[k] * sh)
        e32[k] = np.float32(ea[k] * sh)


@ljit
def _weights32(e, EB, em, lo, hi, n):
    """:func:`_weights` (exponent-sum alignment) in float32 on shifted weights."""
    k = lo
    while k + 4 <= hi:
        e0, e1, e2, e3 = e[k], e[k + 1], e[k + 2], e[k + 3]
        r0, r1, r2, r3 = EB[k], EB[k + 1], EB[k + 2], EB[k + 3]
        for j in range(n):
            em[j] = _raise32(em[j], max(max(e0 * r0[j], e1 * r1[j]), max(e2 * r2[j], e3 * r3[j])))
        k += 4
    while k < hi:
        e0, r0 = e[k], EB[k]
        for j in range(n):
            em[j] = _raise32(em[j], e0 * r0[j])
        k += 1


@ljit
def _weights32_2(e, e2, EB, em, em2, lo, hi, n):
    """:func:`_weights32` for two rows (each load of EB serves both)."""
    k = lo
    while k + 4 <= hi:
        e0, e1, e2_, e3 = e[k], e[k + 1], e[k + 2], e[k + 3]
        f0, f1, f2, f3 = e2[k], e2[k + 1], e2[k + 2], e2[k + 3]
        r0, r1, r2, r3 = EB[k], EB[k + 1], EB[k + 2], EB[k + 3]
        for j in range(n):
            x0, x1, x2, x3 = r0[j], r1[j], r2[j], r3[j]
            em[j] = _raise32(em[j], max(max(e0 * x0, e1 * x1), max(e2_ * x2, e3 * x3)))
            em2[j] = _raise32(em2[j], max(max(f0 * x0, f1 * x1), max(f2 * x2, f3 * x3)))
        k += 4
    while k < hi:
        e0, f0, r0 = e[k], e2[k], EB[k]
        for j in range(n):
            em[j] = _raise32(em[j], e0 * r0[j])
            em2[j] = _raise32(em2[j], f0 * r0[j])
        k += 1


@ljit
def _terms32(a, B, s, t, lo, hi, n):
    """:func:`_terms` in float32: each product (exact) times its scale (exact: a power of two, no overflow, a
    normal product) truncated toward zero by the conversion to int32, summed in int32 (exact: ``mp.sums32``)."""
    k = lo
    while k + 4 <= hi:
        a0, a1, a2, a3 = a[k], a[k + 1], a[k + 2], a[k + 3]
        r0, r1, r2, r3 = B[k], B[k + 1], B[k + 2], B[k + 3]
        for j in range(n):
            sj = s[j]
            t01 = np.int32((a0 * r0[j]) * sj) + np.int32((a1 * r1[j]) * sj)
            t23 = np.int32((a2 * r2[j]) * sj) + np.int32((a3 * r3[j]) * sj)
            t[j] += t01 + t23
        k += 4
    while k < hi:
        a0, r0 = a[k], B[k]
        for j in range(n):
            t[j] += np.int32((a0 * r0[j]) * s[j])
        k += 1


@ljit
def _terms32_2(a, a2, B, s, s2, t, t2, lo, hi, n):
    """:func:`_terms32` for two rows (each load of B serves both)."""
    k = lo
    while k + 4 <= hi:
        a0, a1, a2_, a3 = a[k], a[k + 1], a[k + 2], a[k + 3]
        b0, b1, b2, b3 = a2[k], a2[k + 1], a2[k + 2], a2[k + 3]
        r0, r1, r2, r3 = B[k], B[k + 1], B[k + 2], B[k + 3]
        for j in range(n):
            x0, x1, x2, x3 = r0[j], r1[j], r2[j], r3[j]
            sj, sj2 = s[j], s2[j]
            t[j] += (np.int32((a0 * x0) * sj) + np.int32((a1 * x1) * sj)) + (
                np.int32((a2_ * x2) * sj) + np.int32((a3 * x3) * sj)
            )
            t2[j] += (np.int32((b0 * x0) * sj2) + np.int32((b1 * x1) * sj2)) + (
                np.int32((b2 * x2) * sj2) + np.int32((b3 * x3) * sj2)
            )
        k += 4
    while k < hi:
        a0, b0, r0 = a[k], a2[k], B[k]
        for j in range(n):
            x0 = r0[j]
            t[j] += np.int32((a0 * x0) * s[j])
            t2[j] += np.int32((b0 * x0) * s2[j])
        k += 1


@ljit
def _scales32(c, n, mp, w, sh):
    """:func:`_scales` for the float32 form of a row shifted by ``sh`` (its products by ``sh * mp.b_shift``):
    the alignment weight from the accumulator's (float64) and the shifted products' largest (``w.em32``), the
    term scale both in float64 and shifted into float32 (0 where it would pass 2**126: then every product of
    the block is zero), the accumulator's own term; the int32 term sums ``w.t32`` cleared."""
    em32, s32, t32, back, tot = w.em32, w.s32, w.t32, w.back, w.tot
    shift = sh * mp.b_shift
    inv = 1.0 / shift
    two_f = mp.two_f
    inv_f = 1.0 / two_f
    for j in range(n):
        e = max(_acc_weight(c[j], mp), np.float64(em32[j]) * inv)
        s = two_f * recip_pow2(e) if e != 0.0 else 0.0
        back[j] = e * inv_f
        tot[j] = np.trunc(c[j] * s) + 0.0
        v = s * inv
        s32[j] = np.float32(v if v <= 2.0**126 else 0.0)
        t32[j] = 0


@ljit
def _sum32(n, w):
    tot, t32 = w.tot, w.t32
    for j in range(n):
        tot[j] += np.float64(t32[j])


@jit
def _block_step32(a, e, sh, B32, EB32, c, n, lo, hi, mp, w):
    """:func:`_block_step` in the float32 form: ``a``, ``e`` the row's values and weights shifted by ``sh``
    (float32), ``B32``, ``EB32`` B's shifted by ``mp.b_shift``; the same bits."""
    em = w.em32
    for j in range(n):
        em[j] = np.float32(0.0)
    _weights32(e, EB32, em, lo, hi, n)
    _scales32(c, n, mp, w, sh)
    _terms32(a, B32, w.s32, w.t32, lo, hi, n)
    _sum32(n, w)
    _normalize(c, n, mp.acc, w)


@jit
def _block_step32_2(a, e, sh, a2, e2, sh2, B32, EB32, c, c2, n, lo, hi, mp, w, w2):
    """:func:`_block_step32` for two rows, the same bits as two calls."""
    em, em2 = w.em32, w2.em32
    for j in range(n):
        em[j] = np.float32(0.0)
        em2[j] = np.float32(0.0)
    _weights32_2(e, e2, EB32, em, em2, lo, hi, n)
    _scales32(c, n, mp, w, sh)
    _scales32(c2, n, mp, w2, sh2)
    _terms32_2(a, a2, B32, w.s32, w2.s32, w.t32, w2.t32, lo, hi, n)
    _sum32(n, w)
    _sum32(n, w2)
    _normalize(c, n, mp.acc, w)
    _normalize(c2, n, mp.acc, w2)


@jit
def _tame(x, n):
    """x[:n] zero or of magnitude within 2**+-450: products of two stay within 2**+-900."""
    ok = True
    for j in range(n):
        a = np.abs(x[j])
        ok &= (a == 0.0) | ((a >= _TINY) & (a <= _HUGE))
    return ok


@jit
def _on_grid(c, n, r):
    """Whether c[:n] are values of the lane's format (NaN aside)."""
    ok = True
    for j in range(n):
        v = c[j]
        ok &= (lround(v, r) == v) | (v != v)
    return ok


@jit
def _fits32(c, n):
    for j in range(n):
        if np.float64(np.float32(c[j])) != c[j] and c[j] == c[j]:
            return False
    return True


@jit
def _seq_row(a, B, c, n, k0, k1, mp, w):
    """Sequential steps over k in [k0, k1): c[j] = round(c[j] + a[k] * B[k, j]) for j < n (``w``: scratch)."""
    native = mp.native
    if native == N_FMA32 and not _fits32(c, n):
        native = N_NONE  # an accumulator that is not a float32 value: round the exact sums instead
    if native == N_FMA64:
        for k in range(k0, k1):
            ak, r = a[k], B[k]
            for j in range(n):
                c[j] = fma64(ak, r[j], c[j])
    elif native == N_MULADD64:
        for k in range(k0, k1):
            ak, r = a[k], B[k]
            for j in range(n):
                c[j] = c[j] + ak * r[j]
    elif native == N_FMA32:  # the accumulators held as float32 (exact: they are float32 values) in between
        c32 = w.c32
        for j in range(n):
            c32[j] = np.float32(c[j])
        k = k0
        while k + 4 <= k1:  # four steps per pass over j, in order
            a0, a1, a2, a3 = np.float32(a[k]), np.float32(a[k + 1]), np.float32(a[k + 2]), np.float32(a[k + 3])
            r0, r1, r2, r3 = B[k], B[k + 1], B[k + 2], B[k + 3]
            for j in range(n):
                t = fma32(a1, np.float32(r1[j]), fma32(a0, np.float32(r0[j]), c32[j]))
                c32[j] = fma32(a3, np.float32(r3[j]), fma32(a2, np.float32(r2[j]), t))
            k += 4
        while k < k1:
            ak, r = np.float32(a[k]), B[k]
            for j in range(n):
                c32[j] = fma32(ak, np.float32(r[j]), c32[j])
            k += 1
        for j in range(n):
            c[j] = np.float64(c32[j])
    elif mp.round_products and mp.plain_sum and mp.acc.mode == RoundingMode.NEAREST_EVEN and _on_grid(c, n, mp.acc):
        for k in range(k0, k1):
            ak, r = a[k], B[k]
            for j in range(n):
                c[j] = lround_ne(c[j] + lround_ne(ak * r[j], mp.prod), mp.acc)
    elif mp.round_products and mp.plain_sum and _on_grid(c, n, mp.acc):
        for k in range(k0, k1):
            ak, r = a[k], B[k]
            for j in range(n):
                c[j] = lround(c[j] + lround(ak * r[j], mp.prod), mp.acc)
    elif mp.round_products:
        for k in range(k0, k1):
            ak, r = a[k], B[k]
            for j in range(n):
                c[j] = ladd(c[j], lround(ak * r[j], mp.prod), mp.acc)
    else:
        for k in range(k0, k1):
            ak, r = a[k], B[k]
            for j in range(n):
                c[j] = ladd(c[j], ak * r[j], mp.acc)


@jit
def _inner(a, ea, B, EB, c, n, k0, k1, mp, w):
    if mp.kind == K_BLOCK:
        _block_row(a, ea, B, EB, c, n, k0, k1, mp, w)
    else:
        _seq_row(a, B, c, n, k0, k1, mp, w)


@jit
def row_mma(a, ea, B, EB, B32, EB32, c, n, mp, w):
    """``c[j] = model(c[j] + sum_k a[k] * B[k, j])`` for j < n, as ``dot_acc(a, B[:, j], c[j], mp.ap)``.

    Args:
        a: (K,) operand row (already in the model's input format when it has one).
        ea: (K,) alignment weights of ``a`` (:func:`operand_powers`; block FMA with exponent-sum alignment
            only, else ignored).
        B: (K, >= n) operand, C-contiguous. EB: its weights (as ``ea``).
        B32, EB32: (K, >= n) B and its weights in the float32 block form (:func:`operand32`), or empty.
        c: (>= n,) incoming accumulator; c[:n] is overwritten with the result.
        n: number of outputs.
        mp: :class:`MMA` record. w: :class:`Work` of width >= n (and >= K for the float32 block form).
    """
    kk = a.shape[0]
    if not mp.fast:
        for j in range(n):
            c[j] = dot_acc(a, B[:, j], c[j], mp.ap)
        return
    c0 = w.c0
    for j in range(n):
        c0[j] = c[j]
    if mp.kind == K_BLOCK and not (mp.tame and _tame(a, kk) and _tame(c, n)):
        for j in range(n):  # weights beyond 2**+-450 (or inf/NaN, float64 subnormals): the reference path
            c[j] = dot_acc(a, B[:, j], c0[j], mp.ap)
        return
    sh = 0.0
    if mp.kind == K_BLOCK and mp.chunk == 0 and mp.sums32 and mp.b_shift > 0.0:
        if B32.shape[0] == kk and w.a32.shape[0] >= kk:
            sh = _shift32(a, ea, kk, mp)
    if sh > 0.0:
        _load32(a, ea, sh, w.a32, w.e32, kk)
        lo = np.int64(0)  # not the literal 0: the steps compile once, for int64
        while lo < kk:
            hi = min(kk, lo + mp.block)
            _block_step32(w.a32, w.e32, sh, B32, EB32, c, n, lo, hi, mp, w)
            lo = hi
    elif mp.chunk == 0:
        _inner(a, ea, B, EB, c, n, kk - kk, kk, mp, w)  # k0 an int64, not the literal 0: one compilation
    else:
        size = mp.chunk if mp.chunk > 0 else max(1, -((-kk) // (-mp.chunk)))
        part = w.part
        lo = np.int64(0)  # not the literal 0: the steps compile once, for int64
        while lo < kk:
            hi = min(kk, lo + size)
            for j in range(n):
                part[j] = 0.0
            _inner(a, ea, B, EB, part, n, lo, hi, mp, w)
            for j in range(n):
                c[j] = ladd(c[j], part[j], mp.outer)
            lo = hi
    if mp.kind == K_BLOCK:
        for j in range(n):  # an accumulator that overflowed to inf / NaN on the way: the reference path
            if c[j] - c[j] != 0.0:
                c[j] = dot_acc(a, B[:, j], c0[j], mp.ap)


class BStack(NamedTuple):
    """A stack of B operands of the row kernels in the forms they read: ``x`` (T, K, N) values, ``w`` their
    alignment weights, ``x32``, ``w32`` the float32 forms (:func:`operand32`; (T, 0, 0) where none applies)."""

    x: np.ndarray
    w: np.ndarray
    x32: np.ndarray
    w32: np.ndarray


@ljit
def tile_of(st, t):
    """B operand ``t`` of a :class:`BStack`: (values, weights, float32 values, float32 weights)."""
    return st.x[t], st.w[t], st.x32[t], st.w32[t]


def b_stack(mp: MMA, x: np.ndarray, w: np.ndarray) -> tuple[MMA, BStack]:
    """The :class:`BStack` of B operands ``x`` (T, K, N) with weights ``w`` for :func:`row_mma`, and the record
    that goes with it (:func:`operand32`)."""
    mp, x32, w32 = operand32(mp, x, w, rows=False)
    return mp, BStack(x, w, x32, w32)


class Rows(NamedTuple):
    """Scratch space of one thread for :func:`rows_mma`: up to ``g`` rows of up to ``n`` outputs."""

    w: Work
    w2: Work
    c0: np.ndarray  # (g, n) the incoming accumulators
    live: np.ndarray  # (g,) rows on the fast path
    idx: np.ndarray  # (g,) their indices
    c32: np.ndarray  # (g, n) float32 accumulators of the float32 FMA loop


@jit
def rows_work(g, n):
    """Scratch for :func:`rows_mma` on up to ``g`` rows of up to ``n`` outputs."""
    return Rows(
        work(n),
        work(n),
        np.empty((g, n)),
        np.zeros(g, dtype=np.bool_),
        np.zeros(g, dtype=np.int64),
        np.empty((g, n), dtype=np.float32),
    )


@jit
def _fma32_4(a0, a1, a2, a3, B32, d0, d1, d2, d3, n, kk):
    """Four rows of the float32 FMA loop: d_i[j] = fma(a_i[k], B32[k, j], d_i[j]) for k = 0 .. kk-1 in order;
    two k per pass over j, each load of B serving the four rows."""
    k = 0
    while k + 2 <= kk:
        x0, x1 = B32[k], B32[k + 1]
        p0, q0 = np.float32(a0[k]), np.float32(a0[k + 1])
        p1, q1 = np.float32(a1[k]), np.float32(a1[k + 1])
        p2, q2 = np.float32(a2[k]), np.float32(a2[k + 1])
        p3, q3 = np.float32(a3[k]), np.float32(a3[k + 1])
        for j in range(n):
            y0, y1 = x0[j], x1[j]
            d0[j] = fma32(q0, y1, fma32(p0, y0, d0[j]))
            d1[j] = fma32(q1, y1, fma32(p1, y0, d1[j]))
            d2[j] = fma32(q2, y1, fma32(p2, y0, d2[j]))
            d3[j] = fma32(q3, y1, fma32(p3, y0, d3[j]))
        k += 2
    while k < kk:
        x0 = B32[k]
        p0, p1, p2, p3 = np.float32(a0[k]), np.float32(a1[k]), np.float32(a2[k]), np.float32(a3[k])
        for j in range(n):
            y0 = x0[j]
            d0[j] = fma32(p0, y0, d0[j])
            d1[j] = fma32(p1, y0, d1[j])
            d2[j] = fma32(p2, y0, d2[j])
            d3[j] = fma32(p3, y0, d3[j])
        k += 1


@jit
def _fma32_1(a0, B32, d0, n, kk):
    """One row of the float32 FMA loop (:func:`_fma32_4`), four k per pass over j."""
    k = 0
    while k + 4 <= kk:
        x0, x1, x2, x3 = B32[k], B32[k + 1], B32[k + 2], B32[k + 3]
        p0, p1, p2, p3 = np.float32(a0[k]), np.float32(a0[k + 1]), np.float32(a0[k + 2]), np.float32(a0[k + 3])
        for j in range(n):
            d0[j] = fma32(p3, x3[j], fma32(p2, x2[j], fma32(p1, x1[j], fma32(p0, x0[j], d0[j]))))
        k += 4
    while k < kk:
        x0, p0 = B32[k], np.float32(a0[k])
        for j in range(n):
            d0[j] = fma32(p0, x0[j], d0[j])
        k += 1


@jit
def _fma32_rows(a, B32, c, g, n, rs):
    """The float32 FMA loop (``Sequential("float32")`` on float32 operands, ``B32`` holding B's values) for the
    rows a[:g] into c[:g, :n]: four rows at a time. A row whose incoming accumulators are not all float32 values
    is left as it is and marked False in ``rs.live`` (the caller runs :func:`row_mma` on it, which rounds exact
    sums instead)."""
    kk = a.shape[1]
    c32, live, idx = rs.c32, rs.live, rs.idx
    nl = 0
    for i in range(g):
        live[i] = _fits32(c[i], n)
        if live[i]:
            ci, di = c[i], c32[nl]
            for j in range(n):
                di[j] = np.float32(ci[j])
            idx[nl] = i
            nl += 1
    t = 0
    while t + 4 <= nl:
        i0, i1, i2, i3 = idx[t], idx[t + 1], idx[t + 2], idx[t + 3]
        _fma32_4(a[i0], a[i1], a[i2], a[i3], B32, c32[t], c32[t + 1], c32[t + 2], c32[t + 3], n, kk)
        t += 4
    while t < nl:
        _fma32_1(a[idx[t]], B32, c32[t], n, kk)
        t += 1
    for t in range(nl):
        ci, di = c[idx[t]], c32[t]
        for j in range(n):
            ci[j] = np.float64(di[j])


@jit
def _f64_4(a0, a1, a2, a3, B, d0, d1, d2, d3, n, kk, fused):
    """Four rows of the float64 loop: d_i[j] = fma(a_i[k], B[k, j], d_i[j]) (``fused``) or
    d_i[j] + a_i[k] * B[k, j] (product rounded first) for k = 0 .. kk-1 in order; each load of B serves the
    four rows."""
    if fused:
        for k in range(kk):
            x0 = B[k]
            p0, p1, p2, p3 = a0[k], a1[k], a2[k], a3[k]
            for j in range(n):
                y0 = x0[j]
                d0[j] = fma64(p0, y0, d0[j])
                d1[j] = fma64(p1, y0, d1[j])
                d2[j] = fma64(p2, y0, d2[j])
                d3[j] = fma64(p3, y0, d3[j])
    else:
        for k in range(kk):
            x0 = B[k]
            p0, p1, p2, p3 = a0[k], a1[k], a2[k], a3[k]
            for j in range(n):
                y0 = x0[j]
                d0[j] = d0[j] + p0 * y0
                d1[j] = d1[j] + p1 * y0
                d2[j] = d2[j] + p2 * y0
                d3[j] = d3[j] + p3 * y0


@jit
def _f64_rows(a, B, c, g, n, mp, w):
    """The float64 loops of :func:`_seq_row` (``N_FMA64``, ``N_MULADD64``) for the rows a[:g] into c[:g, :n],
    four rows at a time (the same operations per output, in the same order)."""
    kk = a.shape[1]
    fused = mp.native == N_FMA64
    i = 0
    while i + 4 <= g:
        _f64_4(a[i], a[i + 1], a[i + 2], a[i + 3], B, c[i], c[i + 1], c[i + 2], c[i + 3], n, kk, fused)
        i += 4
    while i < g:
        _seq_row(a[i], B, c[i], n, kk - kk, kk, mp, w)  # k0 an int64 (as _inner's), not the literal 0
        i += 1


_GROUP = 16  # rows of a that meet each block of k in turn: the block's rows of B and EB stay in cache


@jit
def _block_rows(a, ea, B, EB, B32, EB32, out, n, mp, w, w2, c0, live, idx):
    """:func:`row_mma` for every row of ``a`` (g, K) into ``out`` (g, >= n) under an unchunked fast block-FMA
    model, block of k by block: each block of B is read by all g rows while it is in cache (a row's outputs
    depend only on its own steps, taken in the same order, so the bits are those of row_mma). ``c0`` (g, >= n)
    ``live`` and ``idx`` (g,) are scratch; rows are taken two at a time (:func:`_block_step2`). Where ``B32``,
    ``EB32`` hold B and its weights in the float32 form (:func:`block32`), rows it applies to
    (:func:`_shift32`) take the float32 steps (:func:`_block_step32_2`), the others the float64 ones."""
    g, kk = a.shape[0], a.shape[1]
    for i in range(g):
        ci = out[i]
        for j in range(n):
            c0[i, j] = ci[j]
        live[i] = mp.tame and _tame(a[i], kk) and _tame(ci, n)
        if not live[i]:
            for j in range(n):  # weights beyond 2**+-450 (or inf/NaN, float64 subnormals): the reference path
                ci[j] = dot_acc(a[i], B[:, j], c0[i, j], mp.ap)
    use32 = mp.sums32 and mp.b_shift > 0.0 and B32.shape[0] == kk
    sh = np.zeros(g)
    a32 = np.empty((g, kk if use32 else 0), dtype=np.float32)
    e32 = np.empty((g, kk if use32 else 0), dtype=np.float32)
    n32 = 0
    for i in range(g):  # the float32 rows first (idx[:n32]), then the float64 ones
        if live[i] and use32:
            sh[i] = _shift32(a[i], ea[i], kk, mp)
            if sh[i] > 0.0:
                _load32(a[i], ea[i], sh[i], a32[n32], e32[n32], kk)
                idx[n32] = i
                n32 += 1
    nl = n32
    for i in range(g):
        if live[i] and sh[i] == 0.0:
            idx[nl] = i
            nl += 1
    lo = np.int64(0)  # not the literal 0: the steps compile once, for int64
    while lo < kk:
        hi = min(kk, lo + mp.block)
        for t in range(0, n32 - 1, 2):
            i, i2 = idx[t], idx[t + 1]
            _block_step32_2(
                a32[t], e32[t], sh[i], a32[t + 1], e32[t + 1], sh[i2], B32, EB32, out[i], out[i2], n, lo, hi, mp, w, w2
            )
        if n32 % 2 == 1:
            i = idx[n32 - 1]
            _block_step32(a32[n32 - 1], e32[n32 - 1], sh[i], B32, EB32, out[i], n, lo, hi, mp, w)
        for t in range(n32, nl - 1, 2):
            i, i2 = idx[t], idx[t + 1]
            _block_step2(a[i], ea[i], a[i2], ea[i2], B, EB, out[i], out[i2], n, lo, hi, mp, w, w2)
        if (nl - n32) % 2 == 1:
            i = idx[nl - 1]
            _block_step(a[i], ea[i], B, EB, out[i], n, lo, hi, mp, w)
        lo = hi
    for i in range(g):
        if live[i]:
            for j in range(n):  # an accumulator that overflowed to inf / NaN on the way: the reference path
                if out[i, j] - out[i, j] != 0.0:
                    out[i, j] = dot_acc(a[i], B[:, j], c0[i, j], mp.ap)


@jit
def rows_mma(a, ea, B, EB, B32, EB32, c, g, n, mp, rs):
    """:func:`row_mma` for the rows ``a[:g]`` into ``c[:g]`` (the same bits, row by row), with each load of ``B``
    serving several rows: unchunked fast block FMA rows meet each block of k in turn (:func:`_block_rows`, in
    the float32 form where ``B32``, ``EB32`` hold it: :func:`block32`); the float64 loops run four rows at a
    time; so does the float32 FMA loop, on ``B32``, ``B``'s values as float32 (:func:`operand32`). Pass
    empty arrays for a B that was not converted: the rows then take the float64 forms.

    Args:
        a: (>= g, K) operand rows; ea: their weights. B: (K, >= n), EB: its weights; B32, EB32: (K, >= n)
            float32 or empty. c: (>= g, >= n) incoming accumulators, overwritten. mp: :class:`MMA`.
            rs: :class:`Rows` of at least g rows and n outputs.
    """
    if mp.fast and mp.kind == K_BLOCK and mp.chunk == 0:
        _block_rows(a[:g], ea[:g], B, EB, B32, EB32, c[:g], n, mp, rs.w, rs.w2, rs.c0, rs.live, rs.idx)
        return
    if mp.fast and (mp.native == N_FMA64 or mp.native == N_MULADD64) and mp.chunk == 0:
        _f64_rows(a, B, c, g, n, mp, rs.w)
        return
    if mp.fast and mp.native == N_FMA32 and mp.chunk == 0 and B32.shape[0] == B.shape[0]:
        _fma32_rows(a, B32, c, g, n, rs)
        for i in range(g):
            if not rs.live[i]:
                row_mma(a[i], ea[i], B, EB, B32, EB32, c[i], n, mp, rs.w)
        return
    for i in range(g):
        row_mma(a[i], ea[i], B, EB, B32, EB32, c[i], n, mp, rs.w)


@jit
def _mm_units(lo, hi, a, ea, b, eb, b32, eb32, out, mp):
    m, n = a.shape[1], b.shape[2]
    f64 = mp.native == N_FMA64 or mp.native == N_MULADD64
    if mp.fast and mp.chunk == 0 and (mp.kind == K_BLOCK or f64 or b32.shape[1] > 0):
        rs = rows_work(_GROUP, n)  # rows in groups (rows_mma)
        r = lo
        while r < hi:
            bi = r // m
            i = r - bi * m
            g = min(hi - r, m - i, _GROUP)  # rows of one batch entry
            rows_mma(
                a[bi, i : i + g], ea[bi, i : i + g], b[bi], eb[bi], b32[bi], eb32[bi], out[bi, i : i + g], g, n, mp, rs
            )
            r += g
        return
    w = work(n)
    for r in range(lo, hi):
        bi = r // m
        row_mma(a[bi, r - bi * m], ea[bi, r - bi * m], b[bi], eb[bi], b32[bi], eb32[bi], out[bi, r - bi * m], n, mp, w)


def operand32(mp: MMA, b: np.ndarray, eb: np.ndarray, *, rows: bool = True) -> tuple[MMA, np.ndarray, np.ndarray]:
    """The float32 forms of the B operands ``b`` (L, K, N) with weights ``eb`` for :func:`rows_mma` (``rows``)
    or :func:`row_mma`, and the record that goes with them: for the float32 FMA loop, which only rows_mma runs
    on float32 copies, ``b`` as float32 when ``rows`` (its values are float32 values: :func:`for_operands`
    checked); for block FMA whose block sums fit int32 (``mp.sums32``), ``b`` and ``eb`` shifted by a power of
    two (largest weight 2**100, recorded as ``b_shift`` with the least nonzero weight ``b_lo``) when every value
    has at most 12 significant bits and the shifted ones stay normal float32. Otherwise (L, 0, 0) arrays: the
    float64 forms apply."""
    empty = np.zeros((b.shape[0], 0, 0), dtype=np.float32)
    if not (mp.fast and mp.chunk == 0) or b.size == 0:
        return mp, empty, empty
    if mp.native == N_FMA32:
        return mp, (b.astype(np.float32) if rows else empty), empty
    if not (mp.kind == K_BLOCK and mp.sums32 and mp.tame):
        return mp, empty, empty
    hi, lo, ok = _span32(np.ascontiguousarray(b).reshape(-1), np.ascontiguousarray(eb).reshape(-1), b.size)
    shift = _B32_TOP / hi if hi > 0.0 else 1.0
    if not ok or lo * shift < _F32_LO:
        return mp, empty, empty
    b32 = (b * shift).astype(np.float32)
    return mp._replace(b_shift=float(shift), b_lo=float(lo * shift)), b32, (eb * shift).astype(np.float32)


def matmul_rows(a: np.ndarray, b: np.ndarray, c: np.ndarray, model: Model) -> np.ndarray:
    """``c + a @ b`` for contiguous float64 (L, M, K), (L, K, N), (L, M, N) arrays under ``model``, row by row
    on all threads (the driver of :func:`simfloat.accumulate.matmul`)."""
    mp = mma(model)
    ai, bi = round_operands(a, mp), round_operands(b, mp)
    mp = for_operands(mp, ai, bi)
    ea, eb = np.empty(ai.shape), np.empty(bi.shape)
    operand_powers(ai.reshape(-1), ea.reshape(-1), mp.opnd_emin)
    operand_powers(bi.reshape(-1), eb.reshape(-1), mp.opnd_emin)
    out = np.array(c, dtype=np.float64, copy=True)
    mp, b32, eb32 = operand32(mp, bi, eb)
    if out.shape[0] * out.shape[1] > 0:
        run_rows(_mm_units, out.shape[0] * out.shape[1], ai, ea, bi, eb, b32, eb32, out, mp)
    return out


def scaled_mma(model: BlockFMA) -> MMA:
    """The row kernels' record of a block-scaled kind (``model.scale_block > 0``), for scaled operands: with
    ``a * sa`` and ``b * sb`` (elements times their per-element scales: exact products) as the operands and
    :func:`scaled_powers` as their alignment weights, the unscaled block-FMA step on them gives the terms and
    alignment of :func:`simfloat.accumulate.dot_scaled_acc`; a grouped kind (``mxf4``, ``nvf4``) sums each group
    of ``model.group`` scaled products exactly before truncation (the group shares its scales). The record's
    ``ap`` is that of the unscaled model: the row kernels' own fallback (``dot_acc`` on rows that are not
    tame, or whose accumulator overflows) would not give the scaled model's bits, so callers check
    (:func:`scaled_ok`) that it cannot happen."""
    plain = replace(model, scale_block=0, group=1, align="exponent_sum", operand_emin_b=None)
    # the float32 block form does not apply: its bounds take the weights from the elements, not their scales
    return mma(plain)._replace(group=model.group, sums32=False)


def scaled_weights(x: np.ndarray, s: np.ndarray, model: BlockFMA, *, b: bool) -> np.ndarray:
    """:func:`scaled_powers` of the elements ``x`` with per-element scales ``s`` (same shape), as the A operand
    or (``b``) the B operand of the block-scaled ``model``."""
    ap = acc_params(model)
    x64, s64 = np.ascontiguousarray(x, dtype=np.float64), np.ascontiguousarray(s, dtype=np.float64)
    out = np.empty(x64.shape)
    emin = float(2.0 ** (ap.opnd_emin_b if b else ap.opnd_emin))
    scaled_powers(x64.reshape(-1), s64.reshape(-1), out.reshape(-1), x64.size, emin, float(2.0**ap.scale_emin),
                  not ap.align_scale)  # fmt: skip
    return out


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


def scaled_ok(model: BlockFMA, bound: float, spans: tuple[int, int], *operands: np.ndarray) -> bool:
    """Whether the row kernels give the bits of a block-scaled ``model`` (:func:`scaled_mma`) on these scaled
    operands: every value tame (:func:`tame`), no accumulator beyond a quarter of the output format's largest
    value (``bound``: the largest possible |sum| of the products), and each group's sum exact in float64
    (``spans``: the bit spans of the A and B elements, :func:`format_span`)."""
    if not tame(*operands) or model.overflow != "round" or model.zero_sign != "exact":
        return False  # (the overflow / zero-sign rules other than IEEE's: the reference)
    if bound > _format(model.out_fmt).max / 4:
        return False
    return model.group == 1 or spans[0] + spans[1] + int(np.ceil(np.log2(model.group))) <= 53


def scaled_rows(
    a: np.ndarray, b: np.ndarray, sa: np.ndarray, sb: np.ndarray, c: np.ndarray, model: BlockFMA
) -> np.ndarray | None:
    """The block-scaled MMA of :func:`simfloat.accumulate.matmul_scaled` on the row kernels (:func:`scaled_mma`).
    Returns None (the caller then runs the reference) where :func:`scaled_ok` fails for the scaled operands and
    accumulator (a NaN scale, magnitudes beyond 2**+-450, a possible overflow, inexact group sums)."""
    ai = np.ascontiguousarray(a * sa)[None]
    bi = np.ascontiguousarray(b * sb)[None]
    with np.errstate(over="ignore", invalid="ignore"):
        bound = float(np.abs(ai[0]).max(initial=0.0) * np.abs(bi[0]).max(initial=0.0) * a.shape[1])
        bound += float(np.abs(c).max(initial=0.0))
    if not (bound == bound and scaled_ok(model, bound, (_span(a), _span(b)), ai, bi, c)):
        return None
    mp = for_operands(scaled_mma(model), ai, bi)
    ea = scaled_weights(a, sa, model, b=False)[None]
    eb = scaled_weights(b, sb, model, b=True)[None]
    out = np.array(c, dtype=np.float64, copy=True)[None]
    if out.size:
        none = np.zeros((1, 0, 0), dtype=np.float32)  # the block-scaled products: the float64 forms
        run_rows(_mm_units, out.shape[1], ai, ea, bi, eb, none, none, out, mp)
    return out[0]


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
