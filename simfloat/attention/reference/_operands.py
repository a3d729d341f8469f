"""The reference forward loop's operands: the :class:`Operands` record (codes, scales, the unquantized inputs,
the mask) and the layouts it is built from (:func:`key_rows`, :func:`v_tiles`; :func:`float_operands` for a
plan without quantizers)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from simfloat.attention._flash_params import NO_TABLE
from simfloat.attention._masks import NO_MASK, KeyMask

__all__ = ["Operands", "float_operands", "key_rows", "v_tiles"]


class Operands(NamedTuple):
    """The loop's inputs (lead = the flat leading index; a plan without quantizers: codes are the values, and
    the scale, block-scale and delta arrays are placeholders the loop never reads).

    Attributes:
        qc: (lead, seq_q, d) Q's codes; qs: (lead, seq_q) Q's per-row scale; qb: Q's per-element block scales
            (as qc) for a block-scaled qk MMA, else (1, 1, 1).
        kc: (lead, n_kv * block_n, d) K's codes, zero-padded; ks: (lead, n_kv * block_n) per-key scales; kb: as qb.
        vt: (lead * n_kv, dv, block_n) V's codes per key tile, transposed; vs: (lead, n_kv, dv) V's scales per
            key tile and channel; vb: as qb (laid out as vt).
        ds: (lead, n_q_tiles, n_kv * block_n) Q smoothing's correction delta_s per q tile and key.
        q64, k64, v64: (lead, seq, d) the unquantized inputs (the quantized plans' float64 shadow).
        mk: the call's :class:`~simfloat.attention._masks.KeyMask` (``NO_MASK``: none beyond ``causal``).
        ex2_tab, ex2_poly: the plan's ex2.approx table and FA4's exp2 mask (FlashParams' arrays, set by
            :func:`~simfloat.attention.reference.forward.run`: the loop takes the params as a record).
    """

    qc: np.ndarray
    qs: np.ndarray
    qb: np.ndarray
    kc: np.ndarray
    ks: np.ndarray
    kb: np.ndarray
    vt: np.ndarray
    vs: np.ndarray
    vb: np.ndarray
    ds: np.ndarray
    q64: np.ndarray
    k64: np.ndarray
    v64: np.ndarray
    mk: KeyMask = NO_MASK
    ex2_tab: np.ndarray = NO_TABLE  # (placeholders: run() sets the plan's)
    ex2_poly: np.ndarray = NO_TABLE


_ONES2 = np.ones((1, 1))
_ONES3 = np.ones((1, 1, 1))


def key_rows(a: np.ndarray, n_kv: int, bn: int) -> np.ndarray:
    """(lead, seq_k, w) -> (lead, n_kv * bn, w): zero-padded to whole key tiles."""
    pad = np.zeros((a.shape[0], n_kv * bn, a.shape[2]))
    pad[:, : a.shape[1]] = a
    return pad


def v_tiles(a: np.ndarray, n_kv: int, bn: int) -> np.ndarray:
    """(lead, seq_k, dv) -> (lead * n_kv, dv, bn): per key tile, transposed (zero-padded)."""
    n_lead, dv = a.shape[0], a.shape[2]
    t = np.ascontiguousarray(key_rows(a, n_kv, bn).reshape(n_lead, n_kv, bn, dv).transpose(0, 1, 3, 2))
    return t.reshape(n_lead * n_kv, dv, bn)


def float_operands(q: np.ndarray, k: np.ndarray, v: np.ndarray, bn: int, mk: KeyMask = NO_MASK) -> Operands:
    """The :class:`Operands` of a plan without quantizers: the values are the codes, no scales.

    Args:
        q: (lead, seq_q, d); k: (lead, seq_k, d); v: (lead, seq_k, dv), float64; bn: keys per tile;
            mk: the call's mask.
    """
    n_kv = -(-k.shape[1] // bn)
    return Operands(
        np.require(q, np.float64, ["C", "W"]),  # writable, as P's scratch is: the dots compile once for both
        _ONES2,
        _ONES3,
        key_rows(k, n_kv, bn),
        _ONES2,
        _ONES3,
        v_tiles(v, n_kv, bn),
        _ONES3,
        _ONES3,
        _ONES3,
        q,
        k,
        v,
        mk,
    )
