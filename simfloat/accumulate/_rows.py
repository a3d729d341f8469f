"""Vectorized accumulation kernels: ``c[j] = model(c[j] + sum_k a[k] * B[k, j])`` for a row of outputs at once.

Every accumulation model of :mod:`simfloat.accumulate` has a row kernel whose innermost loops run over the
independent outputs ``j`` (contiguous in ``B`` and ``c``), so LLVM vectorizes them. Each gives, bit for bit,
what :func:`simfloat.accumulate.dot_acc` gives for every output (tests compare them on random and adversarial
inputs). Block FMA needs operands within 2**+-450 (checked: the B operand once by :func:`for_operands`, the
row and the accumulator per call) and recomputes with ``dot_acc`` itself any output that overflowed to inf or NaN
on the way; other rows go to ``dot_acc`` whole.

This module drives the kernels (:func:`row_mma`, :func:`rows_mma`, :func:`matmul_rows`, the block-scaled
:func:`scaled_rows`) and re-exports the names its callers use; one module per form of the arithmetic:

* :mod:`simfloat.accumulate._mma`: the :class:`MMA` record of a model, scratch, operand weights and checks;
* :mod:`simfloat.accumulate._block`: block FMA (tensor cores), float64 form;
* :mod:`simfloat.accumulate._block32`: block FMA, float32 form (twice the lanes), where the operands allow;
* :mod:`simfloat.accumulate._seq`: sequential (one rounded ``c + a*b`` per step; the float32 FMA loop);
* :mod:`simfloat.accumulate._f64`: the float64 hardware loops, four rows at a time.

Chunked models: each chunk from zero with the inner model, then ``round(c + part)`` into the outer format.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, NamedTuple

import numpy as np
from numba import types

from simfloat._jit import Kernel, jit, kernel, kjit, ljit, type_of
from simfloat._lanes import ladd, lane_of
from simfloat._parallel import run_rows
from simfloat.accumulate._block import _block_row, _block_step, _block_step2
from simfloat.accumulate._block32 import _block_step32, _block_step32_2, _load32, _shift32, operand32
from simfloat.accumulate._f64 import _f64_rows
from simfloat.accumulate._mma import (
    K_BLOCK,
    K_SEQ,
    MMA,
    N_FMA32,
    N_FMA64,
    N_MULADD64,
    N_NONE,
    Work,
    _span,
    _tame,
    for_operands,
    format_span,
    mma,
    narrow,
    operand_powers,
    round_operands,
    scaled_powers,
    tame,
    work,
)
from simfloat.accumulate._seq import _fma32_rows, _seq_row
from simfloat.accumulate.models import BlockFMA, Model, acc_params
from simfloat.accumulate.scalar import dot_acc
from simfloat.formats import format as _format

__all__ = [
    "K_BLOCK",
    "K_SEQ",
    "N_FMA32",
    "N_FMA64",
    "N_MULADD64",
    "N_NONE",
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
    "rows_form",
    "rows_kernel",
    "rows_mma",
    "rows_type",
    "rows_work",
    "scaled_mma",
    "scaled_ok",
    "scaled_powers",
    "scaled_rows",
    "scaled_weights",
    "tame",
    "work",
]


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
            outer = lane_of(mp.outer)  # (a record's lane, read once)
            for j in range(n):
                c[j] = ladd(c[j], part[j], outer)
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


_GROUP = 16  # rows of a that meet each block of k in turn: the block's rows of B and EB stay in cache


@ljit
def _live_rows(a, B, out, n, mp, c0, live):
    """Of the rows ``a`` (g, K) into ``out``: keep their incoming accumulators in ``c0`` and mark in ``live`` those
    the block-FMA steps may take; the others (weights beyond 2**+-450, inf/NaN, float64 subnormals) take the
    reference path here."""
    kk = a.shape[1]
    for i in range(a.shape[0]):
        ci = out[i]
        for j in range(n):
            c0[i, j] = ci[j]
        live[i] = mp.tame and _tame(a[i], kk) and _tame(ci, n)
        if not live[i]:
            for j in range(n):
                ci[j] = dot_acc(a[i], B[:, j], c0[i, j], mp.ap)


@ljit
def _overflowed_rows(a, B, out, n, mp, c0, live):
    """An accumulator of a live row that overflowed to inf / NaN on the way: the reference path."""
    for i in range(a.shape[0]):
        if live[i]:
            for j in range(n):
                if out[i, j] - out[i, j] != 0.0:
                    out[i, j] = dot_acc(a[i], B[:, j], c0[i, j], mp.ap)


@ljit  # inlined into its one caller, the kernel _rows_block: compiled once, not also as a library of its own
def _block_rows(a, ea, B, EB, out, n, mp, w, w2, c0, live):
    """:func:`row_mma` for every row of ``a`` (g, K) into ``out`` (g, >= n) under an unchunked fast block-FMA
    model, float64 form, block of k by block: each block of B is read by all g rows while it is in cache (a
    row's outputs depend only on its own steps, taken in the same order, so the bits are those of row_mma); rows
    are taken two at a time (:func:`_block_step2`). ``c0`` (g, >= n) and ``live`` (g,) are scratch."""
    g, kk = a.shape[0], a.shape[1]
    _live_rows(a, B, out, n, mp, c0, live)
    lo = np.int64(0)  # not the literal 0: the steps compile once, for int64
    while lo < kk:
        hi = min(kk, lo + mp.block)
        i = 0
        while i < g:
            i2 = i + 1
            while i2 < g and not live[i2]:
                i2 += 1
            if not live[i]:
                i += 1
            elif i2 < g:
                _block_step2(a[i], ea[i], a[i2], ea[i2], B, EB, out[i], out[i2], n, lo, hi, mp, w, w2)
                i = i2 + 1
            else:
                _block_step(a[i], ea[i], B, EB, out[i], n, lo, hi, mp, w)
                i = g
        lo = hi
    _overflowed_rows(a, B, out, n, mp, c0, live)


@ljit  # inlined into its one caller, the kernel _rows_block32 (as _block_rows)
def _block_rows32(a, ea, B, EB, B32, EB32, out, n, mp, w, w2, c0, live, idx):
    """:func:`_block_rows` where ``B32``, ``EB32`` hold B and its weights in the float32 form (:func:`operand32`):
    the rows it applies to (:func:`_shift32`) take the float32 steps two at a time (:func:`_block_step32_2`), the
    others (rare: values beyond the form's range) the float64 steps one at a time, so that a plan of this form
    compiles no two-row float64 step. ``idx`` (g,) is scratch."""
    g, kk = a.shape[0], a.shape[1]
    _live_rows(a, B, out, n, mp, c0, live)
    use32 = B32.shape[0] == kk
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
        for t in range(n32, nl):
            i = idx[t]
            _block_step(a[i], ea[i], B, EB, out[i], n, lo, hi, mp, w)
        lo = hi
    _overflowed_rows(a, B, out, n, mp, c0, live)


@kjit
def _rows_block(a, ea, B, EB, B32, EB32, c, g, n, mp, rs):
    """:func:`rows_mma` of an unchunked fast block-FMA model, float64 form (:func:`_block_rows`)."""
    _block_rows(a[:g], ea[:g], B, EB, c[:g], n, mp, rs.w, rs.w2, rs.c0, rs.live)


@kjit
def _rows_block32(a, ea, B, EB, B32, EB32, c, g, n, mp, rs):
    """:func:`rows_mma` of an unchunked fast block-FMA model whose B operand has its float32 form
    (:func:`_block_rows32`)."""
    _block_rows32(a[:g], ea[:g], B, EB, B32, EB32, c[:g], n, mp, rs.w, rs.w2, rs.c0, rs.live, rs.idx)


@kjit
def _rows_f64(a, ea, B, EB, B32, EB32, c, g, n, mp, rs):
    """:func:`rows_mma` of an unchunked fast float64 FMA or multiply-add loop, four rows at a time."""
    _f64_rows(a, B, c, g, n, mp, rs.w)


@jit
def _rows_each(a, ea, B, EB, B32, EB32, c, g, n, mp, rs):
    """:func:`rows_mma` row by row (:func:`row_mma`): chunked and reference models."""
    for i in range(g):
        row_mma(a[i], ea[i], B, EB, B32, EB32, c[i], n, mp, rs.w)


@kjit
def _rows_fma32(a, ea, B, EB, B32, EB32, c, g, n, mp, rs):
    """:func:`rows_mma` of an unchunked fast float32 FMA loop, four rows at a time on ``B32`` (rows it cannot
    take, and a B without its float32 form, go row by row)."""
    if B32.shape[0] != B.shape[0]:
        _rows_each(a, ea, B, EB, B32, EB32, c, g, n, mp, rs)
        return
    _fma32_rows(a, B32, c, g, n, rs)
    for i in range(g):
        if not rs.live[i]:
            row_mma(a[i], ea[i], B, EB, B32, EB32, c[i], n, mp, rs.w)


@jit
def rows_mma(a, ea, B, EB, B32, EB32, c, g, n, mp, rs):
    """:func:`row_mma` for the rows ``a[:g]`` into ``c[:g]`` (the same bits, row by row), with each load of ``B``
    serving several rows: unchunked fast block FMA rows meet each block of k in turn (:func:`_block_rows`, or
    :func:`_block_rows32` where the record says B comes with its float32 form ``B32``, ``EB32``); the float64
    loops run four rows at a time; so does the float32 FMA loop, on ``B32``, ``B``'s values as float32
    (:func:`operand32`). Pass empty arrays for a B that was not converted: the rows then take the float64 forms.
    :func:`rows_kernel` is the same choice made once per record, as a :class:`~simfloat._jit.Kernel`.

    Args:
        a: (>= g, K) operand rows; ea: their weights. B: (K, >= n), EB: its weights; B32, EB32: (K, >= n)
            float32 or empty. c: (>= g, >= n) incoming accumulators, overwritten. mp: :class:`MMA`.
            rs: :class:`Rows` of at least g rows and n outputs.
    """
    if mp.fast and mp.kind == K_BLOCK and mp.chunk == 0:
        if mp.sums32 and mp.b_shift > 0.0:  # B comes with its float32 form (operand32 recorded its shift)
            _rows_block32(a, ea, B, EB, B32, EB32, c, g, n, mp, rs)
        else:
            _rows_block(a, ea, B, EB, B32, EB32, c, g, n, mp, rs)
    elif mp.fast and (mp.native == N_FMA64 or mp.native == N_MULADD64) and mp.chunk == 0:
        _rows_f64(a, ea, B, EB, B32, EB32, c, g, n, mp, rs)
    elif mp.fast and mp.native == N_FMA32 and mp.chunk == 0:
        _rows_fma32(a, ea, B, EB, B32, EB32, c, g, n, mp, rs)
    else:
        _rows_each(a, ea, B, EB, B32, EB32, c, g, n, mp, rs)


def rows_form(mp: Any) -> Any:
    """:func:`rows_mma`'s choice of form for ``mp``, an :class:`MMA` as a numpy record
    (:func:`simfloat._jit.record_of`; the compiled function of that form)."""
    fast, native, plain = mp["fast"], mp["native"], mp["chunk"] == 0
    if fast and mp["kind"] == K_BLOCK and plain:
        return _rows_block32 if mp["sums32"] and mp["b_shift"] > 0.0 else _rows_block
    if fast and native in (N_FMA64, N_MULADD64) and plain:
        return _rows_f64
    if fast and native == N_FMA32 and plain:
        return _rows_fma32
    return _rows_each


def rows_kernel(mp: Any) -> Kernel:
    """:func:`rows_mma`'s choice of form for the record ``mp``, made once: the form's kernel as a
    :class:`~simfloat._jit.Kernel` of the signature ``rows_mma`` is called with from the attention loops (every
    array C-contiguous and writable, float64 but ``B32``, ``EB32`` float32). A loop that takes it compiles only
    the forms its plans use."""
    return kernel(rows_form(mp), _rows_signature(type_of(mp)))


_ROWS_TYPE: list[Any] = []


def rows_type() -> Any:
    """The numba type of the dots' work arrays (:func:`rows_work`; every call's: their dtypes and ranks do not
    vary), made once: the signature of every loop that is passed a :class:`Rows`."""
    if not _ROWS_TYPE:
        _ROWS_TYPE.append(type_of(rows_work(1, 1)))
    return _ROWS_TYPE[0]


def _rows_signature(mp_type: Any) -> Any:
    f64, f32 = types.float64[:, ::1], types.float32[:, ::1]
    void: Any = types.void
    return void(f64, f64, f64, f64, f32, f32, f64, types.int64, types.int64, mp_type, rows_type())


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
