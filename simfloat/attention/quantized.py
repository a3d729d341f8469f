"""Quantized flash attention: INT8 (INT-FlashAttention) and FP8 (FA3 style) under precision plans.

:func:`int8_flash` and :func:`fp8_flash` emulate ``simfloat_gpu/kernels/int8_attention.py`` and
``simfloat_gpu/kernels/fp8_attention.py`` op for
op (their module docstrings number the steps; Q1..Q6/F1..F4 quantization, H1 host scale, T1..T20 per key tile,
E1/E2 epilogue). Under ``simfloat_gpu.interpreter.faithful()`` (integer dots exact, casts and divisions correctly
rounded, sequential row sums, the sm90 tensor-core dot models) the Triton kernels and these functions agree
bit for bit (``tests/gpu/test_gpu_int8_crossval.py``).

A :class:`~simfloat.attention.Plan` with quantizers names every operation, the four quantizers included, each a
:class:`Quant` (kind, granularity, code rounding rule, the format of its own scale arithmetic), so that tracing
(:class:`simfloat.Tracer`) and attribution work as for :func:`~simfloat.attention.flash`: :meth:`Plan.isolate
<simfloat.attention.Plan.isolate>` keeps one op of a plan and makes everything else exact (float64, no
quantization), :meth:`Plan.ablate <simfloat.attention.Plan.ablate>` makes one op exact and keeps the rest.

Per query row i and key tile jt (``block_n`` keys; causal: up to the q tile's bound, as the kernels), with
``op(x)`` = x rounded once into op's format:

* quantizers, once per call: ``x = pre(x)``; ``scale = arith(amax / qmax)`` per group (1 for an all-zero
  group); int: ``code = clamp(round_rule(arith(x / scale)), +-qmax)``; float:
  ``code = fmt(clamp(arith(x / scale), +-qmax))``; ``"unscaled"``: ``code = fmt(x)`` (a plain cast);
  ``"none"``: the value itself;
* ``score_scaling="scores"`` (INT8 T2..T5): ``s = dequant(dequant(qk(q_code . k_code) * q_scale) * k_scale)``,
  ``s_scale = qk_scale``; ``"folded"`` (FP8 K2, T2): ``s = qk(q_code . k_code)``,
  ``s_scale = scale(scale(qk_scale * q_scale) * k_scale)`` (scales constant over a q tile / key tile);
* Q smoothing (``q_smooth``, SageAttention2/3; off unless the plan has it): Q less its mean per q tile, the
  correction ``delta_s = q_delta(mean_q . k)`` per q tile and key either the qk MMA's initial accumulator
  (``s = qk(delta_s + q_code . k_code)``, SageAttention3's kernel, where Q's and K's codes carry their whole
  scale into the MMA) or added to the dequantized score (``s = dequant(s + delta_s)``);
* ``m_new = max(m_i, scale(max_j s_j * s_scale))``; ``x_j = scale(fma(s_j, s_scale, -m_sub))``;
  ``p_j = exp(exp2(x_j))``; ``alpha = alpha(exp2(alpha(m_i - m_sub)))`` (0 while m_i = -inf); a block P
  quantizer with a fixed first level (SageAttention3's released kernel) shifts the exponent instead:
  ``x_j = scale(fma(s_j, s_scale, -scale(m_sub - scale(log2 qmax))))``, so P arrives scaled by about qmax;
* ``c_j = p_quant(p_j)`` (INT8 T12..T14: ``trunc(fp16(fp16(p) * 127 + 0.5))``, FP8 T10: ``fp8(p)``);
* ``l_ij`` = sequential ``l_i`` sum of p (``row_sum="reference"``) or of the quantized P (``"consistent"``;
  integer codes: the exact integer sum, then ``l_i(sum / qmax)``); ``l_i = l_i(fma(l_i, alpha, l_ij))``;
* ``pv_update="separate"`` (INT8 T17..T19): ``pv = pv(c . v_code)`` from 0,
  ``y = pv_dequant(pv_dequant(pv * v_scale) / qmax_P)``, ``acc = acc(fma(acc, alpha, y))``;
  ``"into_acc"`` (FP8 per-tensor, half-INT8): ``acc = pv(acc(acc * alpha) + c . v_code)`` (``tl.dot(p, v,
  acc)``), V's scale applied once in the epilogue (``pv_dequant(acc * v_scale)``); ``"scaled"`` (FP8
  per-block): ``acc = pv_dequant(fma(pv(c . v_code), v_scale, acc(acc * alpha)))``;
* epilogue ``out(normalize(acc / l))``.

The qk/pv dot products take accumulation models (:mod:`simfloat.accumulate`); ``EXACT`` (float64, exact for
the integer codes) models the INT8 x INT8 -> INT32 tensor cores. Two engines give the same bits: the vectorized
engine (default; :mod:`simfloat.attention.vector`, the one vectorized forward loop of every plan: the dots as
row kernels over a key tile or the head dimension, the element-wise ops as branch-free lane loops) and the
scalar reference (:mod:`simfloat.attention.reference`, ``engine="reference"``: the one scalar forward loop of
every plan), kept as the test oracle and where traces are recorded. The cost is O(seq_q * seq_k * head_dim) either way.

Block-scaled quantizers (``Quant("block", ...)``, NVFP4/MX, SageAttention3's FP4) and block-scaled MMA models
(``tensor_core(..., kind="nvf4" | "mxf4" | "mxf8f6f4")``) run on both engines, with the same bits. The vector
engine quantizes P per key tile with the reference's own function
(:func:`simfloat.attention._quant_kernels.block_p_codes`) and runs a block-scaled MMA on the row kernels
(:func:`simfloat.accumulate._rows.scaled_mma`: the codes times their block scales, alignment weights from the scales'
exponents, fp4 groups of 16 summed exactly); operands whose products could reach the MMA's output range (MX
scales on huge inputs) make it decline, and such a call runs on the reference. Their blocks run along the k
dimension of the MMA an operand feeds (Q, K: the head dimension; V, P: the keys, from each key tile's first
key, so a block-scaled P.V needs block_n a multiple of its scale block). A block-scaled MMA takes the codes and
per-element block scales; any other dot model takes the values (codes times block scales, exact in float64). A
level above the block scales (NVFP4's tensor scale) is applied after the MMA: Q's and K's as the per-row /
per-key ``dequant`` scales, V's in the epilogue; P's per-row first level (``"per-token"``) times each key
tile's P.V (``pv_dequant``); a fixed first level (``"fixed"``) is not applied anywhere (the row sum and the
accumulator both carry it; it cancels in ``acc / l``).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from simfloat import ops as _ops
from simfloat.accumulate import BlockFMA, matmul
from simfloat.attention import _quant_kernels as _qk
from simfloat.attention._build import check_engine, clamp_blocks, flash_engine
from simfloat.attention._flash_params import flash_params
from simfloat.attention._inputs import block, prepare
from simfloat.attention._masks import NO_MASK, mask_of
from simfloat.attention._specs import OpParams, OpSpec, _scalar_spec
from simfloat.attention.plan import Plan, QuantPlan, quant_plan, quant_presets
from simfloat.attention.quant import EXACT, INT_RULES, QUANTIZERS, Quant, checked_choice
from simfloat.attention.quant_plan import FP8_NAMES, QUANT_OPS
from simfloat.attention.reference.forward import Operands, Trace, key_rows, trace_columns, v_tiles
from simfloat.attention.reference.forward import run as run_reference
from simfloat.attention.vector.forward import run as run_vector
from simfloat.blockscale import BlockFormat
from simfloat.formats import FloatFormat
from simfloat.rounding import round as _round
from simfloat.trace import Tracer

__all__ = [
    "EXACT",
    "QUANTIZERS",
    "QUANT_OPS",
    "Quant",
    "QuantPlan",
    "fp8_flash",
    "hadamard_rotation",
    "int8_flash",
    "quant_flash",
    "quant_plan",
    "quant_presets",
    "mean_key",
    "quantize",
    "smooth_keys",
    "smooth_queries",
]


def _amax_groups(x: np.ndarray, granularity: str, group: int | None) -> np.ndarray:
    """max |x| per group, shaped to broadcast against x (..., S, D); per-block expanded to every token."""
    a = np.abs(x)
    if granularity == "per-token":
        return a.max(axis=-1, keepdims=True)
    if granularity == "per-tensor":
        return a.max(axis=(-2, -1), keepdims=True)
    if granularity == "per-channel":
        return a.max(axis=-2, keepdims=True)
    assert group is not None
    s = x.shape[-2]
    n_g = -(-s // group)
    pad = np.zeros(x.shape[:-2] + (n_g * group, x.shape[-1]))
    pad[..., :s, :] = a
    g = pad.reshape(x.shape[:-2] + (n_g, group * x.shape[-1])).max(axis=-1)
    return np.repeat(g, group, axis=-1)[..., :s, None]


def _block_parts(x64: np.ndarray, quant: Quant, axis: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A block quantizer on x64 (already cast by ``pre``): (codes, block scale of every element, the level
    above: per-tensor (..., 1, 1), per-token (..., 1), fixed ``1/qmax`` (``t = arith(x * qmax)`` blocked), or
    1)."""
    bf = quant.fmt
    assert isinstance(bf, BlockFormat) and isinstance(quant.arith, OpSpec)
    bf = dataclasses.replace(bf, axis=axis)
    gran = quant.granularity
    if gran == "per-tensor":
        if x64.ndim < 2:
            raise ValueError(f"granularity 'per-tensor' needs x of shape (..., seq, head_dim), got {x64.shape}")
        flat = x64.reshape((-1,) + x64.shape[-2:])
        codes, bs, g = np.empty(flat.shape), np.empty(flat.shape), np.empty(flat.shape[0])
        for i in range(flat.shape[0]):
            bq = bf.quantize(flat[i], global_scale="auto")
            codes[i], bs[i], g[i] = bq.codes, bq.expanded_scales(), bq.global_scale
        return codes.reshape(x64.shape), bs.reshape(x64.shape), g.reshape(x64.shape[:-2] + (1, 1))
    if gran == "per-token":  # SageAttention3's P: rows scaled onto [0, qmax] first
        assert quant.qmax is not None
        amax = np.ascontiguousarray(np.abs(x64).max(axis=-1, keepdims=True, initial=0.0))
        flat_s1 = np.empty(amax.size)
        arith = OpParams(quant.arith.fmt.params, int(quant.arith.mode))
        _qk.scales_from_amax(amax.reshape(-1), flat_s1, quant.qmax, arith)
        s1: np.ndarray = flat_s1.reshape(amax.shape)
        t = np.asarray(_ops.div(x64, np.broadcast_to(s1, x64.shape), quant.arith.fmt, quant.arith.mode), np.float64)
        bq = bf.quantize(t)
        return bq.codes, bq.expanded_scales(), s1
    if gran == "fixed":  # SageAttention3's kernel: P times qmax (the softmax's shift), then the blocks
        assert quant.qmax is not None
        t = _round(x64 * quant.qmax, quant.arith.fmt, quant.arith.mode)
        bq = bf.quantize(t)
        return bq.codes, bq.expanded_scales(), np.asarray(1.0 / quant.qmax)
    bq = bf.quantize(x64)
    return bq.codes, bq.expanded_scales(), np.ones(())


