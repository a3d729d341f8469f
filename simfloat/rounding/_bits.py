"""The fast kernel of the deterministic modes: the same results as :func:`~simfloat.rounding.round_exact` with
``d == 0``, computed branch-free on the input's own bit pattern (float32 inputs in int32 lanes, float64 in int64)."""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from simfloat._jit import jit
from simfloat.formats import FloatFormat
from simfloat.formats import format as _format
from simfloat.rounding._modes import RoundingMode

# The same results as round_exact with d == 0 (the tests compare both with an exact oracle), computed on the
# input's own bit pattern, int32 for float32 inputs (8 lanes per AVX2 register) and int64 for float64, with
# selects only and the mode folded into per-mode constants, so that one loop serves every mode and LLVM
# vectorizes it.
#
# Target-normal range (|x| >= 2**emin): a positive float is E * 2**F + frac as an integer (F fraction bits),
# linear in the value within a binade and continuous across binades, so rounding that *integer* to a multiple
# of 2**base (base = F - m) rounds the value; a carry out of the fraction moves to the next binade, and past
# the largest finite value up to the bit pattern of infinity, which the overflow test catches. The input
# type's own subnormals are linear too.
#
# Target-subnormal range (|x| < 2**emin, when emin is above the input type's): the target's quantum is
# 2**(emin - m) for every x, so A = trunc(|x| * 2**(F - emin)) (exact: a power-of-two scaling, then an integer
# < 2**F) puts that quantum at bit ``base`` too, with the inexact low part folded into bit 0 as a sticky bit
# (base >= 2 keeps bit 0 strictly below the half-quantum bit, so every comparison with the half stays right).
# Rounding A, with lsb = 2**base: add a mode-dependent addend, then clear the low ``base`` bits, where
#   nearest-even: lsb/2 - 1 + (bit ``base`` of A)   nearest-away: lsb/2   toward zero: 0
#   up: lsb - 1 if x > 0 else 0   down: the mirror of up
#   odd: 0, then set bit ``base`` if the low bits were not all 0.


def _to_bits_impl(typingctx, x):
    width = {types.float32: 32, types.float64: 64}.get(x)
    if width is None:
        return None
    sig = (types.int32 if width == 32 else types.int64)(x)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(width))

    return sig, codegen


def _from_bits_impl(typingctx, b, like):
    if like not in (types.float32, types.float64) or not isinstance(b, types.Integer):
        return None
    width = like.bitwidth
    sig = like(b, like)

    def codegen(context, builder, signature, args):
        v = _resize(builder, args[0], signature.args[0].bitwidth, width)
        return builder.bitcast(v, ir.FloatType() if width == 32 else ir.DoubleType())

    return sig, codegen


def _narrow_impl(typingctx, v, like):
    if like not in (types.float32, types.float64) or not isinstance(v, types.Integer):
        return None
    width = like.bitwidth
    sig = (types.int32 if width == 32 else types.int64)(v, like)

    def codegen(context, builder, signature, args):
        return _resize(builder, args[0], signature.args[0].bitwidth, width)

    return sig, codegen


def _resize(builder, v, src: int, dst: int):
    if src > dst:
        return builder.trunc(v, ir.IntType(dst))
    if src < dst:
        return builder.sext(v, ir.IntType(dst))
    return v


_to_bits = intrinsic(_to_bits_impl)  # float32 -> int32, float64 -> int64 bit pattern
_from_bits = intrinsic(_from_bits_impl)  # integer bit pattern -> float of the type of ``like``
# numba computes integer arithmetic in 64 bits; truncating every intermediate back to the input's width lets
# LLVM narrow the float32 kernel to 32-bit lanes
_narrow = intrinsic(_narrow_impl)


