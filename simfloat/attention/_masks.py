"""Attention masks as data the forward and backward loops evaluate per (row, key), as the kernels do.

Two kinds, combined (a key is visible when both keep it):

* **structured** (:class:`KeyMask`'s ``off``, ``wl``, ``wr``, ``kvlen``): query row ``i`` of lead index ``b``
  sees the keys ``lo <= j < hi`` with ``hi = min(kvlen[b], i + off[b] + wr + 1)`` (no bound with ``wr = -1``;
  causal: ``wr = 0``) and ``lo = max(0, i + off[b] - wl)`` (0 with ``wl = -1``): flash-attn's ``window_size``
  and causal mask, aligned top-left (``off = 0``) or bottom-right (``off = kvlen[b] - seq_q``), with the key
  padding ``kvlen`` (the valid keys per lead index). It also decides which key tiles a q tile walks at all
  (:func:`tile_range`, FA2's ``n_block_min`` / ``n_block_max``): the tiles that hold a key some row of the
  tile could see, counting rows up to ``(t + 1) * block_m`` as the kernels' bound does. Skipped tiles are the
  kernel's skipped tiles; a walked tile's keys a row cannot see are masked (score -inf, p = 0).
* **dense** (``bias``, ``dense``): an (Lm, seq_q, seq_k) array read per (row, key) through ``bmap`` (lead
  index -> mask index). Boolean masks (``dense = 1``, SDPA's meaning: True keeps) are stored as 0 / -inf and
  select (``tl.where(keep, qk, -inf)``); additive masks (``dense = 2``) are added to the scaled scores (see
  :mod:`simfloat.attention.flash`), -inf entries mask. A dense mask never skips a tile.

``NO_MASK`` is the mask of a call without one: the loops then behave exactly as before masks existed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any, NamedTuple

import numpy as np

from simfloat._jit import ljit
from simfloat.rounding import round as _round

__all__ = [
    "EMPTY_ROWS",
    "NO_MASK",
    "KeyMask",
    "MaskSpec",
    "key_masked",
    "mask_of",
    "qtile_range",
    "resolve_mask",
    "row_span",
    "tile_range",
    "visible_keys",
    "visible_tiles",
]

#: what a row that sees no key gives: "zero" (flash-attn's kernels: out 0, m -inf, l 0, lse -inf), "nan"
#: (SDPA's math without a safe softmax: out NaN), "raise" (a ValueError naming the row).
EMPTY_ROWS = ("zero", "nan", "raise")
ALIGNS = ("top-left", "bottom-right")
DENSE_NONE, DENSE_BOOL, DENSE_ADD = 0, 1, 2


class KeyMask(NamedTuple):
    """A call's mask as the loops read it (see the module docstring).

    Attributes:
        on: any mask beyond the ``causal`` flag of the loop's geometry (False: today's loop exactly).
        off: (L,) int64 alignment offset added to the row index (empty: 0).
        wl, wr: left / right window (-1: unbounded); the loop's ``causal`` flag means ``wr = 0``.
        kvlen: (L,) int64 valid keys per lead index (empty: all).
        dense: 0 none, 1 boolean (bias 0 / -inf: select), 2 additive (bias added to the scaled scores).
        bias: (Lm, seq_q, seq_k) float64 (dense), else (0, 0, 0). bmap: (L,) int64 lead -> mask index.
    """

    on: bool
    off: np.ndarray
    wl: int
    wr: int
    kvlen: np.ndarray
    dense: int
    bias: np.ndarray
    bmap: np.ndarray


_I0 = np.zeros(0, dtype=np.int64)
NO_MASK = KeyMask(False, _I0, -1, -1, _I0, DENSE_NONE, np.zeros((0, 0, 0)), _I0)


@ljit
def row_span(mk, causal, b, i, seq_k):
    """Row i of lead b: the structured mask's visible keys [lo, hi) (hi <= lo: none)."""
    kv = seq_k if mk.kvlen.size == 0 else min(seq_k, mk.kvlen[b])
    off = 0 if mk.off.size == 0 else mk.off[b]
    wr = 0 if causal else mk.wr
    hi = kv
    if wr >= 0:
        hi = min(hi, i + off + wr + 1)
    lo = 0
    if mk.wl >= 0:
        lo = max(0, i + off - mk.wl)
    return lo, hi