def quantize(x: np.ndarray, quant: Quant, *, group: int | None = None, axis: int = -1) -> tuple[np.ndarray, np.ndarray]:
    """Codes and scales of ``x`` under a quantizer, as the kernels compute them (Q1..Q6 / F1..F4).

    Args:
        x: (..., seq, head_dim) float32/float64 array (P: any shape, with granularity 'fixed'/'unscaled').
        quant: the :class:`Quant`.
        group: tokens per scale for granularity ``"per-block"`` (``"per-warp"`` takes ``quant.group``).
        axis: the blocked axis of a block quantizer (-1: Q, K and P rows; -2: V, blocks of keys).

    Returns:
        (codes, scale): float64 codes of x's shape (integers for int kinds) and float64 scales broadcasting
        against them (per-token (..., seq, 1), per-tensor (..., 1, 1), per-channel (..., 1, head_dim),
        per-block and per-warp (..., seq, 1), fixed: ``1/qmax`` as a 0-d array, unscaled/none: 1; block: the
        scale of every element, block scale times the level above it, exact in float64), with
        ``x ~= codes * scale``.

    Raises:
        TypeError: x is not a float32/float64 array or quant not a Quant. ValueError: missing group.
    """
    if not isinstance(quant, Quant):
        raise TypeError(f"quant must be a Quant, got {type(quant).__name__}")
    if not isinstance(x, np.ndarray) or x.dtype not in (np.float32, np.float64):
        raise TypeError("x must be a float32 or float64 numpy array")
    x64 = np.array(x, dtype=np.float64)
    if quant.kind == "none":
        return x64, np.ones(())
    if quant.pre is not None:
        assert isinstance(quant.pre, OpSpec)
        x64 = _round(x64, quant.pre.fmt, quant.pre.mode)
    if quant.kind == "block":
        codes, bs, lvl = _block_parts(x64, quant, axis)
        return codes, bs * lvl
    assert isinstance(quant.arith, OpSpec) and quant.qmax is not None
    arith = OpParams(quant.arith.fmt.params, int(quant.arith.mode))
    gran = quant.granularity
    if gran == "unscaled":
        assert isinstance(quant.fmt, FloatFormat)
        return _round(x64, quant.fmt, quant.rounding), np.ones(())
    if gran == "fixed":
        codes = np.empty(x64.size)
        if quant.kind == "int":
            _qk.fixed_codes(x64.reshape(-1), codes, arith, quant.qmax, INT_RULES.index(quant.rounding))
        else:
            assert isinstance(quant.fmt, FloatFormat)
            code_op = OpParams(quant.fmt.params, int(quant.rounding))
            _qk.fixed_float_codes(x64.reshape(-1), codes, arith, code_op, quant.qmax)
        return codes.reshape(x64.shape), np.asarray(1.0 / quant.qmax)
    if x64.ndim < 2:
        raise ValueError(f"granularity {gran!r} needs x of shape (..., seq, head_dim), got {x64.shape}")
    if gran == "per-block":
        if isinstance(group, bool) or not isinstance(group, (int, np.integer)) or group < 1:
            raise ValueError(f"granularity 'per-block' needs group, a positive int, got {group!r}")
        group = int(group)
    if gran == "per-warp":
        gran, group = "per-block", quant.group  # groups of consecutive tokens, as per-block
    amax = np.ascontiguousarray(_amax_groups(x64, gran, group))
    scale: np.ndarray = np.empty(amax.size)
    _qk.scales_from_amax(amax.reshape(-1), scale, quant.qmax, arith)
    scale = scale.reshape(amax.shape)
    codes = np.empty(x64.size)
    full = np.ascontiguousarray(np.broadcast_to(scale, x64.shape)).reshape(-1)
    if quant.kind == "int":
        kind, code_op, rule = _qk.K_INT, arith, INT_RULES.index(quant.rounding)
    else:
        assert isinstance(quant.fmt, FloatFormat)
        kind, rule = _qk.K_FLOAT, 0
        code_op = OpParams(quant.fmt.params, int(quant.rounding))
    _qk.quant_elems(x64.reshape(-1), full, codes, kind, arith, code_op, quant.qmax, rule)
    return codes.reshape(x64.shape), scale


