"""Precision plans: the format and rounding of every operation of an attention kernel.

A :class:`Plan` names one entry per operation. The names are those of the Triton kernel's variables
(``simfloat_gpu/kernels/flash_attention.py``); :mod:`simfloat.attention.flash` uses
``qk scale exp m_i alpha l_ij l_i acc p pv normalize out`` and :mod:`simfloat.attention.baseline` uses
``qk scale softmax pv out``. Scalar operations take an :class:`OpSpec` (format + rounding mode: the exact
result of the operation on its inputs is rounded once); the two dot products ``qk`` and ``pv`` take an
accumulation model (:mod:`simfloat.accumulate`), and the in-tile row sum ``l_ij`` a sum model (sequential in a
format, or accumulated in one format and rounded once into another: :func:`sum_once`).

The flags choose the algorithm: ``exp2`` (exp2 with log2(e) folded into the scale, else exp), ``contract``
(``qk*scale - m`` and ``l*alpha + l_ij`` as single-rounding FMAs), ``normalization`` (``"deferred"``: FA2,
divide once at the end; ``"per_step"``: FA1, keep the accumulator normalized after every key block) and
``lazy_threshold`` (rescale only when the running max grows by more than it; ``None``: always) and
``tie_shift`` / ``tie_tol`` (Qiu & Yao's max shift for tied row maxima, arXiv 2510.04212; off by default).

This module is the public face of three: the :class:`Plan` type and its checks (``_plan_type``), the one preset
table and the resolution of a plan name (``_presets``), and a plan's vocabulary and its lowering for the
compiled kernels (``_plan_params``).
"""

from __future__ import annotations

import warnings

from simfloat.accumulate import Model
from simfloat.attention import _presets

# re-exported: the public path of these names (tests and docs read them here; backward_plan.py the private ones,
# until it imports them from their modules)
from simfloat.attention._plan_params import (  # noqa: F401
    BASELINE_OPS,
    EXP2_IMPLS,
    EXP_IMPLS,
    FLASH_OPS,
    KERNELS,
    KV_ORDERS,
    STATE_FORMS,
    SUM_ORDERS,
    Features,
    PlanParams,
)
from simfloat.attention._plan_params import op_params as _op_params  # noqa: F401
from simfloat.attention._plan_params import qk_scale as _qk_scale  # noqa: F401
from simfloat.attention._plan_type import Plan
from simfloat.attention._presets import profile_dot as _profile_dot  # noqa: F401
from simfloat.attention._presets import resolve as _preset
from simfloat.attention._presets import short_repr as _short_repr  # noqa: F401
from simfloat.attention._presets import with_hardware as _with_hardware
from simfloat.attention._specs import OpParams, OpSpec, sum_once  # noqa: F401
from simfloat.attention.quant import Quant

__all__ = [
    "BASELINE_OPS",
    "FLASH_OPS",
    "OpSpec",
    "Plan",
    "QuantPlan",
    "plan",
    "presets",
    "quant_plan",
    "quant_presets",
    "sum_once",
]


def _build() -> dict[str, Plan]:
    """The one preset table (:func:`simfloat.attention._presets.table`), of this Plan type."""
    return _presets.table(Plan)


def presets() -> dict[str, Plan]:
    """All preset plans by name (see :func:`plan`): the float plans and the plans with quantizers."""
    return dict(_build())