@ljit
def tile_range(mk, causal, b, t, bm, bn, seq_k):
    """The key tiles [jt_lo, jt_hi) q tile t of lead b walks: those holding a key one of its rows t * bm ..
    (t + 1) * bm - 1 may see (FA2's n_block_min / n_block_max)."""
    lo, _ = row_span(mk, causal, b, t * bm, seq_k)
    _, hi = row_span(mk, causal, b, (t + 1) * bm - 1, seq_k)
    if hi <= lo:
        return 0, 0
    return lo // bn, (hi + bn - 1) // bn


@ljit
def visible_keys(mk, causal, b, i, seq_k):
    """Row i of lead b: the keys [lo, hi) it may see under the loop's ``causal`` and the call's mask ``mk``
    (``NO_MASK``: [0, i + 1) or all), 0 <= hi (hi <= lo: none); a key in between may still be dropped by a
    dense mask (:func:`key_masked`). The one rule of every loop's row span (D7)."""
    if not mk.on:
        return 0, (min(seq_k, i + 1) if causal else seq_k)
    lo, hi = row_span(mk, causal, b, i, seq_k)
    return lo, max(0, hi)


@ljit
def visible_tiles(mk, causal, b, t, bm, bn, seq_k):
    """The key tiles [jt_lo, jt_hi) q tile t (rows t * bm ..) of lead b walks under the loop's ``causal`` and the
    call's mask (``NO_MASK``: those up to the tile's last row's causal key, or all): :func:`tile_range`."""
    if not mk.on:
        hi = min((t + 1) * bm, seq_k) if causal else seq_k
        return 0, (hi + bn - 1) // bn
    return tile_range(mk, causal, b, t, bm, bn, seq_k)


@ljit
def qtile_range(mk, causal, b, jt, bm, bn, seq_q, seq_k):
    """The query tiles [t_lo, t_hi) of lead b holding a row that may see a key of key tile jt (the backward's
    m_block_min / m_block_max)."""
    kv = seq_k if mk.kvlen.size == 0 else min(seq_k, mk.kvlen[b])
    j0 = jt * bn
    j1 = min(j0 + bn, kv) - 1  # the tile's last valid key
    if j1 < j0:
        return 0, 0
    off = 0 if mk.off.size == 0 else mk.off[b]
    wr = 0 if causal else mk.wr
    r_lo, r_hi = 0, seq_q
    if wr >= 0:  # row i sees key j0 only if j0 <= i + off + wr
        r_lo = max(0, j0 - off - wr)
    if mk.wl >= 0:  # and key j1 only if j1 >= i + off - wl
        r_hi = min(seq_q, j1 - off + mk.wl + 1)
    if r_hi <= r_lo:
        return 0, 0
    return r_lo // bm, (r_hi + bm - 1) // bm


@ljit
def key_masked(mk, b, i, j, lo):
    """Key j (< the row's hi) is masked for row i: left of the window or dropped by a dense mask."""
    if j < lo:
        return True
    return mk.dense != DENSE_NONE and mk.bias[mk.bmap[b], i, j] == -np.inf


