"""DASH's deterministic dQ schedules (Qiang et al., "DASH: Deterministic Attention Scheduling for High-throughput
Reproducible LLM Training", arXiv 2601.21824, ICLR 2026) as the order of the key tiles' dQ adds per query tile.

FlashAttention-3's deterministic backward runs one thread block per key tile (all key tiles of every head in
waves of one block per SM); each walks the query tiles and adds its dQ contribution to a query tile once a
semaphore per query tile counts ``wait`` earlier adds. ``wait`` (the rank of key tile n among query tile m's
adds) is what fixes dQ's bits, so this module computes it for every (lead, query tile, key tile) as the
released code does (``hopper/tile_m_scheduler.hpp``, ``hopper/tile_m_dependency.hpp`` and ``get_mblock_iter`` /
``get_kv_status`` of ``hopper/mainloop_bwd_sm90_tma_gmma_ws.hpp`` in SJTU-Liquid/deterministic-FA3):

* ``"dash_descending"``: Descending Q-Tile Iteration. Each key tile's block walks the query tiles last first,
  but the wait stays the key tile's index (``NaiveDependency``): every query tile adds its key tiles in
  increasing order, FA3's deterministic order (``"forward"``), bit for bit.
* ``"dash_shift"`` (``"dash_shift:<sms>"``: another SM count; the released code fixes 132): Shift Scheduling.
  The (lead, key tile) pairs ``linear = n + lead * n_kv`` run in waves of ``sms``; a key tile's ``finished``
  are its head's key tiles in earlier waves and ``running`` those in its wave, ``a = n - finished`` its place
  there. Full mask: ``wait(m, n) = finished + (min(m, running - 1) - a) mod running``. Causal
  (``ShiftCausalScheduler`` / ``ShiftCausalDependency``): key tiles n and n_kv - 1 - n share a slot (waves
  of pairs); the lower one (``stage`` 0) walks the rectangle of query tiles all its wave's lower tiles see
  with the shift above, then the rest in order, waiting ``(step - rectangle) // stride + executed`` there;
  the upper one (``stage`` 1) walks last first and waits ``2 running - 1 - slot + executed``, ``executed`` the
  earlier waves' tiles that query tile sees.

Each query tile's waits must be a permutation of ``0 .. seen - 1`` (else the kernel would deadlock or race on
that shape); :func:`dash_keys` checks it. The causal ``executed`` counts an earlier wave's upper key tile as seen
by query tile m when ``finished > (m_max - m - 1) // stride``, exact only when the query tiles fill the key tiles
(``m_max == n_kv * stride``): a ragged last query tile (seq 97, block_m 16, block_n 32) gives such gaps once the
waves cross heads, and is refused.
"""

from __future__ import annotations

import numpy as np

__all__ = ["DASH_ORDERS", "DASH_SMS", "dash_keys", "is_dash"]

#: the named DASH orders (``"dash_shift:<sms>"`` too)
DASH_ORDERS = ("dash_descending", "dash_shift")
#: the SM count the released code assumes (``num_sms = 132``: H800 / H100 SXM)
DASH_SMS = 132


def is_dash(order: object) -> bool:
    """Whether ``order`` names a DASH schedule (``"dash_shift:<sms>"`` with a positive integer included)."""
    if not isinstance(order, str):
        return False
    if order in DASH_ORDERS:
        return True
    head, colon, sms = order.partition(":")
    return head == "dash_shift" and colon == ":" and sms.isdigit() and int(sms) > 0


def _sms(order: str) -> int:
    return int(order.partition(":")[2]) if ":" in order else DASH_SMS


