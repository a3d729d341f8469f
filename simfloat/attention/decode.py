"""Decode attention: one or a few query rows per sequence over a (paged) KV cache, with split-KV.

The semantics are flash-attn's ``flash_attn_with_kvcache`` (read from its public source; the code here is
simfloat's own):

* **KV cache.** ``k_cache``/``v_cache`` are either contiguous, (batch, seqlen_cache, kv_heads, d), or a page
  pool, (num_pages, page_size, kv_heads, d), with a ``block_table`` (batch, max_pages) of page indices:
  sequence ``b``'s key ``j`` is row ``j % page_size`` of page ``block_table[b, j // page_size]``. Only the
  first ``cache_seqlens[b]`` keys are attended to.
* **Paging and the bits.** The kernels walk key tiles of ``block_n`` *logical* positions of the sequence
  (``[t * block_n, (t + 1) * block_n)``), gathering each tile's rows from whichever pages hold them; the page
  size changes addresses, never which keys share a tile. So a paged cache gives the bits of the same keys
  stored contiguously, for every page size (a multiple of the tile or not; tested). A kernel that walks one
  page per key tile is the case ``block_n = page_size``.
* **Split-KV (flash-decoding).** With ``num_splits > 1`` the keys are cut into splits at tile boundaries, as
  flash-attn's split kernel does: ``n_blocks = ceil(seqlen_k / block_n)`` tiles of the cache's capacity
  ``seqlen_k``, ``per = ceil(n_blocks / num_splits)`` tiles a split, split ``s`` the keys
  ``[s * per * block_n, min((s + 1) * per * block_n, cache_seqlens[b]))`` (empty past the sequence's end); or at
  explicit key offsets (``split_bounds``). Each split runs the plan's one forward loop over its own keys, its
  tiles starting at the split's start, and writes its partial output in float32 (the kernel's
  ``o_accum``: ``normalize(acc / l)`` with the output cast in float32) and its log-sum-exp in float32
  (``lse = fp32(m + fp32(log2 l))`` in log2 units with an exp2 plan, else ``fp32(m + fp32(ln l))``; an
  empty split: o = 0, lse = -inf). :func:`combine_splits` then merges them, every op rounded as the combine
  kernel does it. The partials and the combine are float32 whatever the plan (flash-attn's ``ElementAccum``),
  so a float64 plan's split run is float64 up to the float32 partials.

What is not modelled: appending new keys to the cache (flash-attn's ``k``/``v`` arguments), rotary embedding,
the GPU's ``lg2.approx`` /
``__logf`` (the logs here are correctly rounded) and ``__expf`` in the combine (the plan's exp2 model is used:
the H200's ``ex2.approx`` table for ``h200-*`` plans, else correctly rounded).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from simfloat import ops as _ops
from simfloat.attention._backward_inputs import log_rounded as _log_rounded
from simfloat.attention._specs import OpSpec
from simfloat.attention.flash import flash
from simfloat.attention.plan import Plan
from simfloat.attention.plan import plan as _plan
from simfloat.hardware import ex2_approx
from simfloat.rounding import round as _round

__all__ = ["COMBINES", "combine_splits", "flash_decode", "kv_splits", "num_splits_heuristic"]

#: The combine kernels :func:`combine_splits` models.
COMBINES = ("flash-attn", "divide")
_F32 = OpSpec("fp32")


def num_splits_heuristic(batch_nheads_mblocks: int, num_sms: int, num_n_blocks: int, max_splits: int = 128) -> int:
    """flash-attn's choice of the number of splits (its ``num_splits_heuristic``), for ``num_splits=0``.

    One split if the (batch x heads x query tiles) blocks fill 80% of the SMs; else, among the split counts
    up to ``min(max_splits, num_sms, num_n_blocks)`` that change the tiles per split, the wave efficiency
    ``w / ceil(w)`` with ``w = blocks * splits / num_sms``, and the smallest count within 85% of the best.

    Args:
        batch_nheads_mblocks: batch * query heads * ceil(seqlen_q / 64).
        num_sms: the SM count as flash-attn passes it (twice the multiprocessor count: 128-thread blocks).
        num_n_blocks: key tiles of the cache, ``ceil(seqlen_k / block_n)`` (flash-attn's block_n: 256 for head
            dim <= 64, 128 for <= 128, else 64).
        max_splits: flash-attn passes 128.

    Returns:
        The number of splits (>= 1).

    Raises:
        ValueError: an argument that is not an int >= 1.
    """
    for name, x in (
        ("batch_nheads_mblocks", batch_nheads_mblocks),
        ("num_sms", num_sms),
        ("num_n_blocks", num_n_blocks),
        ("max_splits", max_splits),
    ):
        if isinstance(x, bool) or not isinstance(x, (int, np.integer)) or x < 1:
            raise ValueError(f"{name} must be an int >= 1, got {x!r}")
    if batch_nheads_mblocks >= 0.8 * num_sms:
        return 1
    top = min(max_splits, num_sms, num_n_blocks)
    eff = []
    for s in range(1, top + 1):
        eligible = s == 1 or -(-num_n_blocks // s) != -(-num_n_blocks // (s - 1))
        waves = np.float32(batch_nheads_mblocks * s) / np.float32(num_sms)  # float32, as the C++
        eff.append(float(waves / np.float32(math.ceil(waves))) if eligible else 0.0)
    best = max(eff)
    for s in range(1, top + 1):
        if eff[s - 1] >= 0.85 * best:
            return s
    return 1


def kv_splits(seqlen: int, capacity: int, block_n: int, num_splits: int) -> list[tuple[int, int]]:
    """flash-attn's split of one sequence's keys: whole tiles of ``block_n``, ``ceil(ceil(capacity / block_n) /
    num_splits)`` tiles a split, cut at the sequence's length (later splits empty).

    Args:
        seqlen: the sequence's keys (``cache_seqlens[b]``), 0 <= seqlen <= capacity.
        capacity: the cache's keys per sequence (the kernel's ``seqlen_k``).
        block_n: keys per tile; num_splits: >= 1.

    Returns:
        ``num_splits`` (start, end) key ranges, end >= start.
    """
    n_blocks = -(-capacity // block_n)
    per = -(-n_blocks // num_splits) * block_n
    return [(min(s * per, seqlen), min((s + 1) * per, seqlen)) for s in range(num_splits)]


def _exp(x: np.ndarray, pl: Plan) -> np.ndarray:
    """The combine's exp of float32 values, in the lse's base, rounded into float32 (the plan's exp2 model)."""
    if pl.exp2:
        if pl.exp2_impl == "correctly_rounded":
            return np.asarray(_ops.exp2(x, "fp32"), dtype=np.float64)
        return ex2_approx(x, ftz=True, table=pl.exp2_impl).astype(np.float64)
    return np.asarray(_ops.exp(x, "fp32"), dtype=np.float64)


def _log(x: np.ndarray, pl: Plan) -> np.ndarray:
    return _log_rounded(np.asarray(x, dtype=np.float64), _F32, pl.exp2)


def _lse_sum(e: np.ndarray, head_dim_v: int) -> np.ndarray:
    """flash-attn's combine: the sum of the splits' exps over its thread layout (128 threads, ``kBlockM`` rows a
    block by head dim): lane ``r`` of ``W`` adds splits ``r, r + W, ...`` in turn, then a butterfly over the
    ``W`` lanes (``__shfl_xor`` with offsets W/2, ..., 1). Float32 adds; e is (num_splits, ...)."""
    n = e.shape[0]
    hd = -(-head_dim_v // 32) * 32 if head_dim_v <= 192 else 256  # the kernel's head dim (rounded)
    bm = 4 if hd % 128 == 0 else (8 if hd % 64 == 0 else 16)
    max_splits = max(2, 1 << (n - 1).bit_length())
    w = min(128 // bm, max_splits)
    lanes = []
    for r in range(w):
        idx = list(range(r, n, w))
        if not idx:
            lanes.append(np.zeros(e.shape[1:]))  # exp(-inf - max) = 0 for the padded splits
            continue
        s = e[idx[0]]
        for i in idx[1:]:
            s = np.asarray(_ops.add(s, e[i], "fp32"), dtype=np.float64)
        lanes.append(s)
    off = w // 2
    while off >= 1:
        lanes = [np.asarray(_ops.add(lanes[i], lanes[i + off], "fp32"), dtype=np.float64) for i in range(off)]
        off //= 2
    return lanes[0]


def combine_splits(
    o_parts: np.ndarray,
    lse_parts: np.ndarray,
    *,
    plan: Plan | str = "triton-bf16",
    combine: str = "flash-attn",
) -> tuple[np.ndarray, np.ndarray]:
    """Merge split-KV partial outputs by their log-sum-exps, each op rounded into float32 as the combine kernel.

    ``"flash-attn"`` (its ``combine_attn_seqk_parallel``): ``mx = max_s lse_s`` (0 if all are -inf);
    ``sum = sum_s exp(fp32(lse_s - mx))`` in the kernel's lane order (:func:`_lse_sum`); ``lse =
    fp32(fp32(log sum) + mx)`` (+inf if sum is 0); ``scale_s = exp(fp32(lse_s - lse))``; ``o = fma(scale_s, o_s,
    o)`` over s = 0, 1, ... from 0; then the plan's output cast. No division: the scales are normalized.

    ``"divide"`` (a two-pass Triton-style reduce): ``w_s = exp(fp32(lse_s - mx))``; ``num = fma(w_s, o_s, num)``
    and ``den = fp32(den + w_s)`` over s in order; ``o = fp32(num / den)``; ``lse = fp32(fp32(log den) + mx)``;
    then the output cast.

    exp and log are in the lse's base (exp2 / log2 with an exp2 plan, whose lse is in log2 units), the exp by the
    plan's exp2 model (``exp2_impl``), the log correctly rounded.

    Args:
        o_parts: (num_splits, ..., head_dim_v) float32 values (the splits' partial outputs).
        lse_parts: (num_splits, ...) float32 values (-inf: an empty split).
        plan: the plan whose exp model, lse base and output cast apply.
        combine: one of :data:`COMBINES`.

    Returns:
        (out, lse): (..., head_dim_v) values of ``plan.out``'s format and (...) float32 values.

    Raises:
        TypeError, ValueError: non-arrays, shapes that disagree, values that are not float32 or NaN, an
            unknown combine.
    """
    pl = _plan(plan)
    if combine not in COMBINES:
        raise ValueError(f"combine must be one of {', '.join(COMBINES)}, got {combine!r}")
    if not isinstance(o_parts, np.ndarray) or not isinstance(lse_parts, np.ndarray):
        raise TypeError("o_parts and lse_parts must be numpy arrays")
    if o_parts.ndim < 2 or o_parts.shape[:-1] != lse_parts.shape:
        raise ValueError(
            f"o_parts must be (num_splits, ..., head_dim_v) and lse_parts (num_splits, ...), got {o_parts.shape} "
            f"and {lse_parts.shape}"
        )
    o = o_parts.astype(np.float64)
    lse = lse_parts.astype(np.float64)
    for name, x in (("o_parts", o), ("lse_parts", lse)):
        if np.any(np.isnan(x)) or np.any(x.astype(np.float32).astype(np.float64) != x):
            raise ValueError(f"{name} must hold float32 values (the kernel's float32 partials), without NaN")
    if np.any(np.isinf(o)) or np.any(lse == np.inf):
        raise ValueError("o_parts must be finite and lse_parts < +inf")
    mx = lse.max(axis=0)
    mx = np.where(mx == -np.inf, 0.0, mx)
    e = _exp(np.asarray(_ops.sub(lse, mx, "fp32"), dtype=np.float64), pl)
    acc = np.zeros(o.shape[1:])
    if combine == "flash-attn":
        total = _lse_sum(e, o.shape[-1])
        with np.errstate(divide="ignore"):
            logs = _log(np.where(total > 0, total, 1.0), pl)
        lse_out = np.where(total > 0, np.asarray(_ops.add(logs, mx, "fp32"), dtype=np.float64), np.inf)
        with np.errstate(invalid="ignore"):
            diff = np.asarray(_ops.sub(lse, lse_out, "fp32"), dtype=np.float64)
        sc = _exp(np.where(np.isnan(diff), -np.inf, diff), pl)
        for s in range(o.shape[0]):
            acc = np.asarray(_ops.fma(sc[s][..., None], o[s], acc, "fp32"), dtype=np.float64)
    else:
        den = np.zeros(lse.shape[1:])
        for s in range(o.shape[0]):
            acc = np.asarray(_ops.fma(e[s][..., None], o[s], acc, "fp32"), dtype=np.float64)
            den = np.asarray(_ops.add(den, e[s], "fp32"), dtype=np.float64)
        safe = np.where(den > 0, den, 1.0)
        acc = np.asarray(_ops.div(acc, safe[..., None], "fp32"), dtype=np.float64)
        lse_out = np.where(den > 0, np.asarray(_ops.add(_log(safe, pl), mx, "fp32"), dtype=np.float64), np.inf)
    out = np.asarray(_round(acc, pl.out.fmt, pl.out.mode), dtype=np.float64)
    return out, lse_out


def _int_array(x: object, name: str, ndim: int) -> np.ndarray:
    arr = np.asarray(x)
    if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"{name} must hold integers (torch.int32), got dtype {arr.dtype}")
    if arr.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {arr.shape}")
    return arr.astype(np.int64)


def _gather(cache: np.ndarray, b: int, n: int, table: np.ndarray | None, page: int) -> np.ndarray:
    """Sequence b's first n keys, (n, kv_heads, d), in logical order (pages gathered through the table)."""
    if table is None:
        return cache[b, :n]
    pages = table[b, : -(-n // page)]
    return cache[pages].reshape((-1,) + cache.shape[2:])[:n]


def _check_cache(
    k_cache: object, v_cache: object, cache_seqlens: object, block_table: object, batch: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None, int, int]:
    """The checked cache: (k, v, lengths, table, page_size, capacity)."""
    for name, x in (("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(x, np.ndarray) or x.ndim != 4:
            raise ValueError(f"{name} must be a 4-D numpy array, got {getattr(x, 'shape', type(x).__name__)}")
    assert isinstance(k_cache, np.ndarray) and isinstance(v_cache, np.ndarray)
    if k_cache.shape[:3] != v_cache.shape[:3]:
        raise ValueError(f"k_cache and v_cache must agree but in head_dim_v, got {k_cache.shape} and {v_cache.shape}")
    if isinstance(cache_seqlens, (int, np.integer)) and not isinstance(cache_seqlens, bool):
        cache_seqlens = np.full(batch, int(cache_seqlens))
    lens = _int_array(cache_seqlens, "cache_seqlens", 1)
    if lens.shape != (batch,):
        raise ValueError(f"cache_seqlens must be an int or (batch,) = ({batch},), got shape {lens.shape}")
    if block_table is None:
        if k_cache.shape[0] != batch:
            raise ValueError(
                f"without block_table, k_cache must be (batch, seqlen_cache, kv_heads, d) with batch {batch}, got "
                f"{k_cache.shape}"
            )
        table, page, capacity = None, k_cache.shape[1], k_cache.shape[1]
    else:
        table = _int_array(block_table, "block_table", 2)
        if table.shape[0] != batch:
            raise ValueError(f"block_table must be (batch, max_pages) with batch {batch}, got {table.shape}")
        page = k_cache.shape[1]
        capacity = table.shape[1] * page
        if page < 1:
            raise ValueError(f"the page pool must hold pages of at least one key, got {k_cache.shape}")
        for b in range(batch):
            if not 0 <= lens[b] <= capacity:
                break  # reported below
            used = table[b, : -(-int(lens[b]) // page)]
            if used.size and (used.min() < 0 or used.max() >= k_cache.shape[0]):
                raise ValueError(
                    f"block_table[{b}] names page {int(used.min() if used.min() < 0 else used.max())} outside the "
                    f"pool of {k_cache.shape[0]} pages"
                )
    if np.any(lens < 0) or np.any(lens > capacity):
        b = int(np.flatnonzero((lens < 0) | (lens > capacity))[0])
        raise ValueError(f"cache_seqlens[{b}] = {int(lens[b])} is outside [0, {capacity}] (the cache's capacity)")
    return k_cache, v_cache, lens, table, page, capacity


def flash_decode(
    q: np.ndarray,
    k_cache: np.ndarray,
    v_cache: np.ndarray,
    cache_seqlens: int | Sequence[int] | np.ndarray,
    *,
    block_table: np.ndarray | None = None,
    plan: Plan | str = "triton-bf16",
    block_m: int | None = None,
    block_n: int | None = None,
    causal: bool = False,
    scale: float | None = None,
    num_splits: int = 1,
    split_bounds: Sequence[int] | None = None,
    combine: str = "flash-attn",
    num_sms: int = 264,
    return_lse: bool = False,
    engine: str | None = None,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """Emulated decode attention over a (paged) KV cache, optionally split-KV (flash-attn's
    ``flash_attn_with_kvcache``); see the module docstring for the dataflow.

    Args:
        q: (batch, seqlen_q, heads, head_dim), seqlen_q small (decode: 1, or a few for speculative decoding).
        k_cache, v_cache: (batch, seqlen_cache, kv_heads, head_dim[_v]) without ``block_table``, else the page
            pool (num_pages, page_size, kv_heads, head_dim[_v]). heads a multiple of kv_heads (GQA / MQA).
        cache_seqlens: an int or (batch,) ints: the keys each sequence attends to.
        block_table: (batch, max_pages) page indices, or None (contiguous cache).
        plan, block_m, block_n, scale, engine: as :func:`~simfloat.attention.flash` (block_n: the key tile;
            flash-attn's split kernel uses block_m 64 and block_n 256 for head dim <= 64, 128 for <= 128, else
            64).
        causal: flash-attn's bottom-right aligned mask: query row i of a sequence with n keys sees keys
            j <= n - seqlen_q + i (with seqlen_q == 1 nothing is masked). In a split a row may see no key: its
            partial output is 0 and its lse -inf, as the split kernel writes them.
        num_splits: >= 1, or 0 for flash-attn's heuristic (:func:`num_splits_heuristic` with its block_n rule
            and ``num_sms``). 1 runs the one-pass kernel: :func:`~simfloat.attention.flash` on the keys.
        split_bounds: explicit interior split offsets (increasing ints > 0, the same for every sequence;
            offsets at or past a sequence's length leave empty splits) instead of ``num_splits``' rule.
        combine: the combine kernel, one of :data:`COMBINES` (with more than one split).
        num_sms: for ``num_splits=0``: the SM count as flash-attn passes it (2 x 132 on an H100 SXM).
        return_lse: also return the log-sum-exp, (batch, heads, seqlen_q) float32 values (log2 units with an
            exp2 plan; +inf for a sequence with no key).

    Returns:
        (batch, seqlen_q, heads, head_dim_v) float64 array of values of ``plan.out``'s format (0 for a sequence
        with no key); with ``return_lse`` the tuple (out, lse).

    Raises:
        TypeError, ValueError: bad shapes, lengths, page indices, splits or combine; and what
            :func:`~simfloat.attention.flash` raises.
    """
    pl = _plan(plan)
    if not isinstance(q, np.ndarray) or q.ndim != 4:
        raise ValueError(f"q must be a (batch, seqlen_q, heads, head_dim) numpy array, got {getattr(q, 'shape', q)}")
    batch, seqlen_q, heads, _ = q.shape
    kc, vc, lens, table, page, capacity = _check_cache(k_cache, v_cache, cache_seqlens, block_table, batch)
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    if causal and seqlen_q > 1 and np.any((lens > 0) & (lens < seqlen_q)):
        raise ValueError(
            f"causal decode with seqlen_q={seqlen_q} needs at least seqlen_q cached keys per sequence (a row "
            f"would see no key), got cache_seqlens {[int(x) for x in lens]}"
        )
    if combine not in COMBINES:
        raise ValueError(f"combine must be one of {', '.join(COMBINES)}, got {combine!r}")
    if isinstance(num_splits, bool) or not isinstance(num_splits, (int, np.integer)) or num_splits < 0:
        raise ValueError(f"num_splits must be an int >= 0 (0: flash-attn's heuristic), got {num_splits!r}")
    bn = 64 if block_n is None else block_n
    if split_bounds is not None:
        raw = list(split_bounds)
        bounds = [int(x) for x in raw if not isinstance(x, bool) and isinstance(x, (int, np.integer))]
        if not raw or len(bounds) != len(raw) or any(b <= a for a, b in zip([0] + bounds, bounds, strict=False)):
            raise ValueError(f"split_bounds must be increasing ints > 0, got {list(split_bounds)!r}")
        n_split = len(bounds) + 1
    else:
        if num_splits == 0:
            fa_bn = 256 if q.shape[3] <= 64 else (128 if q.shape[3] <= 128 else 64)
            num_splits = num_splits_heuristic(
                batch * heads * -(-seqlen_q // 64), num_sms, max(1, -(-capacity // fa_bn)), 128
            )
        n_split = int(num_splits)
    split_plan = pl.replace(out=_F32) if n_split > 1 else pl
    dv = vc.shape[3]
    o_parts = np.zeros((n_split, batch, seqlen_q, heads, dv))
    lse_parts = np.full((n_split, batch, heads, seqlen_q), -np.inf)
    for b in range(batch):
        n = int(lens[b])
        if split_bounds is not None:
            cuts = [min(x, n) for x in [0] + bounds + [n]]
            ranges = [(cuts[i], max(cuts[i], cuts[i + 1])) for i in range(n_split)]
        else:
            ranges = kv_splits(n, capacity, bn, n_split)
        kb = _gather(kc, b, n, table, page)
        vb = _gather(vc, b, n, table, page)
        for s, (k0, k1) in enumerate(ranges):
            if k1 == k0:
                continue
            mask = None  # causal, seqlen_q > 1: row i sees the keys j <= n - seqlen_q + i (bottom-right)
            if causal and seqlen_q > 1:
                mask = np.arange(k0, k1)[None, :] <= (n - seqlen_q + np.arange(seqlen_q))[:, None]
            res = flash(
                q[b],
                kb[k0:k1],
                vb[k0:k1],
                plan=split_plan,
                block_m=block_m,
                block_n=block_n,
                scale=scale,
                return_stats=True,
                engine=engine,
                layout="bshd",
                attn_mask=mask,
            )
            assert isinstance(res, tuple)
            o_parts[s, b], m, lsum = res
            logs = np.full(lsum.shape, -np.inf)  # a row that sees no key in the split: lse -inf
            seen = lsum > 0
            logs[seen] = _log(lsum[seen], pl)
            lse_parts[s, b] = np.asarray(_ops.add(m, logs, "fp32"), dtype=np.float64)
    if n_split == 1:
        out, lse = o_parts[0], np.where(lse_parts[0] == -np.inf, np.inf, lse_parts[0])
    else:
        lse_t = np.swapaxes(lse_parts, -1, -2)  # (splits, batch, seqlen_q, heads): o's lead dims
        out, lse_c = combine_splits(o_parts, lse_t, plan=pl, combine=combine)
        lse = np.swapaxes(lse_c, -1, -2)
    if return_lse:
        return out, lse
    return out