@dataclass(frozen=True)
class MaskSpec:
    """A call's mask arguments, checked and resolved (:func:`resolve_mask`).

    Attributes:
        mask: the loops' :class:`KeyMask`.
        empty: (L, seq_q) bool, the rows that see no key. empty_rows: the rule for them (:data:`EMPTY_ROWS`).
        seq_k: the keys.
    """

    mask: KeyMask
    empty: np.ndarray
    empty_rows: str
    seq_k: int

    @cached_property
    def visible(self) -> np.ndarray:
        """(L, seq_q, seq_k) bool, every row's visible keys (structured and dense together), built when first
        asked for (the dense forms ask; the flash loops read the :class:`KeyMask`, never this)."""
        n_lead, seq_q = self.empty.shape
        return _visible(self.mask, n_lead, seq_q, self.seq_k)

    def finish(self, out: np.ndarray) -> None:
        """Apply the empty-row rule to the (L, seq_q, dv) output in place ("zero": the kernel's 0 stays)."""
        if self.empty_rows == "nan" and self.empty.any():
            out[self.empty] = np.nan

    def row_mask(self, b: int, i: int) -> np.ndarray:
        """Row i of lead b as a (1, 1, seq_k) mask: its visible keys (bool), or with an additive mask the
        bias row with -inf where the row sees no key."""
        keep = self.visible[b, i]
        if self.mask.dense != DENSE_ADD:
            return keep[None, None].copy()
        add = self.mask.bias[self.mask.bmap[b], i].copy()
        add[~keep] = -np.inf
        return add[None, None]


def _int_arg(x: object, what: str) -> int:
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)):
        raise TypeError(f"{what} must be an int, got {type(x).__name__}")
    return int(x)


def _window(window: object, causal: bool) -> tuple[int, int]:
    if window is None:
        return -1, (0 if causal else -1)
    if not isinstance(window, (tuple, list)) or len(window) != 2:
        raise TypeError(f"window must be None or a (left, right) pair of ints, got {window!r}")
    wl, wr = (_int_arg(w, "window's entries") for w in window)
    if wl < -1 or wr < -1:
        raise ValueError(f"window entries must be >= 0, or -1 for no bound, got {(wl, wr)}")
    if causal:
        if wr > 0:
            raise ValueError(f"causal=True sees no key right of the diagonal: window right must be 0 or -1, got {wr}")
        wr = 0
    return wl, wr


def _dense(attn_mask: object, lead: tuple[int, ...], seq_q: int, seq_k: int, fmt_round: object) -> tuple:
    if not isinstance(attn_mask, np.ndarray):
        raise TypeError(f"attn_mask must be a numpy array (bool or float) or None, got {type(attn_mask).__name__}")
    a = attn_mask
    if a.dtype == np.bool_:
        kind = DENSE_BOOL
    elif a.dtype.kind == "f" or a.dtype.name in ("bfloat16",):
        kind = DENSE_ADD
    else:
        raise TypeError(f"attn_mask must be bool (True keeps) or a float array (added to the scores), got {a.dtype}")
    if a.ndim < 2:
        raise ValueError(f"attn_mask must be (..., seq_q, seq_k) (broadcastable), got shape {a.shape}")
    full = lead + (seq_q, seq_k)
    try:
        np.broadcast_shapes(a.shape, full)
        if len(a.shape) > len(full) or np.broadcast_shapes(a.shape, full) != full:
            raise ValueError
    except ValueError as err:
        raise ValueError(f"attn_mask of shape {a.shape} does not broadcast to (..., seq_q, seq_k) = {full}") from err
    a = a.reshape((1,) * (len(full) - a.ndim) + a.shape)
    mlead = a.shape[:-2]
    n_m = math.prod(mlead)
    # lead index -> mask index: the lead multi-index with the mask's broadcast (size-1) dims set to 0
    midx = np.arange(n_m, dtype=np.int64).reshape(mlead) if mlead else np.zeros((), dtype=np.int64)
    bmap = np.ascontiguousarray(np.broadcast_to(midx, lead), dtype=np.int64).reshape(-1)
    rows = np.broadcast_to(a, mlead + (seq_q, seq_k)).reshape((n_m, seq_q, seq_k))
    if kind == DENSE_BOOL:
        bias = np.where(rows, 0.0, -np.inf)
    else:
        x = np.asarray(rows, dtype=np.float64)
        if np.isnan(x).any() or (x == np.inf).any():
            raise ValueError("an additive attn_mask must hold finite values or -inf (masked), found NaN or +inf")
        bias = np.ascontiguousarray(fmt_round(x))  # type: ignore[operator]
        if (np.abs(bias) == np.inf).sum() != (x == -np.inf).sum():
            raise ValueError("an additive attn_mask value overflows the scores' format when rounded into it")
    return kind, np.ascontiguousarray(bias, dtype=np.float64), bmap


