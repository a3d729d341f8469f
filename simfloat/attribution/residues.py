"""The tile-boundary sweep: a kernel's error at every key length residue modulo the key tile.

Serving kernels' silent-corruption reports sit at particular key lengths: flash-attention #2577 (FP8 paged
decode) at kv length 128, PyTorch #196678 at seq % 128 == 64, #191937 at kv % 32 == 1. A bug of the tile walk
(a partial last tile, a split or page boundary) shows as one residue class whose error stands apart from the
rest. :func:`tile_sweep` runs one plan at the key lengths ``base + r`` for each residue ``r`` (default
``0 .. block_n - 1``) through :func:`~simfloat.attention.flash_decode` (contiguous or paged cache, optional
split-KV) on seeded inputs, the keys of every length being prefixes of one draw (the lengths differ in nothing
else), and measures each against float64 attention; ``simfloat attribute --tile-sweep`` prints the table.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from simfloat.attention import flash_decode
from simfloat.attention import plan as _plan
from simfloat.metrics import error_metrics

__all__ = ["REPORTED_RESIDUES", "format_tile_sweep", "tile_sweep"]

#: The residue classes of public silent-corruption reports: (name, modulus, residue).
REPORTED_RESIDUES = (
    ("flash-attention#2577", 128, 0),
    ("pytorch#196678", 128, 64),
    ("pytorch#191937", 32, 1),
)


def _reports(n: int) -> str:
    return " ".join(name for name, mod, res in REPORTED_RESIDUES if n % mod == res and n >= mod * (res == 0))


def _oracle(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float) -> np.ndarray:
    """float64 attention, q (seq_q, hq, d) over (n, hkv, d), GQA by repetition."""
    g = q.shape[1] // k.shape[1]
    kk, vv = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    s = np.einsum("qhd,khd->hqk", q, kk) * scale
    p = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("hqk,khd->qhd", p / p.sum(-1, keepdims=True), vv)


def tile_sweep(
    plan: str = "triton-bf16",
    *,
    block_n: int = 64,
    base: int = 128,
    residues: Sequence[int] | None = None,
    seq_q: int = 1,
    heads: int = 1,
    kv_heads: int | None = None,
    head_dim: int = 64,
    page_size: int | None = None,
    num_splits: int = 1,
    combine: str = "flash-attn",
    fmt: str | None = None,
    dist: str = "normal",
    seed: int = 0,
    block_m: int | None = None,
    draw_len: int | None = None,
) -> list[dict[str, Any]]:
    """Run ``plan``'s decode at key lengths ``base + r`` and measure each against float64 attention.

    Args:
        plan: a flash plan preset or :class:`~simfloat.attention.Plan`.
        block_n: the key tile; residues default to ``0 .. block_n - 1``.
        base: the smallest key length (default 128: residue 0 is flash-attention #2577's length).
        residues: the residues to run (ints >= 0), default every residue modulo ``block_n``.
        seq_q: query rows (decode: 1); heads / kv_heads: query and key/value heads (GQA); head_dim.
        page_size: run over a paged cache of this page size (shuffled pages), else a contiguous one.
        num_splits, combine: split-KV (:func:`~simfloat.attention.flash_decode`).
        fmt: the input format (default the plan's own, else bf16); dist: ``normal``, ``uniform`` or
            ``outlier`` (as ``simfloat attribute``); seed: the inputs' seed.
        block_m: the query tile.
        draw_len: the keys drawn (default the longest length run); every length runs a prefix of them, so a
            sweep split over several calls (the ``tile-sweep`` sweep kind) sees the same keys.

    Returns:
        One dict per residue: ``residue``, ``kv_len``, the :func:`~simfloat.metrics.error_metrics` keys
        (``cos_sim`` per output row), ``reports`` (the reported classes the length falls in, space-separated).

    Raises:
        ValueError: bad sizes or residues; what :func:`~simfloat.attention.flash_decode` raises.
    """
    from simfloat.attention._inputs import input_format
    from simfloat.attribution.cli import inputs

    pl = _plan(plan)
    for name, x, low in (("block_n", block_n, 1), ("base", base, 1), ("seq_q", seq_q, 1), ("heads", heads, 1)):
        if isinstance(x, bool) or not isinstance(x, int) or x < low:
            raise ValueError(f"{name} must be an int >= {low}, got {x!r}")
    rs = list(range(block_n)) if residues is None else list(residues)
    if not rs or any(isinstance(r, bool) or not isinstance(r, int) or r < 0 for r in rs):
        raise ValueError(f"residues must be a non-empty list of ints >= 0, got {residues!r}")
    hkv = heads if kv_heads is None else kv_heads
    f = fmt or input_format(pl) or "bf16"
    n_max = base + max(rs)
    if draw_len is not None:
        if isinstance(draw_len, bool) or not isinstance(draw_len, int) or draw_len < n_max:
            raise ValueError(f"draw_len must be an int >= the longest length {n_max}, got {draw_len!r}")
        n_max = draw_len
    q, k, v = inputs((1, seq_q, heads, head_dim), (1, n_max, hkv, head_dim), dist, f, seed)
    scale = 1.0 / math.sqrt(head_dim)
    rows = []
    for r in rs:
        n = base + r
        kc, vc, table = k[:, :n], v[:, :n], None
        if page_size is not None:
            pages = -(-n // page_size)
            perm = np.random.default_rng(seed + 1).permutation(pages)
            pad = pages * page_size - n
            kp = np.pad(k[0, :n], ((0, pad), (0, 0), (0, 0))).reshape(pages, page_size, hkv, head_dim)
            vp = np.pad(v[0, :n], ((0, pad), (0, 0), (0, 0))).reshape(pages, page_size, hkv, head_dim)
            kc, vc = np.empty_like(kp), np.empty_like(vp)
            kc[perm], vc[perm] = kp, vp
            table = perm[None, :]
        out = flash_decode(
            q,
            kc,
            vc,
            [n],
            block_table=table,
            plan=pl,
            block_m=block_m,
            block_n=block_n,
            num_splits=num_splits,
            combine=combine,
        )
        assert isinstance(out, np.ndarray)
        ref = _oracle(q[0], k[0, :n], v[0, :n], scale)
        row: dict[str, Any] = {"residue": r, "kv_len": n}
        row.update(error_metrics(out[0], ref, axis=-1))
        row["reports"] = _reports(n)
        rows.append(row)
    return rows


def format_tile_sweep(rows: list[dict[str, Any]], *, outlier: float = 2.0) -> str:
    """The sweep as a text table, a residue whose max error exceeds ``outlier`` x the median marked ``<<``."""
    med = float(np.median([r["max_abs"] for r in rows]))
    lines = [f"{'residue':>7} {'kv_len':>7} {'max_abs':>10} {'rmse':>10} {'cos_sim':>12}  reports"]
    for r in rows:
        mark = " <<" if med > 0 and r["max_abs"] > outlier * med else ""
        lines.append(
            f"{r['residue']:>7} {r['kv_len']:>7} {r['max_abs']:>10.3e} {r['rmse']:>10.3e} {r['cos_sim']:>12.9f}  "
            f"{r['reports']}{mark}"
        )
    lines.append(f"median max_abs {med:.3e}; << marks a residue above {outlier:g}x the median")
    return "\n".join(lines)
