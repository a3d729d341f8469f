"""The order of the backward's dQ key tiles (Q4's MMAs, or the atomic adds Q4b) per (lead, query tile), from the
plan's ``dq_order`` and a seed (:func:`dq_orders`; DASH's schedules from :mod:`simfloat.attention._dash`), walked
by both engines over the dQ kernel's own tiles.
"""

from __future__ import annotations

import numpy as np

from simfloat.attention._dash import dash_keys, is_dash
from simfloat.attention._masks import (
    KeyMask,
)
from simfloat.attention.backward_plan import BackwardPlan


def seen_of(mk: KeyMask, causal: bool, b: int, t: int, bm: int, bn: int, seq_k: int) -> int:
    """The key tiles 0 .. n - 1 query tile t of lead b adds into dQ (atomic): the end of its
    :func:`~simfloat.attention._masks.tile_range` (the same rule, in Python)."""
    kv = seq_k if mk.kvlen.size == 0 else min(seq_k, int(mk.kvlen[b]))
    off = 0 if mk.off.size == 0 else int(mk.off[b])
    wr = 0 if causal else mk.wr
    hi = kv if wr < 0 else min(kv, (t + 1) * bm - 1 + off + wr + 1)
    lo = 0 if mk.wl < 0 else max(0, t * bm + off - mk.wl)
    return 0 if hi <= lo else -(-hi // bn)


def diag_of(mk: KeyMask, causal: bool, b: int, t: int, bm: int, bn: int) -> int:
    """``dq_order="diagonal_first"`` under a mask: the first key tile that the right edge of query tile t's first
    row (the causal diagonal or the window's right bound, shifted by the alignment) masks in part, key
    ``t * bm + off + right + 1``; 0 without a right edge (all tiles in forward order). A dense mask and key
    padding have no diagonal."""
    wr = 0 if causal else mk.wr
    off = 0 if mk.off.size == 0 else int(mk.off[b])
    return 0 if wr < 0 else max(0, t * bm + off + wr + 1) // bn


def dq_orders(
    pl: BackwardPlan,
    seed: int | None,
    n_lead: int,
    seq_q: int,
    seq_k: int,
    bm: int,
    bn: int,
    causal: bool,
    seen_lt: np.ndarray | None = None,
    walk: bool = True,
    diag_lt: np.ndarray | None = None,
) -> np.ndarray:
    """The order of dQ's key tiles (Q4's MMAs, or the atomic adds Q4b), bm and bn the dQ kernel's tiles:
    (n_lead, n_qt, n_kv) int64, per query lead and query tile t the key tiles it visits
    (:func:`~simfloat.attention._masks.visible_tiles`) in the plan's ``dq_order``, then the others; (0, 0, 0)
    when dQ does not walk on its own (``walk`` False).
    ``seen_lt``: (n_lead, n_qt) a masked call's count per lead and query tile instead (the end of its
    :func:`~simfloat.attention._masks.tile_range`); ``diag_lt``: its first diagonal key tile per lead and query
    tile (:func:`diag_of`, for ``"diagonal_first"``).

    Raises:
        ValueError: a tuple order whose length is not the number of key tiles; a callable's result that is not
            a permutation of the tiles a query tile sees.
    """
    if not walk:
        return np.zeros((0, 0, 0), dtype=np.int64)
    n_qt, n_kv = -(-seq_q // bm), -(-seq_k // bn)
    seen = np.array([n_kv if not causal else min(n_kv, -(-((t + 1) * bm) // bn)) for t in range(n_qt)], dtype=np.int64)
    tiles = np.arange(n_kv)
    hidden = tiles[None, :] >= seen[:, None]  # (n_qt, n_kv): key tiles a query tile does not visit
    if seen_lt is not None:
        if callable(pl.dq_order) and np.any(seen_lt != seen_lt[:1]):
            raise ValueError(f"plan {pl.name!r}: a callable dq_order needs the same key tiles in every lead index")
        seen = seen_lt[0] if len(seen_lt) else seen
        hidden = tiles[None, None, :] >= seen_lt[:, :, None]  # (n_lead, n_qt, n_kv)
    order = pl.dq_order
    if is_dash(order):
        if seen_lt is not None:
            raise ValueError(
                f"plan {pl.name!r}: dq_order {order!r} models DASH's schedules of a dense (or causal) backward: "
                "no attn_mask, window or key padding"
            )
        keys = dash_keys(order, n_lead, seq_q, seq_k, bm, bn, causal, seen)  # type: ignore[arg-type]  # a str
    elif order == "seeded":
        keys = np.random.default_rng(seed).random((n_lead, n_qt, n_kv))
    elif order == "forward":
        keys = np.broadcast_to(tiles.astype(np.float64), (n_lead, n_qt, n_kv)).copy()
    elif order == "reverse":
        keys = np.broadcast_to(-tiles.astype(np.float64), (n_lead, n_qt, n_kv)).copy()
    elif order == "diagonal_first":  # causal: from the first key tile row t * bm masks in part, then from 0
        diag = np.array([(t * bm + 1) // bn if causal else 0 for t in range(n_qt)])
        dg = np.broadcast_to(diag if diag_lt is None else diag_lt, (n_lead, n_qt))[:, :, None]
        keys = np.where(tiles >= dg, tiles - n_kv, tiles).astype(np.float64)
    elif isinstance(order, tuple):
        if len(order) != n_kv:
            raise ValueError(
                f"plan {pl.name!r}: dq_order {order!r} orders {len(order)} key tiles, but seq_k {seq_k} and "
                f"block_n {bn} make {n_kv}"
            )
        rank = np.empty(n_kv)
        rank[list(order)] = np.arange(n_kv)
        keys = np.broadcast_to(rank, (n_lead, n_qt, n_kv)).copy()
    else:
        keys = np.empty((n_lead, n_qt, n_kv))
        for t in range(n_qt):
            perm = [int(x) for x in order(t, int(seen[t]))]  # type: ignore[operator]  # a callable here
            if sorted(perm) != list(range(seen[t])):
                raise ValueError(
                    f"plan {pl.name!r}: dq_order({t}, {seen[t]}) must return a permutation of "
                    f"range({seen[t]}), got {perm}"
                )
            rank = np.arange(n_kv, dtype=np.float64)
            rank[perm] = np.arange(len(perm))
            keys[:, t] = rank
    if hidden.ndim == 3:
        keys[hidden] = np.inf
    else:
        keys[:, hidden] = np.inf
    return np.ascontiguousarray(np.argsort(keys, axis=-1, kind="stable"), dtype=np.int64)