def _lengths(key_lengths: object, lead: tuple[int, ...], seq_k: int) -> np.ndarray:
    a = np.asarray(key_lengths)
    if a.dtype.kind not in "iu":
        raise TypeError(f"key_lengths must hold integers, got {a.dtype}")
    if a.ndim == 1 and lead and a.shape[0] == lead[0] and a.shape != lead:  # per batch: (B,) for lead (B, H, ...)
        a = a.reshape((a.shape[0],) + (1,) * (len(lead) - 1))
    try:
        full = np.broadcast_to(a, lead)
    except ValueError as err:
        raise ValueError(f"key_lengths of shape {a.shape} does not broadcast to the leading dims {lead}") from err
    if (full < 0).any() or (full > seq_k).any():
        raise ValueError(f"key_lengths must lie in [0, seq_k = {seq_k}], got {int(full.min())}..{int(full.max())}")
    return np.ascontiguousarray(full, dtype=np.int64).reshape(-1)


def resolve_mask(
    *,
    lead: tuple[int, ...],
    seq_q: int,
    seq_k: int,
    causal: bool,
    attn_mask: object = None,
    key_lengths: object = None,
    window: object = None,
    causal_align: object = "top-left",
    empty_rows: object = "zero",
    fmt_round: object = None,
) -> MaskSpec | None:
    """Check a call's mask arguments and resolve them into a :class:`MaskSpec` (None: no mask beyond
    today's top-left ``causal``, the loops run exactly as without masks).

    Args:
        lead: the leading dims; seq_q, seq_k: the sequence lengths; causal: the call's flag.
        attn_mask: None, or a bool (True keeps) / float (additive) array broadcastable to
            (*lead, seq_q, seq_k), SDPA's meaning.
        key_lengths: None, or ints in [0, seq_k] broadcastable to ``lead`` (or one per batch, (lead[0],)): keys
            past them are padding.
        window: None or (left, right), flash-attn's ``window_size`` (-1: unbounded); causal sets right to 0.
        causal_align: "top-left" (query i sees keys j <= i) or "bottom-right" (j <= i + kvlen - seq_q).
        empty_rows: the rule for rows that see no key (:data:`EMPTY_ROWS`).
        fmt_round: rounds a float64 array into the scores' format (the additive mask's format).

    Raises:
        TypeError, ValueError: bad masks, shapes, lengths, windows, alignment or rule; ``empty_rows="raise"``
            and a row sees no key.
    """
    if empty_rows not in EMPTY_ROWS:
        raise ValueError(f"empty_rows must be one of {EMPTY_ROWS}, got {empty_rows!r}")
    if causal_align not in ALIGNS:
        raise ValueError(f"causal_align must be one of {ALIGNS}, got {causal_align!r}")
    wl, wr = _window(window, causal)
    n_lead = math.prod(lead)
    br = causal_align == "bottom-right"
    if attn_mask is None and key_lengths is None and wl == -1 and (wr == -1 or (wr == 0 and causal and not br)):
        return None  # today's call: no mask, or the top-left causal flag alone
    kind, bias, bmap = DENSE_NONE, np.zeros((0, 0, 0)), _I0
    if attn_mask is not None:
        kind, bias, bmap = _dense(attn_mask, lead, seq_q, seq_k, fmt_round)
    kvlen = _I0 if key_lengths is None else _lengths(key_lengths, lead, seq_k)
    kv_all = np.full(n_lead, seq_k, dtype=np.int64) if kvlen.size == 0 else kvlen
    off = (kv_all - seq_q) if br else _I0
    mk = KeyMask(True, np.ascontiguousarray(off, dtype=np.int64), wl, wr, kvlen, kind, bias, bmap)
    if kind == DENSE_NONE:  # each row's keys are one range [lo, hi): no (seq_q, seq_k) array
        i = np.arange(seq_q)[None, :]
        o = (off if off.size else np.zeros(n_lead, dtype=np.int64))[:, None]
        hi = np.broadcast_to(kv_all[:, None], (n_lead, seq_q))
        if wr >= 0:
            hi = np.minimum(hi, i + o + wr + 1)
        lo = np.maximum(0, i + o - wl) if wl >= 0 else np.zeros((1, 1), dtype=np.int64)
        empty = np.ascontiguousarray(np.broadcast_to(hi <= lo, (n_lead, seq_q)))
    else:
        empty = np.asarray(~_visible(mk, n_lead, seq_q, seq_k).any(axis=-1), dtype=bool)
    if empty_rows == "raise" and empty.any():
        b, r = (int(x) for x in np.argwhere(empty)[0])
        raise ValueError(
            f"{int(empty.sum())} query row(s) see no key (the first: row {r} of lead index {b}): softmax over no "
            "keys is undefined; pass empty_rows='zero' (flash-attn: out 0, lse -inf) or 'nan' (SDPA's math)"
        )
    return MaskSpec(mk, empty, str(empty_rows), seq_k)