class _BitParams(NamedTuple):
    """Constants of the fast kernel for one (format, input dtype, mode); integers are of the input's width."""

    keep: np.integer  # ~(lsb - 1): clears the dropped bits
    lsb: np.integer  # 2**base, base = F - m fraction bits dropped
    add0: np.integer  # rounding addend: add0 + (add_lsb if A & lsb) + (add_neg if x < 0 else add_pos)
    add_lsb: np.integer
    add_pos: np.integer
    add_neg: np.integer
    odd: np.integer  # lsb for round-to-odd, else 0: set when the dropped bits are not all 0
    abs_mask: np.integer  # all bits but the sign
    inf: np.integer  # bit pattern of +inf
    tiny_bits: np.integer  # bit pattern of 2**emin
    split_bits: np.integer  # tiny_bits if has_sub else 0: |x| below it takes the scaled formula
    max_bits: np.integer  # bit pattern of the largest finite value
    ovf_pos: np.integer  # what a positive / negative overflow gives (magnitude): inf, NaN or max
    ovf_neg: np.integer
    inf_out: np.integer  # what an infinite input gives (magnitude)
    quiet: np.integer  # the quiet-NaN bit: a NaN comes out quiet, sign and payload kept
    magic_bits: np.integer  # bits of 2**F: float(k) = from_bits(magic_bits + k) - 2**F for 0 <= k <= 2**F
    zero: np.integer
    has_sub: bool  # the target's subnormal range holds normal numbers of the input type
    tiny: np.floating  # 2**emin
    up: np.floating  # 2**(F - emin), of the input's float type
    down: np.floating  # 2**(emin - F)
    magic: np.floating  # 2**F
    neg_zero: bool
    ftz: bool  # subnormal results flush to zero
    ok: bool  # False: the format and mode need round_exact (the other fields are then placeholders)


@functools.lru_cache(maxsize=1024)
def _bit_params(f: FloatFormat, dtype: np.dtype, mode: int) -> _BitParams:
    """Constants of the fast kernel for inputs of ``dtype``; ``ok`` is False when round_exact must do it."""
    fi = np.finfo(dtype)
    frac = int(fi.nmant)
    base = frac - f.mantissa_bits
    has_sub = f.emin > int(fi.minexp)
    ok = not (
        mode == RoundingMode.STOCHASTIC
        or base < 2  # bit 0 must lie strictly below the half-quantum bit (it carries the sticky bit)
        or f.mantissa_bits == 0  # bit ``base`` would be the exponent's lowest bit, not the significand parity
        or not (f.signed and f.zero)  # unsigned or zero-less formats: NaN for negatives / zero (round_exact)
        or f.emin < int(fi.minexp)
        or f.emax >= int(fi.maxexp)
        or (has_sub and frac - f.emin >= int(fi.maxexp))  # 2**(F - emin) must be a finite input-type number
    )
    if not ok:
        return _placeholder(dtype)
    return _make_bit_params(f, dtype, mode, has_sub)


@functools.cache
def _placeholder(dtype: np.dtype) -> _BitParams:
    return _make_bit_params(_format("bfloat16"), dtype, 0, False)._replace(ok=False)


def _make_bit_params(f: FloatFormat, dtype: np.dtype, mode: int, has_sub: bool) -> _BitParams:
    fi = np.finfo(dtype)
    frac, ftype, itype = int(fi.nmant), dtype.type, (np.int32 if fi.bits == 32 else np.int64)
    base = frac - f.mantissa_bits
    scale = frac - f.emin if has_sub else 0

    def bits(v: float) -> int:
        return int(np.array(v, dtype=dtype).view(itype))

    lsb = 1 << base
    half = lsb >> 1
    add0, add_lsb, add_pos, add_neg, odd = {
        RoundingMode.NEAREST_EVEN: (half - 1, 1, 0, 0, 0),
        RoundingMode.NEAREST_AWAY: (half, 0, 0, 0, 0),
        RoundingMode.TOWARD_ZERO: (0, 0, 0, 0, 0),
        RoundingMode.UP: (0, 0, lsb - 1, 0, 0),
        RoundingMode.DOWN: (0, 0, 0, lsb - 1, 0),
        RoundingMode.ODD: (0, 0, 0, 0, lsb),
    }[RoundingMode(mode)]
    inf, max_bits = bits(np.inf), bits(f.max)
    policy = {"inf": inf, "nan": bits(np.nan), "saturate": max_bits}[f.overflow]
    # IEEE: overflow gives infinity (here: the policy's value) in the nearest modes and when rounding away
    # from zero, the largest finite value when rounding toward zero (and round-to-odd never overflows)
    away_pos = mode in (RoundingMode.NEAREST_EVEN, RoundingMode.NEAREST_AWAY, RoundingMode.UP)
    away_neg = mode in (RoundingMode.NEAREST_EVEN, RoundingMode.NEAREST_AWAY, RoundingMode.DOWN)
    i = itype
    return _BitParams(
        i(~(lsb - 1)), i(lsb), i(add0), i(add_lsb), i(add_pos), i(add_neg), i(odd),
        i((1 << (fi.bits - 1)) - 1), i(inf), i(bits(f.tiny)), i(bits(f.tiny) if has_sub else 0), i(max_bits),
        i(policy if away_pos else max_bits), i(policy if away_neg else max_bits),
        i(inf if f.has_infinity else policy), i(1 << (frac - 1)), i(bits(2.0**frac)), i(0), has_sub, ftype(f.tiny),
        ftype(2.0**scale), ftype(2.0**-scale), ftype(2.0**frac), f.has_negative_zero, not f.subnormals, True,
    )  # fmt: skip


