"""Flash attention (FA2 online softmax, and FA1 / lazy-rescaling variants) under a precision plan.

The dataflow mirrors ``simfloat_gpu/kernels/flash_attention.py`` step for step (its docstring's T1..T14, E1, E2). Per
query
row of a q tile of ``block_m`` rows, and per key tile of ``block_n`` keys, left to right up to the kernel's
bound (all keys; causal: ``min((tile + 1) * block_m, seq_k)``); ``op(x)`` is x rounded once into op's format:

* T2/T3 ``s_j = qk(q_i . k_j)`` for the keys the row may see (later keys masked; their scores are never used);
  a mask (:mod:`simfloat.attention._masks`) drops keys by T3's ``where(keep, s_j, -inf)`` (p_j = 0), and an
  additive one makes the scores ``s_j = scale(fma(s_j, qk_scale, bias_j'))`` (``contract``; else
  ``scale(scale(s_j * qk_scale) + bias_j')``), with ``bias_j' = scale(bias_j * scale(log2 e))`` under exp2,
  after which the steps below run with ``qk_scale = 1``;
* T4 ``m_new = max(m_i, scale(max_j s_j * qk_scale))``, stored as ``m_i``; lazy: keep ``m_i`` unless
  ``m_i(m_new - m_i) > threshold``; with ``tie_shift`` (Qiu & Yao's fix, see :class:`Plan`) a tile max that
  two or more of the tile's scores tie is first shifted (``m_i(beta * max)`` if > 0, 0 if < 0);
  T5 ``m_sub = m_new``, or 0 while no key has been seen (-inf);
* T6 ``x_j = scale(fma(s_j, qk_scale, -m_sub))`` (``contract``),
  else ``scale(scale(s_j * qk_scale) - m_sub)``;
* T7 ``p_j = exp(exp2(x_j))`` (or exp); T8 ``l_ij = l_ij(... l_ij(p_0 + p_1) ...)`` sequentially (a chunked
  ``l_ij`` model: each chunk so from 0 in its inner format, the chunk sums added in the outer one, e.g. once);
* T9 ``alpha = alpha(exp2(alpha(m_i - m_sub)))``, 0 while ``m_i`` is -inf, 1 when lazy rescaling skips;
* T10 ``l_i = l_i(fma(l_i, alpha, l_ij))`` (``contract``), else ``l_i(l_i(l_i * alpha) + l_ij)``;
* T11 ``acc_d = acc(acc_d * alpha)``; per-step normalization (FA1):
  ``acc_d = acc(acc_d * acc(l_old * alpha))``;
* T12 ``p_j = p(p_j)``; T13 ``acc_d = pv(acc_d + sum_j p_j v_jd)`` over the whole tile of ``block_n`` keys
  (masked and padded keys have ``p_j = 0``, padded keys ``v = 0``), as ``tl.dot(p, v, acc)``;
  FA1: ``acc_d = normalize(acc_d / l_i)``; T14 ``m_i = m_new``;
* E1 ``o_d = normalize(acc_d / l_safe)`` with ``l_safe = 1`` if ``l_i == 0`` (FA2); E2 ``out(o_d)``.

Options of the walk (plan fields): ``kv_order`` walks the key tiles in reverse or the causal diagonal tiles first
(the trace's tile index stays the tile's own); ``contract_diagonal=False`` makes T6 two roundings in the causal
diagonal tiles; ``state="lse"`` keeps ``(m_i, lse_i)`` instead of ``(m_i, l_i)``: T4 takes the max against
``lse_i``, T10 is ``l_i = l_i(alpha(exp(alpha(lse_i - m_new))) + l_ij)`` and ``lse_i = m_i(m_new +
l_i(log l_i))``, and E1 ``o_d = normalize(acc_d * normalize(exp(normalize(m_i - lse_i))))`` (see :class:`Plan`).

A row that saw no key ends with out = 0, m = -inf, l = 0 (as the kernel's guards give); with top-left causal
alignment and seq_k >= 1 no row is ever fully masked.

The GPU's own exp2 (``ex2.approx.ftz.f32``) and row-sum order are values a plan carries (``exp2_impl``, an
ex2 table; ``sum_order``, the tl.sum order with its warp-layout rule; the ``h200-<fmt>`` presets: the shipped
h200 profile's); docs/results/h200-validation.md reports what they
reproduce. The scalar reference engine (the test oracle, and the traced path) is the one forward loop of
:mod:`simfloat.attention.reference`, which also runs the plans with quantizers; the default engine is
:mod:`simfloat.attention._engine`, bit for bit the same.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from simfloat.attention._build import check_engine, clamp_blocks, flash_engine
from simfloat.attention._flash_params import flash_params
from simfloat.attention._inputs import block, check_output, from_layout, prepare, to_layout
from simfloat.attention._masks import NO_MASK, mask_of
from simfloat.attention.fa4 import FA4_TILE_N, ex2_poly_mask, ex2_schedule
from simfloat.attention.plan import FLASH_OPS, Plan
from simfloat.attention.plan import plan as _plan
from simfloat.attention.quantized import quant_flash
from simfloat.attention.reference.forward import Trace, float_operands, trace_columns
from simfloat.attention.reference.forward import run as run_reference
from simfloat.attention.tiling import pick_tiles
from simfloat.attention.vector.forward import run as run_vector

__all__ = ["flash"]


def flash(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    plan: Plan | str = "triton-bf16",
    block_m: int | None = None,
    block_n: int | None = None,
    tiles: str | None = None,
    causal: bool = False,
    scale: float | None = None,
    trace: object = None,
    return_stats: bool = False,
    engine: str | None = None,
    layout: str = "bhsd",
    attn_mask: np.ndarray | None = None,
    key_lengths: object = None,
    window: tuple[int, int] | None = None,
    causal_align: str = "top-left",
    empty_rows: str = "zero",
) -> np.ndarray | tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Emulated flash attention ``softmax(scale * q @ k^T [mask]) @ v`` under a precision plan.

    Args:
        q: (..., seq_q, head_dim) float32/float64 (or float16) array. Values are used as they are: round them
            into the kernel's input format first (``simfloat.round(q, "bf16")``) to emulate low-precision inputs
            (other values are warned about: :class:`~simfloat.attention.InputFormatWarning`).
        k: (..., seq_k, head_dim); v: (..., seq_k, head_dim_v). Leading dims broadcast; seq_k >= 1. Grouped-
            query / multi-query attention: k and v (..., kv_heads, seq_k, d) with q (..., q_heads, seq_q, d),
            q_heads a multiple of kv_heads; query head h reads kv head h // (q_heads // kv_heads) (the bits of
            k and v repeated per query head).
        plan: a :class:`~simfloat.attention.Plan` or preset name (default ``"triton-bf16"``, as
            :func:`simfloat.attribute`). A plan with quantizers (``int8-reference``, ``fp8-e4m3``, ``sage3-fp4``,
            ...) runs :func:`~simfloat.attention.quant_flash` (its defaults: no incoherent processing).
        block_m: query rows per tile; block_n: keys per tile (any length; the last tiles may be partial;
            default 64 each). Tiles larger than the sequence give the bits of tiles clamped to it, and cost as
            much.
        tiles: a tile rule instead of block_m/block_n: ``"fa1:M=<elements>"``, FlashAttention-1's
            ``block_n = ceil(M / (4 d))``, ``block_m = min(block_n, d)`` for head dim d
            (:func:`~simfloat.attention.tiling.fa1_tiles`).
        causal: a causal mask, its diagonal placed by ``causal_align`` (default top-left: query i sees keys
            j <= i).
        scale: softmax scale, finite and > 0 (default 1/sqrt(head_dim)); with ``plan.exp2`` the kernel uses
            ``scale_op(scale_op(scale) * scale_op(log2 e))``.
        trace: a :class:`simfloat.Tracer` to record local errors and state drift, or None (no cost).
        return_stats: also return ``m`` and ``l`` ((..., seq_q) each): the final running max (log2 units with
            exp2) and the softmax denominator relative to it (``plan.state="lse"``: the kernel's lse and 1).
        engine: ``"vector"`` (the vectorized engine, :mod:`simfloat.attention._engine`) or ``"reference"``
            (the scalar loop of :mod:`simfloat.attention.reference`, which also records traces); None: vector,
            reference when tracing. Both give the same bits.
        layout: ``"bhsd"`` (q, k, v and the output (..., heads, seq, head_dim), as torch) or ``"bshd"``
            ((..., seq, heads, head_dim), as flash-attn; ``m`` and ``l`` stay (..., heads, seq_q), as its lse).
        attn_mask: None, or an array broadcastable to (..., heads, seq_q, seq_k) (either layout), SDPA's
            meaning: bool, True keeps (T3's ``where(keep, qk, -inf)``); or float, added to the scaled scores:
            rounded into the ``scale`` op's format, times ``scale(log2 e)`` (rounded) under exp2, then
            ``scale(fma(qk, qk_scale, bias))`` (``contract``; else ``scale(scale(qk * qk_scale) + bias)``);
            -inf masks. Never skips a key tile.
        key_lengths: None, or the valid keys (ints in [0, seq_k]) per leading index, broadcastable to the
            leading dims (or one per batch: (batch,)); later keys are padding, their tiles never walked.
        window: None or (left, right), flash-attn's ``window_size``: row i sees keys
            ``i + off - left <= j <= i + off + right`` (-1: unbounded; ``causal`` sets right to 0).
        causal_align: where ``causal`` and ``window`` put the diagonal: ``"top-left"`` (``off = 0``, the
            default, PyTorch's ``is_causal``) or ``"bottom-right"`` (``off = kv_len - seq_q``, flash-attn >=
            2.1). The structured masks (causal, window, key lengths) decide the key tiles a q tile walks, as
            FA2's ``n_block_min`` / ``n_block_max``; the keys a walked tile's row cannot see are masked.
        empty_rows: a row that sees no key: ``"zero"`` (the kernels: out 0, m -inf, l 0, so lse -inf),
            ``"nan"`` (SDPA's math softmax: out NaN) or ``"raise"`` (ValueError).

    Returns:
        (..., seq_q, head_dim_v) float64 array whose values are values of ``plan.out``'s format; with
        ``return_stats`` the tuple (out, m, l). Bitwise deterministic for any thread count.

    Raises:
        TypeError, ValueError: bad arrays, shapes, block sizes, scale, plan, tracer, engine or layout.

    Warns:
        InputFormatWarning: operands that are not values of the plan's input format.
        KernelOverflowWarning: finite inputs whose outputs are not (naming the op that overflowed).
    """
    pl = _plan(plan)
    if pl.quantized:
        masking = (attn_mask, key_lengths, window, causal_align, empty_rows)
        return _quantized(
            q, k, v, pl, block_m, block_n, tiles, causal, scale, trace, return_stats, engine, layout, masking
        )
    x = prepare(q, k, v, plan_=plan, causal=causal, scale=scale, trace=trace, layout=layout)
    x.mask = mask_of(x, attn_mask, key_lengths, window, causal_align, empty_rows)
    mk = NO_MASK if x.mask is None else x.mask.mask
    which = check_engine(engine, x.trace is not None)
    if x.plan.exp2_emu is not None and block_n is None and tiles is None:
        block_n = FA4_TILE_N  # the kernel's key tile, which its exp2 mix is laid out over
    block_m, block_n = pick_tiles(block_m, block_n, tiles, x.q.shape[-1])
    bm_req, bn_req = block(block_m, "block_m"), block(block_n, "block_n")
    fp = flash_params(x.plan, x.scale)
    n_lead, seq_q = x.q.shape[:2]
    seq_k, dv = x.v.shape[1:]
    bm, bn = clamp_blocks(bm_req, bn_req, seq_q, seq_k, x.plan.pv)
    if x.plan.exp2_emu is not None:  # FA4: which key positions take the software exp2
        fp = fp._replace(ex2_poly=ex2_poly_mask(_ex2_schedule(x.plan, x.q.shape[-1], dv, x.causal, seq_q), bn_req, bn))
    n_qt, n_kv = -(-seq_q // bm), -(-seq_k // bn)
    out = np.zeros((n_lead, seq_q, dv))
    m = np.empty((n_lead, seq_q))
    l = np.empty((n_lead, seq_q))  # noqa: E741
    wn = x.plan.sum_order.warps_n(bm_req, dv)  # the plan's tl.sum layout rule, of the requested tile
    if which == "vector":
        built = flash_engine(x.plan, fp, qc=x.q, kc=x.k, vc=x.v, bm=bm, bn=bn, causal=x.causal, wn=wn)
        assert built is not None  # only block-scaled dots can decline
        run_vector(built[1]._replace(mk=mk), out, m, l, built[0])
    else:
        tr = None
        if x.trace is not None:
            local, state = x.trace._start(
                "flash",
                x.plan.name,
                FLASH_OPS,
                n_lead,
                n_qt,
                n_kv,
                lead=x.lead,
                block_m=bm,
                block_n=bn,
                causal=x.causal,
                scale=x.scale,
            )
            tr = Trace(local, state, trace_columns(FLASH_OPS, False))
        ops = float_operands(x.q, x.k, x.v, bn, mk)
        run_reference(ops, fp, (bm, bn, int(x.causal), seq_k, wn), tr, out, m, l)
    check_output(out, x, flash, block_m=bm_req, block_n=bn_req)
    if x.mask is not None:
        x.mask.finish(out)
    out = to_layout(out.reshape(x.lead + (seq_q, dv)), layout)
    if return_stats:
        return out, m.reshape(x.lead + (seq_q,)), l.reshape(x.lead + (seq_q,))
    return out


def _ex2_schedule(pl: Plan, d: int, dv: int, causal: bool, seq_q: int) -> tuple[int, int, int]:
    """A plan's FA4 exp2 mix ``(freq, res, start_frg)``: fixed, or (``"fa4"``) the kernel's table for the call."""
    e = pl.exp2_emu
    if isinstance(e, tuple):
        return e
    f = pl.p.fmt  # fp8 inputs: P cast to fp8 for the fp8 P.V
    fp8 = f.exponent_bits + f.mantissa_bits + 1 <= 8
    return ex2_schedule(d, dv, causal, seq_q, fp8)


def _quantized(
    q: object,
    k: object,
    v: object,
    pl: Plan,
    block_m: int | None,
    block_n: int | None,
    tiles: str | None,
    causal: bool,
    scale: float | None,
    trace: object,
    return_stats: bool,
    engine: str | None,
    layout: str,
    masking: tuple[Any, Any, Any, Any, Any],
) -> np.ndarray | tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`flash` under a plan with quantizers: :func:`~simfloat.attention.quant_flash` with the tiles, the
    layout and the mask (attn_mask, key_lengths, window, causal_align, empty_rows) of the call."""
    attn_mask, key_lengths, window, causal_align, empty_rows = masking
    q, k, v = (from_layout(a, layout, n) for a, n in ((q, "q"), (k, "k"), (v, "v")))
    d = q.shape[-1] if isinstance(q, np.ndarray) and q.ndim else 0
    bm, bn = pick_tiles(block_m, block_n, tiles, d)
    res = quant_flash(
        q,  # type: ignore[arg-type]  # quant_flash checks the arrays
        k,  # type: ignore[arg-type]
        v,  # type: ignore[arg-type]
        plan=pl,
        block_m=bm,
        block_n=bn,
        causal=causal,
        scale=scale,
        trace=trace,  # type: ignore[arg-type]  # checked there
        return_stats=return_stats,
        engine=engine,
        attn_mask=attn_mask,
        key_lengths=key_lengths,
        window=window,
        causal_align=causal_align,
        empty_rows=empty_rows,
    )
    if isinstance(res, tuple):
        return (to_layout(res[0], layout), res[1], res[2])
    return to_layout(res, layout)