def _visible(mk: KeyMask, n_lead: int, seq_q: int, seq_k: int) -> np.ndarray:
    """(n_lead, seq_q, seq_k) bool: the keys each row sees under the resolved mask ``mk``."""
    i = np.arange(seq_q)[None, :, None]
    j = np.arange(seq_k)[None, None, :]
    o = (mk.off if mk.off.size else np.zeros(n_lead, dtype=np.int64))[:, None, None]
    kv_all = mk.kvlen if mk.kvlen.size else np.full(n_lead, seq_k, dtype=np.int64)
    vis = j < kv_all[:, None, None]
    if mk.wr >= 0:
        vis = vis & (j <= i + o + mk.wr)
    if mk.wl >= 0:
        vis = vis & (j >= i + o - mk.wl)
    if mk.dense != DENSE_NONE:
        vis = vis & (mk.bias[mk.bmap] != -np.inf)
    return np.broadcast_to(vis, (n_lead, seq_q, seq_k))


def mask_of(
    x: object,
    attn_mask: object,
    key_lengths: object,
    window: object,
    causal_align: object,
    empty_rows: object,
    scale_op: object = None,
) -> MaskSpec | None:
    """:func:`resolve_mask` for checked inputs ``x`` (:class:`simfloat.attention._inputs.Inputs`): the additive
    mask rounded into the format of the plan's ``scale`` op (``scale_op``, an OpSpec: that op's instead, as for
    a plan with quantizers, whose inputs are checked under the float64 plan)."""
    spec: Any = x.plan.scale if scale_op is None else scale_op  # type: ignore[attr-defined]

    def fmt_round(a: np.ndarray) -> np.ndarray:
        return np.asarray(_round(a, spec.fmt, spec.mode), dtype=np.float64)

    return resolve_mask(
        lead=x.lead,  # type: ignore[attr-defined]
        seq_q=x.q.shape[1],  # type: ignore[attr-defined]
        seq_k=x.k.shape[1],  # type: ignore[attr-defined]
        causal=x.causal,  # type: ignore[attr-defined]
        attn_mask=attn_mask,
        key_lengths=key_lengths,
        window=window,
        causal_align=causal_align,
        empty_rows=empty_rows,
        fmt_round=fmt_round,
    )