def QuantPlan(  # noqa: N802  # the name of the class it stands in for
    name: str,
    q_quant: Quant | None,
    k_quant: Quant | None,
    v_quant: Quant | None,
    p_quant: Quant | None,
    qk: Model | str,
    pv: Model | str,
    **fields: object,
) -> Plan:
    """Deprecated: a :class:`Plan` with quantizers (``Plan(..., q_quant=..., ...)``), with the quantized kernels'
    defaults (every other op float32, output float16, ``exp2`` and ``contract`` on); ``fields`` the other
    quantizer ops and flags (``rotate``, ``k_smooth``, ``q_smooth``, ``q_delta``, ``dequant``, ``scale``,
    ``exp``, ``m_i``, ``alpha``, ``l_i``, ``acc``, ``pv_dequant``, ``normalize``, ``out``, ``exp2``,
    ``contract``, ``row_sum``, ``score_scaling``, ``pv_update``).

    Raises:
        ValueError, TypeError: as :class:`Plan`; an entry that is no quantized op or flag.
    """
    warnings.warn(
        "QuantPlan is deprecated: plans with quantizers are Plans (simfloat.attention.plan(name), Plan(...))",
        DeprecationWarning,
        stacklevel=2,
    )
    return _presets.quantized_plan(Plan, name, q_quant, k_quant, v_quant, p_quant, qk, pv, **fields)


#: the quantized golden's name in the quantized presets of old (``quant_presets()``, ``quant_plan("fp64")``)
_OLD_NAMES = {"fp64": "quant-fp64"}


def quant_presets() -> dict[str, Plan]:
    """The presets with quantizers by name (:func:`presets`' plans with quantizers), ``quant-fp64`` under its old
    name ``fp64``."""
    old = {v: k for k, v in _OLD_NAMES.items()}
    return {old.get(n, n): p for n, p in _build().items() if p.quantized}


def quant_plan(name: str | Plan) -> Plan:
    """A preset with quantizers (a Plan with quantizers is returned unchanged): :func:`plan` for those presets,
    and ``"fp64"`` the quantized golden ``"quant-fp64"`` (its old name).

    Raises:
        ValueError: unknown name or a plan without quantizers. TypeError: neither str nor Plan.
    """
    if isinstance(name, str):
        name = _OLD_NAMES.get(name, name)
        table = _build()
        if name not in table:
            raise ValueError(f"unknown quantized plan {name!r}; presets: {', '.join(quant_presets())}")
        name = table[name]
    elif not isinstance(name, Plan):
        raise TypeError(f"plan must be a Plan or a preset name, got {type(name).__name__}")
    if not name.quantized:
        raise ValueError(f"plan {name.name!r} has no quantizers (run it with flash())")
    return name


