"""The records of the vector forward loop (:mod:`simfloat.attention.vector.forward`): the call's
:class:`Operands`, the plan's :class:`Engine` with its :class:`Lanes`, and one thread's :class:`Scratch`."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from simfloat._jit import jit, type_of
from simfloat._lanes import Lane
from simfloat.accumulate._rows import rows_type
from simfloat.attention._masks import NO_MASK, KeyMask

__all__ = ["Engine", "Lanes", "Operands", "Scratch", "rows_type", "scratch", "scratch_type"]

_NINF = -np.inf


class Lanes(NamedTuple):
    """The lane form (:func:`simfloat._lanes.lane`) of every scalar op of the loop, plus P's cast or quantizer:
    ``p_pre`` (its ``pre``), ``p_arith`` (``t * qmax (+ 0.5)``), ``p_code`` (a float code's cast; the float
    plans' ``p``)."""

    dequant: Lane
    scale: Lane
    exp: Lane
    l_ij: Lane  # the additions of the in-tile row sum (a chunked model's inner ones)
    l_i: Lane
    acc: Lane
    pv_dequant: Lane
    normalize: Lane
    out: Lane
    p_pre: Lane
    p_arith: Lane
    p_code: Lane


class Engine(NamedTuple):
    """Everything a row needs besides its operands.

    ``pp``, ``ln``, ``qk`` and ``pv`` are numpy records (:func:`simfloat._jit.record_of`): numba passes each to
    a kernel as one pointer, where a NamedTuple would be hundreds of arguments.

    Attributes:
        pp: the plan's :class:`~simfloat.attention._flash_params.FlashParams` (its arrays apart: ``ex2_tab``,
            ``ex2_poly``).
        ln: :class:`Lanes`.
        qk, pv: the dots as :class:`~simfloat.accumulate._rows.MMA` records (on the codes).
        fma_exact: ``s * s_scale`` is exact in float64 (the contracted scale op may use lane form).
        acc_exact: ``acc * alpha`` is exact (the contracted accumulator update may use lane form).
        pvd_exact: ``pv * v_scale`` is exact (the fused ``scaled`` update may use lane form).
        p_exact: ``t * qmax`` of P's fixed-scale quantizer is exact.
        l_native32: the row sum's additions are float32 additions of float32 values (done as such).
        bm, bn: tile sizes; causal; wn: warps along the keys of the measured tl.sum layout; seq_k: keys.
        pv_scaled: the P.V dot is a block-scaled MMA (``pv`` is its ``scaled_mma`` record): P's operand is its
            codes times their block scales, with ``scaled_powers`` weights.
        pv_scale_lo, pv_elems: those weights' ``scale_lo`` and ``elems``.
        ex2_val: the measured ex2 table's values (:func:`simfloat.hardware.ex2_values` of ``ex2_tab``; empty
            without one): T7's ex2.approx.ftz as a table load per score.
        ex2_tab, ex2_poly: FlashParams' ex2.approx table and FA4's per-key exp2 flags.
    """

    pp: object
    ln: object
    qk: object
    pv: object
    fma_exact: bool
    acc_exact: bool
    pvd_exact: bool
    p_exact: bool
    l_native32: bool
    bm: int
    bn: int
    causal: bool
    wn: int
    seq_k: int
    pv_scaled: bool
    pv_scale_lo: float
    pv_elems: bool
    ex2_val: np.ndarray
    ex2_tab: np.ndarray
    ex2_poly: np.ndarray


class Operands(NamedTuple):
    """Codes, scales and alignment weights per lead index (a plan without quantizers: the values, and
    placeholder scales the loop never reads).

    Attributes:
        q: (L, Sq, D) Q codes (in the qk model's input format; a block-scaled qk: codes times block scales).
            eq: their weights. qs: (L, Sq) per-row scales.
        kt: (L * n_tiles, D, bn) K codes, transposed tile by tile, zero-padded. ekt: weights.
        ks: (L, n_tiles * bn) per-key scales (1 past the sequence).
        v: (L * n_tiles, bn, Dv) V codes tile by tile, zero-padded. ev: weights.
        vs: (L, n_tiles, Dv) V scales per key tile and channel.
        ds: (L, n_q_tiles, n_tiles * bn) Q smoothing's correction delta_s per q tile and key (unused without).
        kt32, ekt32, v32, ev32: ``kt``, ``v`` and their weights in the float32 forms of their dots
            (:func:`simfloat.accumulate._rows.operand32`); else one empty matrix per tile.
        mk: the call's :class:`~simfloat.attention._masks.KeyMask` (``NO_MASK``: none beyond ``causal``).
    """

    q: np.ndarray
    eq: np.ndarray
    qs: np.ndarray
    kt: np.ndarray
    ekt: np.ndarray
    ks: np.ndarray
    v: np.ndarray
    ev: np.ndarray
    vs: np.ndarray
    ds: np.ndarray
    kt32: np.ndarray
    ekt32: np.ndarray
    v32: np.ndarray
    ev32: np.ndarray
    mk: KeyMask = NO_MASK


class Scratch(NamedTuple):
    """One thread's work arrays of the loop (:func:`scratch`; the dots' own, a
    :class:`~simfloat.accumulate._rows.Rows`, go apart: every kernel call borrows each array of the records it
    is passed, so the step kernels are passed only these)."""

    s: np.ndarray  # (bm, bn) scores of the q tile's rows against one key tile
    p: np.ndarray  # (bm, bn) P of that tile
    pc: np.ndarray  # (bm, bn) P's codes (zeros past the visible keys)
    pin: np.ndarray  # (bm, bn) the codes as the P.V dot reads them (its input format)
    ep: np.ndarray  # (bm, bn) their alignment weights
    y: np.ndarray  # (bm, dv) one tile's P.V
    acc: np.ndarray  # (bm, dv): the q tile's accumulators
    m: np.ndarray  # (bm,) running maxima
    l: np.ndarray  # (bm,) running row sums  # noqa: E741
    alpha: np.ndarray  # (bm,) this key tile's alpha per row
    l_new: np.ndarray  # (bm,) the row sums after this key tile (FA1's per-step division)
    psc: np.ndarray  # (bm, bn) a block P quantizer's per-key block scales
    s1: np.ndarray  # (bm,) its per-row first-level scale (1 for one level)
    lse: np.ndarray  # (bm,) the lse form's running lse_i (Plan.state="lse")
    mr: np.ndarray  # (bm,) the unscaled running maxima (Plan.alpha_raw)
    pt: np.ndarray  # (bn, bm) float32: P transposed, for the rows' tl.sum trees at once
    tw: np.ndarray  # (16, bm) float32: the trees' lane sums
    lij: np.ndarray  # (bm,) l_ij of each row
    nv: np.ndarray  # (bm,) int64: the keys each row sees in the key tile
    lo: np.ndarray  # (bm,) int64: each row's first key under the call's mask (row_span)


@jit
def scratch(bm, bn, dv):
    """One thread's :class:`Scratch` for q tiles of ``bm`` rows, key tiles of ``bn`` and ``dv`` channels."""
    return Scratch(
        np.zeros((bm, bn)),
        np.zeros((bm, bn)),
        np.zeros((bm, bn)),
        np.zeros((bm, bn)),
        np.zeros((bm, bn)),
        np.zeros((bm, dv)),
        np.zeros((bm, dv)),
        np.empty(bm),
        np.empty(bm),
        np.zeros(bm),
        np.empty(bm),
        np.ones((bm, bn)),
        np.ones(bm),
        np.full(bm, _NINF),
        np.empty(bm),
        np.zeros((bn, bm), dtype=np.float32),
        np.zeros((16, bm), dtype=np.float32),
        np.zeros(bm),
        np.zeros(bm, dtype=np.int64),
        np.zeros(bm, dtype=np.int64),
    )


_TYPES: list[Any] = []


def scratch_type() -> Any:
    """The numba type of :class:`Scratch` (every call's: its arrays' dtypes and ranks do not vary); the dots'
    work arrays' is :func:`~simfloat.accumulate._rows.rows_type` (re-exported here)."""
    if not _TYPES:
        _TYPES.append(type_of(scratch(1, 1, 1)))
    return _TYPES[0]