@jit
def _round_normal(x, c):
    """``x`` rounded into the format and deterministic mode described by ``c``, when ``|x| >= 2**emin`` or
    the format's emin is the input type's (then the bit formula covers everything); other ``x`` come back
    unchanged (:func:`_round_any` rounds those). Specials and overflow included."""
    u = _to_bits(x)
    a = _narrow(u & c.abs_mask, x)
    s = _narrow(u ^ a, x)
    neg = s != 0
    add = c.add0 + (0 if (a & c.lsb) == 0 else c.add_lsb) + (c.add_neg if neg else c.add_pos)
    r = _narrow(((a + add) & c.keep) | (0 if (a & ~c.keep) == 0 else c.odd), x)
    if r > c.max_bits:
        r = c.ovf_neg if neg else c.ovf_pos
    if c.ftz and r < c.tiny_bits:
        r = c.zero
    if a >= c.inf:
        r = _narrow(a | c.quiet, x) if a > c.inf else c.inf_out  # NaN: quiet, payload kept; inf: the policy
    if r == 0 and not c.neg_zero:
        s = c.zero
    return x if a < c.split_bits else _from_bits(r | s, x)


@jit
def _round_any(x, c):
    """``x`` rounded as :func:`_round_normal` does, for every ``x`` also where the format's emin is above the
    input type's: both integers to round (the bit pattern, and for ``|x| < 2**emin`` the scaled
    ``trunc(|x| * 2**(F - emin))`` with its sticky bit) are computed and one is selected, so that one rounding
    step, branch-free, serves both and the loop over elements vectorizes in a single pass."""
    u = _to_bits(x)
    a0 = _narrow(u & c.abs_mask, x)
    s = _narrow(u ^ a0, x)
    neg = s != 0
    small = a0 < c.split_bits
    y = abs(x) * c.up  # garbage (possibly inf or NaN) where not small: not selected
    t = np.trunc(y)
    k = _narrow(_to_bits(t + c.magic) - c.magic_bits, x)  # int(t), exact for t < 2**F
    a_small = _narrow(k | (0 if t == y else 1), x)  # the sticky bit: x was not a multiple of 2**(emin - F)
    a = a_small if small else a0
    add = c.add0 + (0 if (a & c.lsb) == 0 else c.add_lsb) + (c.add_neg if neg else c.add_pos)
    r = _narrow(((a + add) & c.keep) | (0 if (a & ~c.keep) == 0 else c.odd), x)
    r_small = _narrow(_to_bits((_from_bits(r + c.magic_bits, x) - c.magic) * c.down), x)  # r * 2**(emin - F)
    if r > c.max_bits:
        r = c.ovf_neg if neg else c.ovf_pos
    r = r_small if small else r
    if c.ftz and r < c.tiny_bits:
        r = c.zero
    if a0 >= c.inf:
        r = _narrow(a0 | c.quiet, x) if a0 > c.inf else c.inf_out  # NaN: quiet, payload kept; inf: the policy
    if r == 0 and not c.neg_zero:
        s = c.zero
    return _from_bits(r | s, x)


@jit
def _pass_normal(x, out, c):
    for i in range(x.size):
        out[i] = _round_normal(x[i], c)


@jit
def _pass_any(x, out, c):
    for i in range(x.size):
        out[i] = _round_any(x[i], c)


@jit
def _round_chunk_bits(x, out, c):
    """Round a contiguous chunk (``out`` may be ``x``). Values below 2**emin (target subnormals, zeros)
    need the second formula only where emin is above the input type's."""
    if c.has_sub:
        _pass_any(x, out, c)
    else:
        _pass_normal(x, out, c)