def plan(name: str | Plan, hardware: object = None) -> Plan:
    """A preset precision plan from the one table of float and quantized presets (a :class:`Plan` is returned
    unchanged).

    With ``hardware`` (a :class:`simfloat.profiles.HardwareProfile`, a shipped profile's name such as
    ``"h200"`` or a profile file), a ``triton-<fmt>`` preset becomes ``triton-<fmt>@<profile name>``: the
    profile's tensor-core model, exp2, tl.sum order and FMA contraction in place of the triton defaults (a
    part the profile lacks keeps the default). The name parses back: ``plan("triton-bf16@h200")`` is
    ``plan("triton-bf16", hardware="h200")``, and after the ``@`` may stand a shipped profile's name, the name
    of a profile this process loaded from a file (:func:`simfloat.profiles.load_profile` registers it) or a
    profile file's path (the plan is then named by the profile's own name). ``plan("h200-bf16")`` is
    ``plan("triton-bf16@h200")`` under its historic name (every other field equal).

    Presets:
        ``fp64``: golden, every op float64 (dots: plain float64 loops, products rounded then added).
        ``all-<fmt>``: every op and stored intermediate in <fmt>, dots sequential with each product and
            partial sum rounded into <fmt>, exp (not exp2), no FMA contraction (Golden et al.'s simulator).
        ``triton-<fmt>``: the Triton kernel: sm90 tensor-core dots, exp2 with log2(e) folded into an fp32
            scale, FMA contraction, fp32 m_i/l_i/acc/alpha/normalize, P cast to <fmt>, output in <fmt>;
            ``triton-fp32`` uses "ieee" FMA-loop dots, ``triton-tf32`` fp32 inputs with tf32 tensor cores (P
            and output fp32).
        ``h200-<fmt>``: ``triton-<fmt>`` with the H200's measured exp2 (ex2.approx.ftz.f32) and l_ij order
            (tl.sum in the mma layout): bit for bit with the GPU's m_i / l_i where the dot model is exact.
        ``flashattn-triton-<fmt>`` (bf16, fp16): the flash-attention repository's Triton kernel
            (``flash_attn/flash_attn_triton.py``, forward without bias; it runs with ``block_m = block_n = 128``):
            ``triton-<fmt>``'s formats and dots, ``tl.exp`` of the fp32 scores (``exp2=False``,
            ``exp_impl="tl.exp"``), ``qk * scale - m_ij`` contracted, and the running state as a log-sum-exp
            (``state="lse"``, see :class:`Plan`); ``return_stats`` gives its stored lse as ``m`` (``l`` = 1).
        ``triton-tutorial-fp16``: the Triton tutorial's fused attention forward
            (``python/tutorials/06-fused-attention.py``; fp16 only, it casts P to fp16): ``triton-fp16`` with
            ``contract_diagonal=False`` (its masked stage rounds ``qk * qk_scale`` and the subtraction of
            ``m_ij`` apart); the same bits as ``triton-fp16`` without ``causal``.
        ``pytorch-<fmt>`` (baseline): each matmul accumulated in fp32 from zero and rounded once into <fmt>,
            scale in <fmt>, softmax in fp32, P read by the P.V matmul as <fmt>, output <fmt>.
        ``fa3-<fmt>`` / ``fa4-<fmt>`` (bf16, fp16, e4m3): FlashAttention-3's (sm90) and -4's (sm100) forward
            (``_fa``): their tensor-core dots, the H200's exp2 (sm100's is unmeasured), alpha from the unscaled
            maxima (``alpha_raw``), fp8 P scaled by 2**8 and saturating (``p_offset``); FA4 mixes in its
            software exp2 (``exp2_emu="fa4"``, block_n 128) and keeps the max unless it grew by more than 8
            (16-bit inputs). The key tiles run from the first (the kernels walk them from the last).
        fmt is one of bf16, fp16, fp32, tf32, e4m3, e5m2 (pytorch: bf16, fp16, fp32).

    Presets with quantizers (:mod:`simfloat.attention.quantized`; all with fp32 arithmetic, exp2 with log2(e) folded
    into an fp32 scale, FMAs as the kernels, fp16 output):
        ``int8-reference``: simfloat_gpu/kernels/int8_attention.py "int8": Q, K per-token INT8, V per-tensor INT8 (scale
            max/127, round half to even), exact integer dots, P = trunc(fp16(fp16(p)*127 + 0.5)), row sum
            from the fp32 P. ``int8-consistent``: row sum from the quantized P.
            ``int8-reference-unfused``: P's ``p16*127 + 0.5`` rounded twice (the reference code as
            written). ``int8-reference-vblock`` / ``-vchannel``: V scales per key tile / per head_dim
            channel (the CUDA port's options).
        ``half-int8`` (``-consistent``): Q, K INT8; V and P fp16, P.V on the sm90 fp16 tensor-core model into
            the accumulator.
        ``fp8-e4m3``, ``fp8-e5m2``: simfloat_gpu/kernels/fp8_attention.py per-tensor (one scale per tensor,
        amax/FP8_MAX,
            scales folded into the softmax scale, P cast to fp8, V's scale in the epilogue);
            ``fp8-<fmt>-block``: FA3-style per-block scales (Q per block_m tile, K and V per block_n tile);
            ``fp8-<fmt>-unscaled``: Q, K, V cast straight to fp8 (the INT-FlashAttention code's FP8
            baseline). fp8 dots use the sm90 fp8 tensor-core model (blocks of 32, 13 fraction bits, e8m13
            results), as simfloat_gpu.interpreter.
        ``fp16-flash``, ``bf16-flash``: no scaling, Q/K/V/P cast to fp16/bf16, sm90 tensor-core dots: the
            ``triton-fp16``/``triton-bf16`` flash plans, bit for bit.
        ``sage2-int8-fp8``: SageAttention2's INT8 QK^T / FP8 P.V: K smoothed by its mean key (``k_smooth``
            fp32), Q INT8 per warp (32 consecutive rows), K INT8 per key tile (block_n), exact integer dots,
            V e4m3 per channel, P cast to e4m3 with the fixed scale 1/448, P.V on the sm90 fp8 tensor-core
            model fresh per key tile and added in fp32 (``pv_update="two_level"``; V's and P's scales in the
            epilogue). ``sage2-int8-fp8-single``: P.V into the running accumulator (single-level, e8m13
            across the whole sequence). ``sage2-int8-fp8-qblock``: Q per block_m tile (SageAttention1's
            granularity). ``sage2-int8-fp8-qsmooth``: with SageAttention2's Q smoothing (``q_smooth`` fp32
            per q tile, ``delta_s`` an fp32 FMA chain added to the dequantized scores in fp32).
        ``sage1-int8-fp16``: SageAttention1's CUDA kernel (INT8 QK^T, FP16 P.V) with its fp32 accumulator
            (``pv_accum_dtype="fp32"``): Q, K and the scores as sage2, V and P cast to fp16, the row sum from
            the fp16 P, P.V on the sm89 fp16 tensor-core model into the fp32 accumulator.
            ``sage1-int8-fp16-acc16``: its fp16 accumulator (``"fp16"``): the f16f16f16 MMA
            (``tensor_core("sm89", "fp16", out_format="fp16")``) into an accumulator held in fp16 over the
            whole sequence (``pv_acc="float16"``, ``acc`` fp16: rescaled by alpha rounded to fp16), divided
            by l into fp16. ``sage1-int8-fp16-acc16-flush32``: ``"fp16+fp32"``: each key tile's P.V from zero
            in fp16, added to the fp32 accumulator (``pv_update="two_level"``).
        ``sage3-fp4``: SageAttention3's FP4 attention: K smoothed as sage2, Q and K NVFP4 along the head
            dimension and V NVFP4 along the keys (e2m1 elements, ue4m3 scales per 16, rounded once from the
            exact quotients as :func:`simfloat.quantize_block`; no fp32 tensor scale, as the released kernels),
            P two-level: per row of each key tile ``s1 = fp32(rowmax(P) / (448 * 6))``, ``t = fp32(P / s1)``,
            then NVFP4 of t per 16 keys; QK^T and P.V on the Blackwell ``nvf4`` MMA model
            (``tensor_core("sm120", "e2m1", kind="nvf4")``, fp32 output), each key tile's P.V from zero, times
            ``s1`` in fp32 (``pv_dequant``), added with ``fma(acc, alpha, .)`` (``pv_update="two_level"``).
            ``sage3-fp4-tensorscale``: Q, K, V with NVFP4's per-tensor fp32 scale (applied after the MMA:
            ``dequant`` for Q/K, the epilogue for V). ``sage3-fp4-onelevel``: P in NVFP4 without the per-row
            first level. ``sage3-fp4-qsmooth``: with Q smoothing (``q_smooth`` fp32 per q tile, ``delta_s`` an
            fp32 FMA chain, the qk MMA's initial accumulator). ``sage3-fp4-fixedp``: P's first level fixed
            (``Quant("block", "fixed", fmt="nvfp4")``: 448 * 6 folded into the softmax's shift relative to the
            running max, as the released kernel). ``sage3-fp4-released``: both (the released kernel's
            dataflow).
        ``<any>-fp64``: the same quantizers with every other op exact (float64); ``quant-fp64``: nothing
            quantized, everything float64 (``int8-reference``'s dataflow; the quantized presets' ``fp64`` of old).


    Raises:
        ValueError: unknown name (the message lists the presets); ``hardware`` with a plan other than a
            ``triton-<fmt>`` preset, or a profile a plan cannot use (the message names the part); a
            ``@<profile>`` that is no shipped, loaded or file profile.
        TypeError: ``name`` is neither a string nor a Plan.
    """
    return _preset(name, hardware, Plan, presets, _with_hardware, ("plan", "plan", "the Triton flash kernel"))