def _kv_status(sms: int, kv_id: int, lead: int, n_kv: int) -> tuple[int, int]:
    """(running, finished): the head's key tiles in kv_id's wave and in earlier waves (``get_kv_status``)."""
    lin = kv_id + lead * n_kv
    start_wave = (lin // sms) * sms
    start_head = lead * n_kv
    lo, hi = max(start_head, start_wave), min(start_head + n_kv - 1, start_wave + sms - 1)
    return max(0, hi - lo + 1), max(0, start_wave - start_head)


def _shift_wait(q: int, a: int, running: int, executed: int) -> int:
    """``ShiftDependency``: key tile a of the running ones, query row q."""
    tmp = min(q, running - 1) - a
    if tmp < 0:
        tmp += running
    return executed + tmp


def _full(keys: np.ndarray, sms: int) -> None:
    n_lead, n_qt, n_kv = keys.shape
    for lead in range(n_lead):
        for n in range(n_kv):
            running, finished = _kv_status(sms, n, lead, n_kv)
            for m in range(n_qt):
                keys[lead, m, n] = _shift_wait(m, n - finished, running, finished)


def _causal(keys: np.ndarray, sms: int, bm: int, bn: int) -> None:
    n_lead, n_qt, n_kv = keys.shape
    stride = bn // bm
    for lead in range(n_lead):
        for n in range(n_kv):
            running, finished = _kv_status(sms, min(n, n_kv - 1 - n), lead, n_kv // 2)
            upper = n > n_kv - 1 - n  # stage 1: the pair's key tile with fewer query tiles
            slot = (n_kv - 1 - n if upper else n) - finished
            m_min, m_max = n * bn // bm, n_qt
            rect = stride * (running - 1) + (0 if upper else m_min - slot * stride)
            rect_steps = m_max - rect
            for step in range(m_max - m_min):
                if upper:
                    m = m_max - step - 1
                elif step < rect_steps:
                    pos = slot + step
                    if pos >= rect_steps:
                        pos -= rect_steps
                    m = pos + rect
                else:
                    m = m_min + step - rect_steps
                executed = finished + max(0, finished - (m_max - m - 1) // stride)
                if upper:
                    wait = 2 * running - 1 - slot + executed
                elif step < rect_steps:
                    wait = _shift_wait(pos, slot, running, executed)
                else:
                    wait = (step - rect_steps) // stride + executed
                keys[lead, m, n] = wait


def dash_keys(
    order: str, n_lead: int, seq_q: int, seq_k: int, bm: int, bn: int, causal: bool, seen: np.ndarray
) -> np.ndarray:
    """(n_lead, n_qt, n_kv) float64: the wait of every key tile at every query tile under DASH schedule ``order``
    (the rank of its dQ add; key tiles a query tile does not see get anything: the caller hides them).

    Args:
        seen: (n_qt,) the key tiles 0 .. seen[t] - 1 query tile t sees.

    Raises:
        ValueError: a shape the schedule has no order for (causal: seq_q != seq_k, block_n not a multiple of
            block_m, an odd number of key tiles), or waits that are no permutation (the message names where).
    """
    n_qt, n_kv = -(-seq_q // bm), -(-seq_k // bn)
    tiles = np.arange(n_kv, dtype=np.float64)
    keys = np.broadcast_to(tiles, (n_lead, n_qt, n_kv)).copy()
    if order == "dash_descending":  # NaiveDependency: wait = the key tile's index
        return keys
    sms = _sms(order)
    if not causal:
        _full(keys, sms)
    else:
        if seq_q != seq_k or bn % bm != 0 or n_kv % 2 != 0:
            raise ValueError(
                f"dq_order {order!r} (DASH's causal shift schedule) pairs key tile n with n_kv - 1 - n and steps "
                f"block_n / block_m query tiles per key tile: it needs seq_q == seq_k, block_n a multiple of "
                f"block_m and an even number of key tiles; got seq_q {seq_q}, seq_k {seq_k}, block_m {bm}, "
                f"block_n {bn} ({n_kv} key tiles)"
            )
        keys[:] = -1.0
        _causal(keys, sms, bm, bn)
    for lead in range(n_lead):
        for t in range(n_qt):
            got = np.sort(keys[lead, t, : seen[t]])
            if not np.array_equal(got, np.arange(seen[t])):
                raise ValueError(
                    f"dq_order {order!r}: the schedule's waits at query tile {t} (lead {lead}) are "
                    f"{keys[lead, t, : seen[t]].astype(int).tolist()}, not a permutation of range({seen[t]}): "
                    "the kernel has no deterministic order for this shape"
                )
    return keys