def _tokens(x: object, name: str) -> np.ndarray:
    """x as float64, checked to be a (..., seq >= 1, head_dim) float32/float64 array."""
    if not isinstance(x, np.ndarray) or x.dtype not in (np.float32, np.float64):
        raise TypeError(f"{name} must be a float32 or float64 numpy array")
    if x.ndim < 2 or x.shape[-2] < 1:
        raise ValueError(f"{name} must be (..., seq_{name} >= 1, head_dim), got shape {x.shape}")
    return np.asarray(x, dtype=np.float64)


def _means(x64: np.ndarray, block: int) -> np.ndarray:
    """(..., ceil(seq / block), head_dim): the float64 mean of each group of ``block`` consecutive tokens (the
    last group: the tokens left), numpy's sum over the group, then one division."""
    seq = x64.shape[-2]
    return np.stack(
        [x64[..., lo : lo + block, :].sum(axis=-2) / min(block, seq - lo) for lo in range(0, seq, block)], axis=-2
    )


def _smooth(x64: np.ndarray, spec: OpSpec, block: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(``spec(x - mu)``, the exact ``x - mean``, ``mu = spec(mean)``) per group of ``block`` tokens."""
    mean = _means(x64, block)
    mu = _round(mean, spec.fmt, spec.mode)
    seq = x64.shape[-2]

    def full(m: np.ndarray) -> np.ndarray:
        return np.repeat(m, block, axis=-2)[..., :seq, :]

    smoothed = np.asarray(_ops.sub(x64, full(mu), spec.fmt, spec.mode), dtype=np.float64)
    return smoothed, x64 - full(mean), mu


def mean_key(k: np.ndarray, op: OpSpec | str) -> np.ndarray:
    """The mean key of SageAttention's K smoothing, as the plan's ``k_smooth`` op rounds it (what a kernel
    that smooths K is given: SageAttention's ``km``).

    Args:
        k: (..., seq_k, head_dim) float32/float64 keys (seq_k >= 1).
        op: the format and rounding of the mean.

    Returns:
        (..., 1, head_dim) float64 array: ``op(sum(k) / seq_k)``, the sum over the sequence per channel in
        float64 (numpy's sum), then one float64 division.

    Raises:
        TypeError: k is not a float32/float64 array. ValueError: k has no keys or is not (..., seq, dim).
    """
    k64 = _tokens(k, "k")
    spec = _scalar_spec("k_smooth", op)
    return _round(_means(k64, k64.shape[-2]), spec.fmt, spec.mode)


def smooth_keys(k: np.ndarray, op: OpSpec | str) -> tuple[np.ndarray, np.ndarray]:
    """SageAttention's K smoothing as the plan's ``k_smooth`` op computes it.

    Args:
        k: (..., seq_k, head_dim) float32/float64 keys (seq_k >= 1).
        op: the format and rounding of the mean key and of the difference.

    Returns:
        (smoothed, exact): ``op(k - mu)`` (the exact difference rounded once) with ``mu = mean_key(k, op)``,
        and the unrounded ``k - mean(k)`` (float64) the trace compares it with; both of k's shape.

    Raises:
        TypeError: k is not a float32/float64 array. ValueError: k has no keys or is not (..., seq, dim).
    """
    k64 = _tokens(k, "k")
    smoothed, exact, _ = _smooth(k64, _scalar_spec("k_smooth", op), k64.shape[-2])
    return smoothed, exact


def smooth_queries(q: np.ndarray, op: OpSpec | str, block: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """SageAttention2/3's Q smoothing as the plan's ``q_smooth`` op computes it: per group of ``block``
    consecutive queries (the q tile) and channel.

    Args:
        q: (..., seq_q, head_dim) float32/float64 queries (seq_q >= 1).
        op: the format and rounding of the mean query and of the difference.
        block: queries per group (a positive int; the last group holds the queries left).

    Returns:
        (smoothed, exact, mu): ``op(q - mu)`` (the exact difference rounded once) and the unrounded
        ``q - mean`` (float64), both of q's shape, and ``mu = op(sum / count)`` per group, (..., n_groups,
        head_dim) (numpy's float64 sum over the group's queries, one division).

    Raises:
        TypeError: q is not a float32/float64 array. ValueError: q has no queries or is not (..., seq, dim), or
        block is not a positive int.
    """
    q64 = _tokens(q, "q")
    if isinstance(block, bool) or not isinstance(block, (int, np.integer)) or block < 1:
        raise ValueError(f"block must be a positive int, got {block!r}")
    return _smooth(q64, _scalar_spec("q_smooth", op), int(block))


def hadamard_rotation(d: int, seed: int = 0) -> np.ndarray:
    """The incoherent-processing rotation ``diag(signs) @ H / sqrt(d)`` (float64, orthogonal): H the Sylvester
    Hadamard matrix of order d (a power of two), signs uniform +-1 from ``numpy.random.default_rng(seed)``.
    ``(Q R)(K R)^T = Q K^T`` in exact arithmetic."""
    if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 1 or d & (d - 1):
        raise ValueError(f"incoherent processing needs head_dim a power of two, got {d}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    h = np.ones((1, 1))
    while h.shape[0] < d:
        h = np.block([[h, h], [h, -h]])
    signs = np.random.default_rng(int(seed)).choice([-1.0, 1.0], size=d)
    return signs[:, None] * h / math.sqrt(d)


# ---------------------------------------------------------------------------------------------------------
# the kernels' drivers
# ---------------------------------------------------------------------------------------------------------


def _merge(
    local: np.ndarray, t_idx: slice | int, kv_idx: slice | int, op: int, err: np.ndarray, ref: np.ndarray
) -> None:
    """Add error samples (lead, n) into local[:, t, kv, op] (tracer statistics)."""
    cell = local[:, t_idx, kv_idx, op]
    cell[:, 0] = np.maximum(cell[:, 0], np.abs(err).max(axis=1, initial=0.0))
    cell[:, 1] += (err * err).sum(axis=1)
    cell[:, 2] += err.shape[1]
    cell[:, 3] = np.maximum(cell[:, 3], np.abs(ref).max(axis=1, initial=0.0))


def _record_tokens(local: np.ndarray, op: int, err: np.ndarray, ref: np.ndarray, size: int, axis: str) -> None:
    """Quantizer errors per tile of tokens: Q's per q tile (kv block 0), K/V's per kv block (q tile 0)."""
    n_lead, seq = err.shape[:2]
    for t in range(-(-seq // size)):
        e = err[:, t * size : (t + 1) * size].reshape(n_lead, -1)
        r = ref[:, t * size : (t + 1) * size].reshape(n_lead, -1)
        if axis == "q":
            _merge(local, t, 0, op, e, r)
        else:
            _merge(local, 0, t, op, e, r)


def quant_flash(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    plan: Plan | str,
    block_m: int = 64,
    block_n: int = 64,
    causal: bool = False,
    scale: float | None = None,
    incoherent: bool = False,
    seed: int = 0,
    trace: Tracer | None = None,
    return_stats: bool = False,
    engine: str | None = None,
    attn_mask: np.ndarray | None = None,
    key_lengths: object = None,
    window: tuple[int, int] | None = None,
    causal_align: str = "top-left",
    empty_rows: str = "zero",
) -> np.ndarray | tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Quantized flash attention under any :class:`~simfloat.attention.Plan` with quantizers (:func:`int8_flash`
    and :func:`fp8_flash` are this with their presets, :func:`~simfloat.attention.flash` this for a plan with
    quantizers); arguments and results as theirs.

    Args:
        engine: ``"vector"`` (the vectorized engine, :mod:`simfloat.attention.vector`) or
            ``"reference"`` (the scalar kernel it replaces, bit for bit the same; tracing runs there); None:
            vector, or reference when tracing. ``"vector"`` with a tracer is an error.
        attn_mask, key_lengths, window, causal_align, empty_rows: a mask, as for
            :func:`~simfloat.attention.flash` (SDPA's meaning; the structured masks decide the key tiles walked).
            It applies to the scores (T3): masked keys get score -inf and P 0, an additive mask (rounded into the
            plan's ``scale`` format) is fused with the score scale, after the scores' dequantization (the folded
            scale ``qk_scale * q_scale * k_scale`` of the FP8 plans is the ``qk_scale`` it is fused with). The
            quantizers run before the loop on the tensors as given, as the kernels quantize their inputs: a
            masked key still counts in K's and V's scales (per-tensor, per-block) and in K smoothing's mean
            (pass zeros as padding to keep it out).
    """
    pl = quant_plan(plan)
    x = prepare(q, k, v, plan_="fp64", causal=causal, scale=scale, trace=trace)
    x.mask = mask_of(x, attn_mask, key_lengths, window, causal_align, empty_rows, pl.scale)
    mk = NO_MASK if x.mask is None else x.mask.mask
    which = check_engine(engine, x.trace is not None)
    if pl.exp_impl == "tl.exp" and which == "vector":  # quantized plans: not routed to the vector engine (yet)
        if engine is not None:
            raise ValueError(
                "the vector engine does not model exp_impl='tl.exp': pass engine='reference' or "
                "engine=None (which runs such plans on the reference engine)"
            )
        which = "reference"
    bm, bn = block(block_m, "block_m"), block(block_n, "block_n")
    wn = pl.sum_order.warps_n(bm, x.v.shape[-1])  # the plan's tl.sum layout rule, of the requested tile
    pv_sb = pl.pv.scale_block if isinstance(pl.pv, BlockFMA) else 0
    if pv_sb and bn % pv_sb:
        raise ValueError(f"block_n must be a multiple of the pv MMA's scale block {pv_sb}, got {bn}")
    if not isinstance(incoherent, (bool, np.bool_)):
        raise TypeError(f"incoherent must be a bool, got {type(incoherent).__name__}")
    fp = flash_params(pl, x.scale)
    n_lead, seq_q, d = x.q.shape
    seq_k, dv = x.v.shape[1:]
    # tiles larger than the sequences give the bits of the sequences' own length: one tile, one per-block scale
    # group either way; the q tile keeps its causal key bound min(block_m, seq_k); split-k keeps block_n
    bm = min(bm, max(seq_q, seq_k))
    bn = clamp_blocks(1, bn, 1, seq_k, pl.pv)[1]
    n_qt, n_kv = -(-seq_q // bm), -(-seq_k // bn)
    tr = None
    if x.trace is not None:
        local, state = x.trace._start(
            "quant_flash",
            pl.name,
            QUANT_OPS,
            n_lead,
            n_qt,
            n_kv,
            lead=x.lead,
            block_m=bm,
            block_n=bn,
            causal=x.causal,
            scale=x.scale,
            incoherent=bool(incoherent),
            seed=seed,
        )
        tr = Trace(local, state, trace_columns(QUANT_OPS, True))
    qo = pl.quant_ops()
    qin, kin = x.q, x.k
    if incoherent:
        r = hadamard_rotation(d, seed)
        qr, kr = x.q @ r, x.k @ r
        qin = _round(qr, qo.rotate.fmt, qo.rotate.mode)
        kin = _round(kr, qo.rotate.fmt, qo.rotate.mode)
        if tr is not None:
            _record_tokens(tr.local, _qk.ROTATE, qin - qr, qr, bm, "q")
            _record_tokens(tr.local, _qk.ROTATE, kin - kr, kr, bn, "k")
    if pl.k_smooth is not None:
        kin, k_exact = smooth_keys(kin, pl.k_smooth)
        if tr is not None:
            _record_tokens(tr.local, _qk.K_SMOOTH, kin - k_exact, k_exact, bn, "k")
    ds = np.zeros((n_lead, n_qt, n_kv * bn))  # Q smoothing's correction per q tile and key (zero-padded)
    if pl.q_smooth is not None:
        assert pl.q_delta is not None  # set with q_smooth (Plan checks)
        qin, q_exact, mu_q = smooth_queries(qin, pl.q_smooth, bm)
        kt = np.swapaxes(kin, -1, -2)
        ds[:, :, :seq_k] = matmul(mu_q, kt, acc=pl.q_delta, engine=which)
        if tr is not None:
            _record_tokens(tr.local, _qk.Q_SMOOTH, qin - q_exact, q_exact, bm, "q")
            ex = mu_q @ kt
            for jt in range(n_kv):
                cut = slice(jt * bn, min(seq_k, (jt + 1) * bn))
                for t in range(n_qt):
                    _merge(tr.local, t, jt, _qk.Q_DELTA, ds[:, t, cut] - ex[:, t, cut], ex[:, t, cut])
    qc, qs, qb = _operand(qin, qo.q_quant, bm, -1)
    kc, ks, kb = _operand(kin, qo.k_quant, bn, -1)
    vc, vs, vb = _operand(x.v, qo.v_quant, bn, -2)
    if tr is not None:
        for op, src, codes, sc, bsc, size, axis in (
            (_qk.Q_QUANT, qin, qc, qs, qb, bm, "q"),
            (_qk.K_QUANT, kin, kc, ks, kb, bn, "k"),
            (_qk.V_QUANT, x.v, vc, vs, vb, bn, "k"),
        ):
            if getattr(pl, QUANT_OPS[op]).quantizes:
                deq = codes * sc if bsc is None else codes * bsc * sc
                _record_tokens(tr.local, op, deq - src, src, size, axis)
    # block scales go to a block-scaled MMA; any other dot takes the values (codes times block scales, exact)
    qk_scaled = fp.qk_kind == _qk.DOT_SCALED
    pv_scaled = fp.pv_kind == _qk.DOT_SCALED
    if qb is not None and not qk_scaled:
        qc, qb = qc * qb, None
    if kb is not None and not qk_scaled:
        kc, kb = kc * kb, None
    if vb is not None and not pv_scaled:
        vc, vb = vc * vb, None
    # kernel operands: per-row q scales, per-key k scales (padded), V codes per tile transposed, V scales per
    # (tile, channel)
    qs_rows = np.ascontiguousarray(np.broadcast_to(qs, (n_lead, seq_q, 1))[..., 0])
    ks_keys = np.ones((n_lead, n_kv * bn))
    ks_keys[:, :seq_k] = np.broadcast_to(ks, (n_lead, seq_k, 1))[..., 0]
    vs_full = np.broadcast_to(vs, (n_lead, seq_k, dv)) if vs.ndim else np.ones((n_lead, seq_k, dv))
    vs_tile = np.ascontiguousarray(vs_full[:, ::bn, :]) if seq_k else np.ones((n_lead, 0, dv))
    out = np.zeros((n_lead, seq_q, dv))
    m = np.empty((n_lead, seq_q))
    l = np.empty((n_lead, seq_q))  # noqa: E741
    built = None
    if which == "vector":  # None: block-scaled operands the row kernels cannot take, run on the reference
        built = flash_engine(
            pl, fp, qc=qc, kc=kc, vc=vc, bm=bm, bn=bn, causal=x.causal, wn=wn, qs=qs_rows, ks=ks_keys, vs=vs_tile,
            qb=qb, kb=kb, vb=vb, ds=ds,
        )  # fmt: skip
    if built is not None:
        run_vector(built[1]._replace(mk=mk), out, m, l, built[0])
    elif n_lead * n_qt > 0:
        none = np.ones((1, 1, 1))
        ops = Operands(
            np.ascontiguousarray(qc),
            qs_rows,
            none if qb is None else np.ascontiguousarray(qb),
            key_rows(kc, n_kv, bn),
            ks_keys,
            none if kb is None else key_rows(kb, n_kv, bn),
            v_tiles(vc, n_kv, bn),
            vs_tile,
            none if vb is None else v_tiles(vb, n_kv, bn),
            ds,
            x.q,
            x.k,
            x.v,
            mk,
        )
        run_reference(ops, fp, (bm, bn, int(x.causal), seq_k, wn), tr, out, m, l)
    if x.mask is not None:
        x.mask.finish(out)
    out = out.reshape(x.lead + (seq_q, dv))
    if return_stats:
        return out, m.reshape(x.lead + (seq_q,)), l.reshape(x.lead + (seq_q,))
    return out


def _operand(x: np.ndarray, quant: Quant, group: int, axis: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(codes, scale, block scales or None) of Q, K or V: :func:`quantize`'s codes and scale, except that a
    block quantizer's per-element block scales come apart from the level above them (what the MMA takes)."""
    if quant.kind != "block":
        return (*quantize(x, quant, group=group), None)
    x64 = x
    if quant.pre is not None:
        assert isinstance(quant.pre, OpSpec)
        x64 = _round(x64, quant.pre.fmt, quant.pre.mode)
    codes, bs, lvl = _block_parts(np.asarray(x64, np.float64), quant, axis)
    return codes, lvl, bs


def int8_flash(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    plan: Plan | str = "int8-reference",
    block_m: int = 64,
    block_n: int = 64,
    causal: bool = False,
    scale: float | None = None,
    trace: Tracer | None = None,
    return_stats: bool = False,
    engine: str | None = None,
    attn_mask: np.ndarray | None = None,
    key_lengths: object = None,
    window: tuple[int, int] | None = None,
    causal_align: str = "top-left",
    empty_rows: str = "zero",
) -> np.ndarray | tuple[np.ndarray, np.ndarray, np.ndarray]:
    """INT8 flash attention (INT-FlashAttention), emulating ``simfloat_gpu/kernels/int8_attention.py`` op for op.

    Args:
        q: (..., seq_q, head_dim) float32/float64; k, v: (..., seq_k, head_dim). Values are used as given (the
            kernels convert their fp16/bf16/fp32 inputs to fp32 exactly, Q1): pass fp16 values to emulate fp16
            inputs. Leading dims broadcast; seq_k >= 1; k, v may have fewer heads (grouped-query attention,
            as :func:`simfloat.attention.flash`).
        plan: a :class:`~simfloat.attention.Plan` with quantizers or preset: ``"int8-reference"`` (the released scheme),
            ``"int8-consistent"`` (row sum from the quantized P), ``"half-int8"``,
            ``"int8-reference-vblock"``, ``"int8-reference-vchannel"``, ``"<preset>-fp64"`` (quantizers
            only), ``"quant-fp64"`` (``"fp64"``: the same); derive isolation/ablation plans with
            :meth:`~simfloat.attention.Plan.isolate` / :meth:`~simfloat.attention.Plan.ablate`.
        block_m, block_n: tile sizes (any >= 1; the Triton kernel needs powers of two, block_n >= 32).
        causal: top-left aligned causal mask (query i sees keys j <= i).
        scale: softmax scale, finite and > 0 (default 1/sqrt(head_dim)).
        trace: a :class:`simfloat.Tracer` (local error of every op, quantizers included; state drift from a
            float64 shadow run on the unquantized inputs), or None.
        return_stats: also return m (running max, log2 units) and l (row sum), (..., seq_q) each.
        engine: ``"vector"``, ``"reference"`` or None (see :func:`quant_flash`).
        attn_mask, key_lengths, window, causal_align, empty_rows: a mask (see :func:`quant_flash`).

    Returns:
        (..., seq_q, head_dim) float64 array of values of the plan's output format (fp16), or (out, m, l).

    Raises:
        TypeError, ValueError: bad arrays, shapes, block sizes, scale, plan or tracer.
    """
    return quant_flash(
        q,
        k,
        v,
        plan=plan,
        block_m=block_m,
        block_n=block_n,
        causal=causal,
        scale=scale,
        trace=trace,
        return_stats=return_stats,
        engine=engine,
        attn_mask=attn_mask,
        key_lengths=key_lengths,
        window=window,
        causal_align=causal_align,
        empty_rows=empty_rows,
    )


_SCALING_NAMES = {"per-tensor": "", "per-block": "-block", "none": "-unscaled"}


def fp8_flash(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    fmt: str = "e4m3",
    scaling: str = "per-tensor",
    incoherent: bool = False,
    seed: int = 0,
    block_m: int = 64,
    block_n: int = 64,
    causal: bool = False,
    scale: float | None = None,
    plan: Plan | str | None = None,
    trace: Tracer | None = None,
    return_stats: bool = False,
    engine: str | None = None,
    attn_mask: np.ndarray | None = None,
    key_lengths: object = None,
    window: tuple[int, int] | None = None,
    causal_align: str = "top-left",
    empty_rows: str = "zero",
) -> np.ndarray | tuple[np.ndarray, np.ndarray, np.ndarray]:
    """FP8 flash attention (FlashAttention-3 style scaling), emulating ``simfloat_gpu/kernels/fp8_attention.py`` op for
    op.

    Args:
        q, k, v, block_m, block_n, causal, scale, trace, return_stats, engine: as :func:`int8_flash`.
        attn_mask, key_lengths, window, causal_align, empty_rows: a mask (see :func:`quant_flash`).
        fmt: ``"e4m3"`` (float8_e4m3fn) or ``"e5m2"``: Q, K, V and P.
        scaling: ``"per-tensor"`` (one scale per tensor), ``"per-block"`` (one per block_m x head_dim tile of
            Q and block_n x head_dim tile of K and V, as FA3) or ``"none"`` (plain casts, no scale).
        incoherent: FA3's incoherent processing: Q and K multiplied by ``hadamard_rotation(head_dim, seed)``
            (in float64, rounded into the plan's ``rotate`` op, fp32) before quantization. head_dim must be a
            power of two.
        seed: seed of the random signs.
        plan: a :class:`~simfloat.attention.Plan` with quantizers or preset instead of fmt/scaling (then leave
            those at their defaults).

    Returns:
        As :func:`int8_flash`.
    """
    if plan is None:
        checked_choice("fmt", fmt, tuple(FP8_NAMES))
        checked_choice("scaling", scaling, tuple(_SCALING_NAMES))
        plan = f"fp8-{fmt}{_SCALING_NAMES[scaling]}"
    elif (fmt, scaling) != ("e4m3", "per-tensor"):
        raise ValueError("give either plan= or fmt=/scaling=, not both")
    return quant_flash(
        q,
        k,
        v,
        plan=plan,
        block_m=block_m,
        block_n=block_n,
        causal=causal,
        scale=scale,
        incoherent=incoherent,
        seed=seed,
        trace=trace,
        return_stats=return_stats,
        engine=engine,
        attn_mask=attn_mask,
        key_lengths=key_lengths,
        window=window,
        causal_align=causal_align,
        empty_rows=empty_rows,
    )
