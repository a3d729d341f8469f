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
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

import numpy as np

from simfloat.accumulate import AccParams, BlockFMA, Chunked, Model, Sequential, acc_params, tensor_core
from simfloat.attention import quant_plan as _qp
from simfloat.attention._quant_kernels import QParams
from simfloat.attention._specs import (
    _BIG_CHUNK,
    OpParams,
    OpSpec,
    _dot_spec,
    _scalar_spec,
    _sum_spec,
    sum_once,
)
from simfloat.attention.quant import QUANTIZERS, Quant
from simfloat.attention.quant_plan import QUANT_FIELDS, QUANT_FLAGS, QUANT_OPS
from simfloat.formats import FloatFormat
from simfloat.formats import format as _format
from simfloat.hardware import Ex2Table
from simfloat.rounding import mode_code

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

#: Plan or BackwardPlan (:func:`_preset`)
_P = TypeVar("_P")

FLASH_OPS = ("qk", "scale", "exp", "m_i", "alpha", "l_ij", "l_i", "acc", "p", "pv", "normalize", "out")
BASELINE_OPS = ("qk", "scale", "softmax", "pv", "out")
_OPS = FLASH_OPS + ("softmax",)
_DOTS = ("qk", "pv")
_MODELS = _DOTS + ("l_ij",)  # ops that take a model rather than an OpSpec
EXP2_IMPLS = ("correctly_rounded", "h200")  # h200: simfloat.hardware.ex2_approx_f32 (ex2.approx.ftz.f32)
EXP_IMPLS = ("correctly_rounded", "tl.exp")  # tl.exp: exp2(op(x * op(log2 e))), as Triton lowers tl.exp
SUM_ORDERS = ("sequential", "h200-mma")  # h200-mma: simfloat.hardware.mma_tree_sum (tl.sum, mma layout)
#: Plan.state: the running state's form, (m_i, l_i) or a log-sum-exp (the flash-attention repository's Triton kernel)
STATE_FORMS = ("m_l", "lse")
#: Plan.kv_order: the order a q tile walks its key tiles
KV_ORDERS = ("forward", "reverse", "diagonal_first")
#: Plan.kernel: the kernel a plan is for ("any": flash and baseline)
KERNELS = ("flash", "baseline", "any")


def _op_params(plan: Any, name: str) -> OpParams:
    """Op ``name`` of a forward or backward plan for the compiled kernels: its format's params and rounding mode."""
    s: OpSpec = getattr(plan, name)
    return OpParams(s.fmt.params, int(s.mode))


def _qk_scale(plan: Any, scale: float) -> tuple[float, float]:
    """(``scale_op(scale)``, the kernels' ``qk_scale``): ``scale_op(scale_op(scale) * scale_op(log2 e))`` with
    ``plan.exp2`` (the Triton kernels' host code, H1), else ``scale_op(scale)``."""
    from simfloat.attention._kernels import mul, rnd

    sc = _op_params(plan, "scale")
    rounded = rnd(float(scale), sc)
    return rounded, (mul(rounded, rnd(math.log2(math.e), sc), sc) if plan.exp2 else rounded)


_F32_NE = OpParams(_format("float32").params, 0)
#: the entries besides its ops a plan of the baseline kernel takes
_BASELINE_FLAGS = ("opmath",)


class Features(NamedTuple):
    """A plan's optional steps of the flash dataflow, as the compiled kernels take them (:meth:`Plan._features`)."""

    per_step: bool  # FA1: the accumulator normalized after every key tile
    lazy: bool  # rescale only when m grows by more than threshold
    threshold: float  # lazy rescaling's threshold, a constant of the m_i format
    ex2_tab: np.ndarray  # exp/alpha exp2: empty = correctly rounded, else simfloat.hardware.ex2_table()
    sum_order: int  # l_ij: 0 sequential, 1 the H200's tl.sum order in the mma layout
    l_ij: OpParams  # l_ij: each addition of the in-tile row sum (a chunk's, with l_ij_chunk)
    l_ij_out: OpParams  # with l_ij_chunk: the running sum of the chunk sums
    l_ij_chunk: int  # 0: sequential in l_ij; else chunks of this many keys, each summed from 0 in l_ij
    exp_tl: bool  # exp/alpha without exp2: tl.exp's exp2(op(x * op(log2 e)))
    tie: bool  # T4's tied-maxima shift (Plan.tie_shift) is on
    tie_beta: float  # its factor, a constant of the m_i format
    tie_tol: float  # its tolerance, a constant of the scale op's format
    lse: bool = False  # Plan.state == "lse": the running state is (m_i, lse_i)
    kv_order: int = 0  # Plan.kv_order: KV_ORDERS.index
    diag_plain: bool = False  # contract without contract_diagonal: T6 rounds twice in the causal diagonal tiles


class PlanParams(NamedTuple):
    """A plan flattened for the compiled kernels, with the call's scale folded in (see :meth:`Plan.params`)."""

    qk: AccParams
    pv: AccParams
    scale: OpParams
    exp: OpParams
    m_i: OpParams
    alpha: OpParams
    l_i: OpParams
    acc: OpParams
    p: OpParams
    normalize: OpParams
    out: OpParams
    softmax: OpParams
    exp2: bool
    contract: bool
    per_step: bool
    lazy: bool
    threshold: float
    qk_scale: float  # flash: the scale as the kernel uses it (log2(e) folded in with exp2), a scale-op value
    qk_scale64: float  # the same in float64, for the shadow execution
    sm_scale: float  # baseline: the scale rounded into the scale op's format
    ex2_tab: np.ndarray  # flash exp/alpha exp2: empty = correctly rounded, else simfloat.hardware.ex2_table()
    sum_order: int  # flash l_ij: 0 sequential, 1 the H200's tl.sum order in the mma layout
    l_ij: OpParams  # flash l_ij: each addition of the in-tile row sum (a chunk's, with l_ij_chunk)
    l_ij_out: OpParams  # with l_ij_chunk: the running sum of the chunk sums (one chunk: the one final rounding)
    l_ij_chunk: int  # 0: sequential in l_ij; else chunks of this many keys, each summed from 0 in l_ij
    exp_tl: bool = False  # flash exp/alpha without exp2: tl.exp's exp2(op(x * op(log2 e)))
    tie: bool = False  # flash T4: the tied-maxima shift (Plan.tie_shift) is on
    tie_beta: float = 0.0  # its factor, a constant of the m_i format
    tie_tol: float = 0.0  # its tolerance, a constant of the scale op's format
    opmath_on: bool = False  # baseline: the scale multiply rounds into opmath first (Plan.opmath)
    opmath: OpParams = _F32_NE  # that format (nearest-even); sm_scale is then an opmath value


@dataclass(frozen=True)
class Plan:
    """Format and rounding of every operation of the flash and baseline attention kernels, and the optional
    quantizer ops of the quantized flash kernels (INT8, FP8, FP4: :mod:`simfloat.attention.quantized`).

    Scalar ops hold an :class:`OpSpec`, ``qk``/``pv`` an accumulation model, the quantizers a :class:`Quant`.
    Construct presets with :func:`plan` (one table: float and quantized) and derive variants with :meth:`replace`.
    A plan without quantizers (``q_quant`` ... ``p_quant`` None, the float plans) runs the flash (FA2) or
    baseline dataflow; a plan with them (:attr:`quantized`) runs the quantized flash dataflow, in which P's
    cast is ``p_quant`` (the ``p`` and ``softmax`` ops are not used) and the row sum is in ``l_i`` (in
    ``sum_order``). Both run the one forward loop of each engine: the hardware models (``exp2_impl``,
    ``sum_order``), ``exp_impl`` and ``lazy_threshold`` apply to a plan with quantizers too; FA1's
    ``normalization`` and ``tie_shift`` do not (yet).

    Attributes:
        name: label (shown in traces).
        qk: score dot product q.k (accumulation model; starts from 0).
        scale: softmax-scale multiply (with ``exp2`` the scale has log2(e) folded in), and with ``contract``
            the fused ``qk*scale - m``; without it the subtraction of the max is a second rounding here.
        exp: exp (or exp2) of the shifted scores.
        m_i: storage of the running max (and the lazy-rescaling test ``m_new - m_old``).
        alpha: ``m_old - m_new`` and its exp/exp2.
        l_ij: the in-tile row sum of P (T8): a sum model, ``Sequential(fmt, mode)`` (each addition rounded
            into fmt, in ``sum_order``: the kernel's ``tl.sum`` in its working format) or a one-level
            ``Chunked`` of one (``sum_once(fmt)``: float32 partial sums, the result rounded once into fmt, as a
            torch reduction). A format or ``(format, mode)`` means sequential in it. Default (``None``):
            sequential in ``l_i``'s format and mode.
        l_i: the running row sum's update ``l*alpha + l_ij`` (T10) and its storage.
        acc: accumulator rescale ``acc*alpha`` (per-step normalization: ``acc*(l_old*alpha)``, two roundings).
        p: cast of P before P.V.
        pv: P.V accumulated into the incoming accumulator, as ``tl.dot(p, v, acc)`` (accumulation model).
        normalize: ``acc / l``.
        out: output cast.
        softmax: baseline only: format of the softmax (input cast, max, subtract, exp, sum, divide).
        exp2: flash: exp2 with log2(e) folded into the scale (as the Triton kernel) instead of exp.
        contract: flash: ``qk*scale - m`` and ``l*alpha + l_ij`` rounded once each (tl.fma / fp fusion).
        normalization: flash: ``"deferred"`` (FA2) or ``"per_step"`` (FA1).
        exp2_impl: flash: ``"correctly_rounded"`` or ``"h200"`` (exp/alpha exp2 through the measured
            ex2.approx.ftz.f32 of :mod:`simfloat.hardware`, then rounded into the op's format), or another ex2
            table of the same model as a value (:class:`simfloat.hardware.Ex2Table`: what a hardware profile's
            plan carries, complete in any process) or by a name registered with
            :func:`simfloat.hardware.register_ex2_table` (``"table-<sha256 prefix>"``).
        sum_order: flash: order of the row sum l_ij: ``"sequential"`` or ``"h200-mma"`` (the measured
            tl.sum order over a tile in the tensor-core accumulator layout,
            :func:`simfloat.hardware.mma_tree_sum`).
        lazy_threshold: flash: rescale only if ``m_i(m_new - m_old) > lazy_threshold`` (exp/exp2 units of the
            scaled scores; the threshold is rounded into the m_i format); ``None`` always rescales.
        exp_impl: flash without ``exp2``: ``"correctly_rounded"`` (e**x rounded once into the op's format) or
            ``"tl.exp"`` (a kernel calling ``tl.exp``, which Triton lowers to ``ex2(x * log2e)``: the exp and
            alpha ops compute ``op(exp2(op(x * op(log2 e))))``, with ``exp2_impl``'s exp2; the H200's without
            flushing, as ex2.approx.f32).
        tie_shift: flash: the fix of Qiu & Yao (arXiv 2510.04212, Sec. 4, and their code) for tied row maxima,
            ``None`` (off) or its factor beta (finite, > 1; the paper's code uses 2). At T4, per key tile: with
            ``mx = scale(max_j s_j * qk_scale)`` the tile's max, if at least two of the tile's visible keys have
            ``scale(s_j * qk_scale) >= scale(mx - tie_tol)``, the max the tile offers to ``m_i`` becomes
            ``m_i(beta * mx)`` if ``mx > 0``, ``0`` if ``mx < 0`` (``mx == 0`` stays), then
            ``m_new = max(m_i, that)`` as usual. The tied keys then get ``P = exp((1 - beta) mx)`` (``mx > 0``) or
            ``exp(mx)`` (``mx < 0``) instead of exactly 1: below 1 unless ``|mx|`` is within the exp's rounding
            of 0 (or 0). Only ties
            within one key tile count (a max repeated across tiles is not seen, as in the paper's kernel); a
            large ``|mx|`` can make the whole tile's P underflow to 0 (the paper's "decrease beta" advice).
            The lse handed to the backward is ``m + log l`` of the shifted m: the same number up to rounding.
        tie_tol: flash, with ``tie_shift``: the tolerance of the tie test, >= 0, in the units of the scaled
            scores (log2 units with ``exp2``); rounded into the scale op's format. The paper's code uses 1e-3
            in natural-log units (``1e-3 * log2(e)`` here with exp2); 0 (default): exact ties only.
        kernel: the kernel the plan is for: ``"flash"``, ``"baseline"`` or ``"any"`` (both; default).
            ``replace`` keeps it and refuses ops the kernel never uses; :meth:`kernels` reads it.
        opmath: baseline plans only (``kernel="baseline"``): ``None``, or the format torch's eager element-wise
            kernels compute in (their "opmath" type: float32 for bf16/fp16 tensors). The softmax scale, a Python
            float, is then handed over in that format and the multiply rounds into it first:
            ``scale(opmath(s * opmath(scale)))`` (two roundings), as ``tensor * scale`` does in torch; without
            it ``scale(s * scale_op(scale))``. The ``pytorch-bf16`` / ``pytorch-fp16`` presets set float32
            (as :class:`~simfloat.attention.BackwardPlan`'s ``opmath``).
        state: flash: the running state's form. ``"m_l"`` (default): the running max ``m_i`` and row sum
            ``l_i`` (T4..T10), divided out at the end (E1). ``"lse"``: the flash-attention repository's Triton
            kernel (``flash_attn/flash_attn_triton.py``), which keeps ``m_i`` and a log-sum-exp ``lse_i``: per key
            tile ``m_ij = max(lse_i, scale(rowmax(s) * qk_scale))`` (the max against ``lse_i``, not ``m_i``),
            ``p = exp(fma(s, qk_scale, -m_ij))``, ``alpha = exp(alpha(m_i - m_ij))``, ``acc = acc(acc * alpha)``
            then the P.V dot, ``l_ij`` the row sum, ``l_i = l_i(alpha(exp(alpha(lse_i - m_ij))) + l_ij)``,
            ``lse_i = m_i(m_ij + l_i(log(l_i)))``, ``m_i = m_ij``; at the end ``o_scale =
            normalize(exp(normalize(m_i - lse_i)))`` and ``o = out(normalize(acc * o_scale))`` (a product, not
            a division). The exponentials are the exp op's form (``exp_impl``); ``log`` is correctly rounded.
            Natural-log units only (``exp2=False``); no FA1, lazy rescaling or tie shift. ``return_stats``
            gives ``m = lse`` and ``l = 1`` (the kernel stores only the lse).
        kv_order: flash: the order a q tile walks its key tiles: ``"forward"`` (default: 0, 1, ...),
            ``"reverse"`` (last first) or ``"diagonal_first"`` (causal: the key tiles some row of the q tile
            masks in part, in forward order, then the rest from tile 0; without ``causal`` as forward).
        contract_diagonal: flash, with ``contract`` and ``causal``: whether T6 is one fma in the diagonal key tiles
            too (those ``kv_order`` calls diagonal: some row of the q tile masks part of them). ``False``: the
            Triton tutorial's masked stage, which adds the mask to the scaled scores (``qk * qk_scale + mask``,
            the fma rounding the product alone) and then subtracts ``m_ij``: ``scale(scale(s * qk_scale) - m)``
            there, one fma elsewhere. Default True (every tile alike).
        exp2_emu: flash, with ``exp2`` and no quantizers: FlashAttention-4's mix of its software exp2
            (:func:`simfloat.hardware.ex2_poly_f32`) with the hardware one (``exp2_impl``) for P (T7; alpha
            stays hardware): ``None`` (off), ``"fa4"`` (the kernel's published tuning table, resolved per call
            from the head dims, ``causal``, the sequence length and an fp8 ``qk`` input:
            :func:`simfloat.attention.fa4.ex2_schedule`) or a fixed ``(freq, res, start_frg)``. The key
            tile's 128 positions form four fragments of 32; in fragment ``j`` the pair of positions starting
            at even ``k`` takes the polynomial unless ``k % freq < freq - res``, ``j`` is the last fragment or
            ``j < start_frg`` (``freq`` 0: never). Needs ``block_n`` 128 (the default for such plans).
        p_offset: flash, with ``exp2`` and no quantizers: FlashAttention-3/4's ``Max_offset`` / ``max_offset``,
            an integer 0..64: P is ``exp2(x + p_offset)`` (the shift ``scale(m - p_offset)``; P scaled by
            ``2**p_offset`` before its cast, the fp32 row sum counting the scaled, uncast values); the factor
            cancels in ``acc / l``. The fp8 presets use 8.
        alpha_raw: flash, no quantizers, no ``tie_shift``: FlashAttention-3/4's alpha from the unscaled row maxima
            ``r`` (the scores' max, before the scale): ``d = alpha(alpha(r_old - r_new) * qk_scale)``, alpha
            ``exp2(d)``, and lazy rescaling keeps the max while ``d >= -lazy_threshold`` (FA4's test); off: alpha
            ``exp2(alpha(m_old - m_new))`` of the scaled maxima and the test ``m_i(m_new - m_old) > threshold``
            (the Triton kernels). The same in exact arithmetic; the roundings differ.

    The quantizer ops (None in a plan without quantizers; a plan with any quantizer gets the defaults named):
        q_quant, k_quant, v_quant, p_quant: the quantizers (:class:`Quant`; None: ``Quant()``, nothing
            quantized). With them the dots ``qk`` and ``pv`` run on the codes, and ``scale`` is also
            ``max * s_scale`` and (folded scores) the scale products.
        rotate: (float32) incoherent processing: the rotated Q and K (computed in float64) rounded into this op.
        k_smooth: SageAttention's smoothing of K by its mean key, or None (no smoothing): per lead index and
            channel, ``mu = k_smooth(mean(k))`` (the float64 mean over the sequence: numpy's sum / seq_k),
            then ``k = k_smooth(k - mu)`` (the exact difference rounded once; after ``rotate``, before
            ``k_quant``). Every score
            of a query row shifts by the same ``q . mu``, which softmax removes.
        q_smooth: SageAttention2/3's smoothing of Q by the mean query of each q tile, or None (no smoothing;
            then q_delta is None too): per lead index, q tile (block_m rows) and channel,
            ``mu_q = q_smooth(mean(q))`` (float64 mean over the tile's rows), ``q = q_smooth(q - mu_q)``
            (after ``rotate`` and ``k_smooth``, before ``q_quant``). Unlike K's, Q's shift is not removed by
            softmax: ``q_delta`` adds it back.
        q_delta: the accumulation model of the correction ``delta_s = mu_q . k`` (per q tile and key, on the
            unquantized keys after ``k_smooth``), or None; a plan with ``q_smooth`` and no ``q_delta`` gets
            ``Sequential("float32")`` (a chain of fp32 fused multiply-adds). Where Q's and K's codes carry their whole
            scale into the qk MMA (unscaled casts, block quantizers without a level above, or no quantizer),
            ``delta_s`` is the MMA's initial accumulator, as SageAttention3 loads it: ``s = qk(delta_s +
            q_code . k_code)``; otherwise (``score_scaling="scores"``) it is added to the dequantized score,
            ``s = dequant(s + delta_s)``.
        dequant: (float32) ``score_scaling="scores"``: the two multiplications of the integer score by the scales.
        pv_dequant: (float32) ``pv * v_scale`` and ``/ qmax`` of P (separate), the epilogue ``acc * v_scale``
            (into_acc), the fused ``fma(pv, v_scale, acc)`` (scaled).
        row_sum: ``"reference"`` (default; l from the fp32 P, INT-FlashAttention's code) or ``"consistent"`` (from the
            quantized P that multiplies V).
        score_scaling: ``"scores"`` (default; INT8 kernel) or ``"folded"`` (FP8 kernel).
        pv_update: ``"separate"`` (default; INT8), ``"into_acc"`` (FP8 per-tensor, half-INT8, FP16 flash),
            ``"scaled"`` (FP8 per-block) or ``"two_level"`` (SageAttention2: each key tile's P.V from zero,
            ``acc = acc(fma(acc, alpha, pv(c . v)))``, V's scale and P's fixed scale once in the epilogue; a
    """

    name: str
    qk: Model
    scale: OpSpec
    exp: OpSpec
    m_i: OpSpec
    alpha: OpSpec
    l_i: OpSpec
    acc: OpSpec
    p: OpSpec
    pv: Model
    normalize: OpSpec
    out: OpSpec
    softmax: OpSpec
    l_ij: Sequential | Chunked | None = None
    exp2: bool = False
    contract: bool = False
    normalization: str = "deferred"
    lazy_threshold: float | None = None
    exp2_impl: str | Ex2Table = "correctly_rounded"
    sum_order: str = "sequential"
    exp_impl: str = "correctly_rounded"
    tie_shift: float | None = None
    tie_tol: float = 0.0
    kernel: str = "any"
    q_quant: Quant | None = None
    k_quant: Quant | None = None
    v_quant: Quant | None = None
    p_quant: Quant | None = None
    rotate: OpSpec | None = None
    k_smooth: OpSpec | None = None
    q_smooth: OpSpec | None = None
    q_delta: Model | None = None
    dequant: OpSpec | None = None
    pv_dequant: OpSpec | None = None
    row_sum: str | None = None
    score_scaling: str | None = None
    pv_update: str | None = None
    opmath: FloatFormat | None = None
    state: str = "m_l"
    kv_order: str = "forward"
    contract_diagonal: bool = True
    exp2_emu: str | tuple[int, int, int] | None = None
    p_offset: int = 0
    alpha_raw: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise TypeError(f"Plan.name must be a string, got {type(self.name).__name__}")
        if self.kernel not in KERNELS:
            raise ValueError(f"Plan.kernel must be one of {KERNELS}, got {self.kernel!r}")
        if self.opmath is not None:
            object.__setattr__(self, "opmath", _format(self.opmath))
            if self.kernel != "baseline":
                raise ValueError(
                    "Plan.opmath models torch's eager element-wise kernels: it belongs to plans of the baseline "
                    f"kernel (kernel='baseline'), not {self.kernel!r}"
                )
        if self.quantized:
            for f, value in _qp.quant_fields(self).items():
                object.__setattr__(self, f, value)
            object.__setattr__(self, "kernel", "flash" if self.kernel == "any" else self.kernel)
            object.__setattr__(self, "l_ij", None)  # the quantized kernels' row sum: sequential in l_i
        else:
            extra = [f for f in QUANT_FIELDS if getattr(self, f) is not None]
            if extra:
                raise ValueError(
                    f"Plan: {', '.join(extra)} belong to plans with quantizers: set q_quant, k_quant, v_quant and "
                    "p_quant too (Quant() for one that quantizes nothing)"
                )
        for op in _OPS:
            value = getattr(self, op)
            if op == "l_ij":
                continue
            spec = _dot_spec(op, value) if op in _DOTS else _scalar_spec(op, value)
            object.__setattr__(self, op, spec)
        lij = (self.l_i.fmt, self.l_i.mode) if self.l_ij is None else self.l_ij
        object.__setattr__(self, "l_ij", _sum_spec("l_ij", lij))
        for flag in ("exp2", "contract", "contract_diagonal"):
            if not isinstance(getattr(self, flag), bool):
                raise TypeError(f"Plan.{flag} must be a bool, got {type(getattr(self, flag)).__name__}")
        if self.normalization not in ("deferred", "per_step"):
            raise ValueError(f"Plan.normalization must be 'deferred' or 'per_step', got {self.normalization!r}")
        _check_exp2_impl(self.exp2_impl, "Plan.exp2_impl")
        if self.sum_order not in SUM_ORDERS:
            raise ValueError(f"Plan.sum_order must be one of {SUM_ORDERS}, got {self.sum_order!r}")
        if self.sum_order != "sequential" and isinstance(self.l_ij, Chunked):
            raise ValueError(
                f"Plan.sum_order={self.sum_order!r} (the measured tl.sum order) takes a sequential l_ij model, "
                "not Chunked"
            )
        if self.exp_impl not in EXP_IMPLS:
            raise ValueError(f"Plan.exp_impl must be one of {EXP_IMPLS}, got {self.exp_impl!r}")
        if self.exp_impl == "tl.exp" and self.exp2:
            raise ValueError(
                "Plan.exp_impl='tl.exp' models tl.exp, which a plan with exp2=True never calls "
                "(it folds log2(e) into the scale and calls exp2): set exp2=False with it"
            )
        t = self.lazy_threshold
        if t is not None:
            if isinstance(t, bool) or not isinstance(t, (int, float)):
                raise TypeError(f"Plan.lazy_threshold must be None or a real number, got {type(t).__name__}")
            if not (math.isfinite(t) and t >= 0):
                raise ValueError(f"Plan.lazy_threshold must be finite and >= 0, got {t}")
            object.__setattr__(self, "lazy_threshold", float(t))
        self._check_tie()
        self._check_dataflow()
        self._check_fa4()
        if self.quantized:
            _qp.check_quantized(self)

    def _check_fa4(self) -> None:
        """exp2_emu and p_offset: values, and the plans they apply to (exp2, no quantizers)."""
        e, off = self.exp2_emu, self.p_offset
        if e is not None:
            if isinstance(e, list):
                e = tuple(e)
            ok = e == "fa4" or (
                isinstance(e, tuple)
                and len(e) == 3
                and all(isinstance(v, int) and not isinstance(v, bool) for v in e)
                and e[0] >= 0
                and 0 <= e[1] <= max(e[0], 0)
                and e[2] >= 0
            )
            if not ok:
                raise ValueError(
                    f"Plan.exp2_emu must be None, 'fa4' or (freq, res, start_frg) with freq >= 0, 0 <= res <= freq, "
                    f"start_frg >= 0; got {self.exp2_emu!r}"
                )
            object.__setattr__(self, "exp2_emu", e)
        if isinstance(off, bool) or not isinstance(off, int):
            raise TypeError(f"Plan.p_offset must be an int, got {type(off).__name__}")
        if not 0 <= off <= 64:
            raise ValueError(f"Plan.p_offset must be in 0..64, got {off}")
        if not isinstance(self.alpha_raw, bool):
            raise TypeError(f"Plan.alpha_raw must be a bool, got {type(self.alpha_raw).__name__}")
        if self.alpha_raw and (self.quantized or self.tie_shift is not None):
            raise ValueError("Plan.alpha_raw (FA3/FA4's alpha) takes a plan without quantizers and without tie_shift")
        for what, on in (("exp2_emu", e is not None), ("p_offset", off != 0)):
            if on and (not self.exp2 or self.quantized):
                raise ValueError(
                    f"Plan.{what} models FlashAttention-3/4's exp2 dataflow: it needs exp2=True and a plan without "
                    "quantizers"
                )

    @property
    def quantized(self) -> bool:
        """Whether the plan has quantizer ops (then the quantized flash dataflow runs it)."""
        return any(getattr(self, q) is not None for q in QUANTIZERS)

    def ops(self) -> tuple[str, ...]:
        """The ops of the plan's dataflow, in kernel order: the quantized kernels' (``QUANT_OPS``) for a plan with
        quantizers, else the flash kernel's (``FLASH_OPS``), the baseline's (``BASELINE_OPS``) or, for a plan
        of both kernels, the flash ops and ``softmax``."""
        if self.quantized:
            return QUANT_OPS
        return {"flash": FLASH_OPS, "baseline": BASELINE_OPS}.get(self.kernel, _OPS)

    def _check_dataflow(self) -> None:
        """``state`` and ``kv_order``: known values, and the lse form only with the steps it has a form for."""
        if self.state not in STATE_FORMS:
            raise ValueError(f"Plan.state must be one of {STATE_FORMS}, got {self.state!r}")
        if self.kv_order not in KV_ORDERS:
            raise ValueError(f"Plan.kv_order must be one of {KV_ORDERS}, got {self.kv_order!r}")
        if self.state == "lse":
            clash = [
                what
                for what, on in (
                    ("exp2=True (the lse form keeps natural-log units: exp and log)", self.exp2),
                    ("normalization='per_step'", self.normalization == "per_step"),
                    ("lazy_threshold", self.lazy_threshold is not None),
                    ("tie_shift", self.tie_shift is not None),
                    ("alpha_raw=True", self.alpha_raw),
                )
                if on
            ]
            if clash:
                raise ValueError(f"Plan.state='lse' has no form with {', '.join(clash)}")

    def _check_tie(self) -> None:
        b, tol = self.tie_shift, self.tie_tol
        for what, x in (("tie_shift", b), ("tie_tol", tol)):
            if x is not None and (isinstance(x, bool) or not isinstance(x, (int, float))):
                raise TypeError(
                    f"Plan.{what} must be {'None or ' if what == 'tie_shift' else ''}a real number, "
                    f"got {type(x).__name__}"
                )
        if b is not None:
            if not (math.isfinite(b) and b > 1):
                raise ValueError(f"Plan.tie_shift must be None or a finite factor > 1, got {b}")
            object.__setattr__(self, "tie_shift", float(b))
        if not (math.isfinite(tol) and tol >= 0):
            raise ValueError(f"Plan.tie_tol must be finite and >= 0, got {tol}")
        if tol != 0 and b is None:
            raise ValueError("Plan.tie_tol is the tolerance of the tie_shift rule: set tie_shift too")
        object.__setattr__(self, "tie_tol", float(tol))

    def replace(self, **changes: object) -> Plan:
        """A copy with some ops or flags changed.

        Ops take an :class:`OpSpec`, a format, ``(format, mode)``; ``qk``/``pv`` also an accumulation model (a
        bare format there means sequential accumulation with products and partial sums rounded into it); the
        quantizers a :class:`Quant`.

        A plan of one kernel (its ``kernel`` field, see :meth:`kernels`) takes only what that kernel uses: no
        ``softmax`` on a flash plan (``triton-``/``h200-``), none of the flash-only ops (``exp``, ``m_i``,
        ``alpha``, ``l_i``, ``acc``, ``p``, ``normalize``), flags or quantizers on a baseline plan
        (``pytorch-``); a plan with quantizers takes its dataflow's ops (:meth:`ops`) and flags (``exp2``,
        ``contract``, ``row_sum``, ``score_scaling``, ``pv_update``, ``exp2_impl``, ``sum_order``, ``exp_impl``,
        ``lazy_threshold``) only. Such a change would change nothing.
        ``fp64``, ``all-<fmt>`` and plans of ``kernel="any"`` serve both kernels and take every entry; quantizers
        given to a flash plan make it a plan with quantizers.

        Raises:
            ValueError: unknown op or flag name (the message lists the valid ones), or an entry the plan's
                kernel never uses (the message lists the kernel's ops).
            TypeError: a value of the wrong type.
        """
        flags = [f.name for f in dataclasses.fields(self) if f.name not in _OPS and f.name != "name"]
        unknown = sorted(set(changes) - set(_OPS) - set(flags) - {"name"})
        if self.quantized:
            unknown = sorted(set(changes) - set(QUANT_OPS) - set(QUANT_FLAGS) - {"name"})
            if unknown:
                raise ValueError(
                    f"unknown plan entries {unknown} for plan {self.name!r} (a plan with quantizers); ops: "
                    f"{', '.join(QUANT_OPS)}; flags: {', '.join(QUANT_FLAGS)}"
                )
        elif unknown:
            raise ValueError(f"unknown plan entries {unknown}; ops: {', '.join(_OPS)}; flags: {', '.join(flags)}")
        kernels = self.kernels()
        if len(kernels) == 1 and not self.quantized:
            kernel = kernels[0]
            used = FLASH_OPS + tuple(flags) if kernel == "flash" else BASELINE_OPS + _BASELINE_FLAGS
            unused = [c for c in changes if c != "name" and c not in used]
            if unused:
                raise ValueError(
                    f"plan {self.name!r} is for the {kernel} kernel, which never uses "
                    f"{', '.join(map(repr, unused))} (the change would do nothing); the {kernel} kernel's ops: "
                    f"{', '.join(FLASH_OPS if kernel == 'flash' else BASELINE_OPS)}"
                    + f"; its flags: {', '.join(flags if kernel == 'flash' else _BASELINE_FLAGS)}"
                )
        if "name" not in changes:
            changes["name"] = self.name if self.name.endswith("*") else self.name + "*"
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]  # checked in __post_init__

    def kernels(self) -> tuple[str, ...]:
        """The kernels this plan is for (its ``kernel`` field): ``("flash",)`` (the presets ``triton-<fmt>``,
        ``triton-<fmt>@<profile>``, ``h200-<fmt>`` and every plan with quantizers), ``("baseline",)``
        (``pytorch-<fmt>``: torch's eager attention) or ``("flash", "baseline")`` (``kernel="any"``: ``fp64``,
        ``all-<fmt>``, and a Plan constructed without a kernel). Plans derived with :meth:`replace` keep it."""
        return ("flash", "baseline") if self.kernel == "any" else (self.kernel,)

    def exact(self) -> Plan:
        """A plan with quantizers: the same dataflow with nothing quantized and every op exact (float64; dots
        ``EXACT``). Plans without quantizers: see :func:`simfloat.attribution.reference_plan`.

        Raises:
            ValueError: a plan without quantizers.
        """
        return _qp.exact(self._quantized_only("exact"))

    def isolate(self, op: str) -> Plan:
        """A plan with quantizers: only ``op`` as in this plan, everything else exact: the error ``op`` causes
        on its own (plans without quantizers: :func:`simfloat.attribution.isolation_plan`).

        Raises:
            ValueError: an unknown op, a block-scaled MMA (it cannot run without its quantizers), or a plan
                without quantizers.
        """
        return _qp.isolate(self._quantized_only("isolate"), op)

    def ablate(self, op: str) -> Plan:
        """A plan with quantizers: ``op`` made exact (a quantizer removed), the error left without it. A quantizer
        that feeds a block-scaled MMA (FP4) takes the MMA with it (the MMA is made ``EXACT``): the MMA has no form
        for unquantized operands (plans without quantizers: :func:`simfloat.attribution.ablation_plan`).

        Raises:
            ValueError: an unknown op or a plan without quantizers.
        """
        return _qp.ablate(self._quantized_only("ablate"), op)

    def arith_fp64(self) -> Plan:
        """A plan with quantizers: its quantizers with all arithmetic exact (quantization error alone).

        Raises:
            ValueError: a plan without quantizers.
        """
        return _qp.arith_fp64(self._quantized_only("arith_fp64"))

    def quant_ops(self) -> _qp.QuantOps:
        """A plan with quantizers: its quantizers and the quantized dataflow's own scalar ops, typed.

        Raises:
            ValueError: a plan without quantizers.
        """
        pl = self._quantized_only("quant_ops")
        return _qp.QuantOps(*(getattr(pl, f) for f in _qp.QuantOps._fields))

    def _quantized_only(self, what: str) -> Plan:
        if not self.quantized:
            raise ValueError(
                f"Plan.{what}() derives plans of the quantized dataflow; plan {self.name!r} has no quantizers "
                "(simfloat.attribution derives the isolation and ablation plans of the float plans)"
            )
        return self

    def __repr__(self) -> str:
        return _short_repr(self, _build())

    def __str__(self) -> str:
        if self.quantized:
            qops = ", ".join(f"{op}={getattr(self, op)}" for op in QUANT_OPS)
            return (
                f"Plan({self.name}: {qops}; exp2={self.exp2}, contract={self.contract}, "
                f"row_sum={self.row_sum}, score_scaling={self.score_scaling}, pv_update={self.pv_update}"
                + self._options_str()
                + ")"
            )
        ops = ", ".join(f"{op}={getattr(self, op)}" for op in _OPS)
        return (
            f"Plan({self.name}: {ops}; exp2={self.exp2}, contract={self.contract}, "
            f"normalization={self.normalization}, lazy_threshold={self.lazy_threshold}"
            + self._options_str()
            + (f", tie_shift={self.tie_shift}, tie_tol={self.tie_tol}" if self.tie_shift is not None else "")
            + (f", opmath={self.opmath.name}" if self.opmath is not None else "")
            + ")"
        )

    def _options_str(self) -> str:
        return (
            (f", lazy_threshold={self.lazy_threshold}" if self.quantized and self.lazy_threshold is not None else "")
            + (f", exp2_impl={self.exp2_impl}" if self.exp2_impl != "correctly_rounded" else "")
            + (f", sum_order={self.sum_order}" if self.sum_order != "sequential" else "")
            + (f", exp_impl={self.exp_impl}" if self.exp_impl != "correctly_rounded" else "")
            + (f", state={self.state}" if self.state != "m_l" else "")
            + (f", kv_order={self.kv_order}" if self.kv_order != "forward" else "")
            + (", contract_diagonal=False" if not self.contract_diagonal else "")
            + (f", exp2_emu={self.exp2_emu}" if self.exp2_emu is not None else "")
            + (f", p_offset={self.p_offset}" if self.p_offset else "")
            + (", alpha_raw=True" if self.alpha_raw else "")
        )

    def params(self, scale: float) -> PlanParams:
        """The plan for the compiled kernels, with the softmax ``scale`` rounded as the kernels use it.

        flash: ``qk_scale = scale_op(scale_op(scale) * scale_op(log2 e))`` with ``exp2`` (the Triton kernel's
        host code, H1), else ``scale_op(scale)``; baseline: ``scale_op(scale)``.

        Raises:
            ValueError: the rounded scale is not finite and > 0.
        """
        if self.quantized:
            raise ValueError(f"plan {self.name!r} has quantizers: its kernel parameters are quant_params()")
        from simfloat.attention._kernels import rnd

        op = functools.partial(_op_params, self)
        sm_scale, qk_scale = _qk_scale(self, scale)
        om = _F32_NE if self.opmath is None else OpParams(self.opmath.params, 0)
        if self.opmath is not None:  # torch: the Python float scale in the opmath type
            sm_scale = rnd(float(scale), om)
        qk_scale64 = float(scale) * math.log2(math.e) if self.exp2 else float(scale)
        for v in (sm_scale, qk_scale):
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"scale {scale} becomes {v} in {self.scale.fmt.name}: it must stay finite and > 0")
        f = self._features()
        return PlanParams(  # type: ignore[call-arg]  # mypy cannot count the * spread
            acc_params(self.qk),
            acc_params(self.pv),
            *(op(n) for n in _OPS if n not in _MODELS),  # type: ignore[arg-type]  # mypy cannot count the * spread
            self.exp2,
            self.contract,
            f.per_step,
            f.lazy,
            f.threshold,
            qk_scale,
            qk_scale64,
            sm_scale,
            f.ex2_tab,
            f.sum_order,
            f.l_ij,
            f.l_ij_out,
            f.l_ij_chunk,
            f.exp_tl,
            f.tie,
            f.tie_beta,
            f.tie_tol,
            self.opmath is not None,
            om,
        )

    def _features(self) -> Features:
        """The float dataflow's optional steps (hardware models, lazy rescaling, tie shift, FA1, the l_ij model)
        for the compiled kernels; a plan with quantizers has them too (each at its plan's value).

        Raises:
            ValueError: tie_shift rounds to 1 or less in the m_i format.
        """
        from simfloat.attention._kernels import rnd

        m_i = _op_params(self, "m_i")
        t = self.lazy_threshold
        threshold = 0.0 if t is None else rnd(t, m_i)  # a constant of the m_i format, as in the kernel
        tie = self.tie_shift is not None
        tie_beta = rnd(self.tie_shift, m_i) if self.tie_shift is not None else 0.0
        tie_tol = rnd(self.tie_tol, _op_params(self, "scale"))
        if tie and not tie_beta > 1:
            raise ValueError(f"Plan.tie_shift={self.tie_shift} rounds to {tie_beta} in {self.m_i.fmt.name}: not > 1")
        return Features(
            self.normalization == "per_step",
            t is not None,
            threshold,
            _ex2_tab(self.exp2_impl),
            SUM_ORDERS.index(self.sum_order),
            *self._l_ij_params(),
            self.exp_impl == "tl.exp",
            tie,
            tie_beta,
            tie_tol,
            self.state == "lse",
            KV_ORDERS.index(self.kv_order),
            self.contract and not self.contract_diagonal,
        )

    def quant_params(self, scale: float) -> QParams:
        """A plan with quantizers for the compiled kernels, with the host's qk_scale (H1): ``scale(scale(sm_scale) *
        scale(log2 e))`` with exp2, else ``scale(sm_scale)``.

        Raises:
            ValueError: the rounded scale is not finite and > 0, or a plan without quantizers (see :meth:`params`).
        """
        return _qp.quant_params(self._quantized_only("quant_params"), scale)

    def _l_ij_params(self) -> tuple[OpParams, OpParams, int]:
        m = self.l_ij
        if isinstance(m, Chunked):
            assert isinstance(m.inner, Sequential) and m.chunk is not None  # checked by __post_init__
            inner = m.inner
            out = OpParams(_format(m.outer_fmt).params, int(mode_code(m.outer_mode)))
            chunk = int(m.chunk)
        else:
            assert m is not None  # __post_init__ fills the default
            inner, chunk = m, 0
        op = OpParams(_format(inner.fmt).params, int(mode_code(inner.mode)))
        return op, (op if chunk == 0 else out), chunk


# read-only like every ex2 table (simfloat.hardware): numba compiles a kernel per read-only flag of its arrays, so
# a writable empty table would compile the whole engine a second time for the plans with a table
_NO_TABLE = np.zeros(0, dtype=np.int8)
_NO_TABLE.setflags(write=False)


def _ex2_tab(impl: str | Ex2Table) -> np.ndarray:
    if isinstance(impl, Ex2Table):
        return impl.table
    if impl == "correctly_rounded":
        return _NO_TABLE
    from simfloat.hardware import ex2_table

    return ex2_table(impl)


def _check_exp2_impl(impl: object, what: str) -> None:
    """EXP2_IMPLS, an ex2 table as a value (:class:`simfloat.hardware.Ex2Table`, what a hardware profile's plan
    carries) or the name of a table registered with :func:`simfloat.hardware.register_ex2_table`."""
    from simfloat.hardware import ex2_table_names

    if isinstance(impl, Ex2Table):
        return
    if impl not in EXP2_IMPLS and impl not in ex2_table_names():
        known = EXP2_IMPLS + tuple(n for n in ex2_table_names() if n not in EXP2_IMPLS)
        raise ValueError(
            f"{what} must be one of {known} (registered tables) or a simfloat.hardware.Ex2Table, got {impl!r}"
        )


def _uniform(name: str, fmt: str, dot: Model) -> Plan:
    f: Any = fmt  # a format name: OpSpecs after __post_init__
    ops = dict.fromkeys(("scale", "exp", "m_i", "alpha", "l_i", "acc", "p", "normalize", "out", "softmax"), f)
    return Plan(name, qk=dot, pv=dot, **ops)


def _triton(fmt: str) -> Plan:
    f = _format(fmt).name
    # fp32 inputs: "ieee" dots (an FMA loop); tf32: fp32 inputs with tf32 tensor cores (Triton's default)
    dot = Sequential("float32") if fmt == "fp32" else tensor_core("sm90", f)
    wide = fmt in ("fp32", "tf32")
    io: Any = "float32" if wide else f  # format names: OpSpecs after __post_init__
    f32: Any = "float32"  # format names: OpSpecs after __post_init__
    ops = dict.fromkeys(("scale", "exp", "m_i", "alpha", "l_i", "acc", "normalize", "softmax"), f32)
    return Plan(f"triton-{fmt}", qk=dot, pv=dot, p=io, out=io, **ops, exp2=True, contract=True, kernel="flash")


def _flashattn_triton(fmt: str) -> Plan:
    # flash_attn/flash_attn_triton.py of the flash-attention repository (forward, no bias): triton-<fmt>'s formats
    # and dots, tl.exp of the fp32 scores (no log2(e) folded in), FMA contraction of qk * scale - m_ij, and the
    # running state kept as (m_i, lse_i) (Plan.state)
    return dataclasses.replace(_triton(fmt), name=f"flashattn-triton-{fmt}", exp2=False, exp_impl="tl.exp", state="lse")


def _triton_tutorial(fmt: str) -> Plan:
    # python/tutorials/06-fused-attention.py of the triton repository (forward): triton-<fmt>, whose T6 is its
    # contracted qk * qk_scale - m_ij, except in the causal diagonal tiles (Plan.contract_diagonal)
    return dataclasses.replace(_triton(fmt), name=f"triton-tutorial-{fmt}", contract_diagonal=False)


def _pytorch(fmt: str) -> Plan:
    f: Any = _format(fmt).name  # format names: OpSpecs after __post_init__
    if fmt == "fp32":
        qk: Model = Sequential("float32")
        pv: Model = Sequential("float32")
    else:  # fp32 accumulation from 0, the result rounded once into fmt; P read as fmt
        qk = Chunked(_BIG_CHUNK, Sequential("float32"), outer_fmt=f)
        pv = Chunked(_BIG_CHUNK, Sequential("float32", input_fmt=f), outer_fmt=f)
    f32: Any = "float32"  # format names: OpSpecs after __post_init__
    ops = dict.fromkeys(("exp", "m_i", "alpha", "l_i", "acc", "normalize", "softmax"), f32)
    om: Any = None if fmt == "fp32" else "float32"  # torch multiplies a bf16/fp16 tensor by a float in float32
    return Plan(f"pytorch-{fmt}", qk=qk, pv=pv, scale=f, p=f, out=f, **ops, kernel="baseline", opmath=om)


def _profile_dot(prof: Any, fmt: str) -> Model | None:
    """The tensor-core model of a hardware profile's wgmma part for ``fmt`` (else its other parts), or None
    (no part, or ``fmt`` fp32, whose "ieee" dots are FMA loops, no tensor core)."""
    if fmt == "fp32":
        return None
    part = prof.dot(fmt)
    if part is None:
        return None
    if not isinstance(part.model, (Sequential, BlockFMA, Chunked)):
        raise ValueError(
            f"hardware profile {prof.name!r}: the {fmt} {part.mma} tensor-core model is a "
            f"{type(part.model).__name__}, which attention plans cannot run"
        )
    return part.model


def _with_hardware(base: Plan, fmt: str, hardware: object) -> Plan:
    """triton-<fmt> with a hardware profile's models (simfloat.profiles): the tensor-core model of the
    profile's wgmma part for the format (else its other parts; absent: the sm90 preset stays), its exp2
    (``exp2_impl``), its tl.sum rule of the mma layout (``sum_order``) and its FMA contraction fact. A part the
    profile does not have keeps triton-<fmt>'s default."""
    from simfloat.profiles import load_profile, register_profile

    prof = register_profile(load_profile(hardware))  # type: ignore[arg-type]
    changes: dict[str, object] = {"name": f"{base.name}@{prof.name}"}
    model = _profile_dot(prof, fmt)
    if model is not None:
        changes["qk"] = changes["pv"] = model
    changes["exp2_impl"] = prof.exp2_impl()
    mma_sum = prof.sum("mma")
    if mma_sum is not None:
        if mma_sum.rule not in SUM_ORDERS:
            raise ValueError(
                f"hardware profile {prof.name!r}: the tl.sum order of the mma layout has no plan rule "
                f"({mma_sum.status}); plans can use {SUM_ORDERS}"
            )
        changes["sum_order"] = mma_sum.rule
    if prof.isa is not None:
        changes["contract"] = prof.isa.fma_contraction
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def _h200(fmt: str) -> Plan:
    # triton-<fmt> on an H200 (sm_90, triton 3.6) as measured: the shipped profile simfloat/data/profiles/h200.json
    # (fitted from tests/fixtures/gpu/h200/probes; docs/results/h200-validation.md), under its historic name
    return dataclasses.replace(_with_hardware(_triton(fmt), fmt, "h200"), name=f"h200-{fmt}")


def _fa(gen: int, fmt: str) -> Plan:
    """FlashAttention-3 (``gen`` 3, sm90, ``hopper/``) or -4 (4, sm100, ``flash_attn/cute/``) forward: tensor-core
    dots of the generation, exp2 with log2(e) folded into an fp32 scale and FMA contraction, the H200's measured
    ex2.approx.ftz.f32 (FA3 builds with fast math; sm100's is unmeasured, the H200's stands in), fp32 softmax
    state, alpha from the unscaled maxima, P cast to the input format (fp8: scaled by 2**8 first, saturating),
    bf16 output for fp8 inputs, the key tiles walked last first (``kv_order="reverse"``, as both kernels'
    mainloops). FA4:
    its software exp2 mixed in (``exp2_emu="fa4"``) and the row max kept unless it grew by more than 8 (16-bit
    inputs; fp8: always rescaled)."""
    f = _format(fmt).name
    fp8 = fmt == "e4m3"
    dot = tensor_core("sm90" if gen == 3 else "sm100", f)
    f32: Any = "float32"  # format names: OpSpecs after __post_init__
    ops = dict.fromkeys(("scale", "exp", "m_i", "alpha", "l_i", "acc", "normalize", "softmax"), f32)
    p: Any = _format(f).replace(overflow="saturate", name=f"{f}_satfinite") if fp8 else f  # cvt .satfinite
    out: Any = "bfloat16" if fp8 else f  # FA3/FA4 write fp8 attention's output in bf16
    extra: dict[str, Any] = {"exp2_emu": "fa4", "lazy_threshold": None if fp8 else 8.0} if gen == 4 else {}
    return Plan(
        f"fa{gen}-{fmt}",
        qk=dot,
        pv=dot,
        p=p,
        out=out,
        **ops,
        exp2=True,
        contract=True,
        exp2_impl="h200",
        p_offset=8 if fp8 else 0,
        alpha_raw=True,
        kv_order="reverse",
        kernel="flash",
        **extra,
    )


@functools.cache
def _build() -> dict[str, Plan]:
    out = {"fp64": _uniform("fp64", "float64", Sequential("float64", product_fmt="float64"))}
    for fmt in ("bf16", "fp16", "fp32", "tf32", "e4m3", "e5m2"):
        f = _format(fmt).name
        out[f"all-{fmt}"] = _uniform(f"all-{fmt}", f, Sequential(f, product_fmt=f))
    for fmt in ("bf16", "fp16", "fp32", "tf32", "e4m3", "e5m2"):
        out[f"triton-{fmt}"] = _triton(fmt)
    for fmt in ("bf16", "fp16", "tf32", "e4m3", "e5m2"):
        out[f"h200-{fmt}"] = _h200(fmt)
    for fmt in ("bf16", "fp16", "fp32"):
        out[f"pytorch-{fmt}"] = _pytorch(fmt)
    for fmt in ("bf16", "fp16"):
        out[f"flashattn-triton-{fmt}"] = _flashattn_triton(fmt)
    out["triton-tutorial-fp16"] = _triton_tutorial("fp16")
    for gen in (3, 4):
        for fmt in ("bf16", "fp16", "e4m3"):
            out[f"fa{gen}-{fmt}"] = _fa(gen, fmt)
    quantized = _qp.quant_table(_quantized)
    assert not set(out) & set(quantized), "one preset table: float and quantized names must differ"
    out.update(quantized)
    return out


_F32 = OpSpec("float32")


def _quantized(name: str, *quantizers_and_dots: Any, **fields: Any) -> Plan:
    """A plan with quantizers from ``(name, q_quant, k_quant, v_quant, p_quant, qk, pv, **fields)``, with the
    quantized kernels' defaults: every scalar op float32 but the output (float16), exp2 with log2(e) folded into
    the scale and FMA contraction."""
    unknown = sorted(set(fields) - set(QUANT_OPS) - set(QUANT_FLAGS))
    if unknown:
        raise ValueError(
            f"unknown plan entries {unknown}; ops: {', '.join(QUANT_OPS)}; flags: {', '.join(QUANT_FLAGS)}"
        )
    if len(quantizers_and_dots) != 6:
        raise TypeError("a plan with quantizers takes q_quant, k_quant, v_quant, p_quant, qk and pv")
    kw: dict[str, Any] = dict(zip(QUANTIZERS + ("qk", "pv"), quantizers_and_dots, strict=True))
    kw.update(dict.fromkeys(("scale", "exp", "m_i", "alpha", "l_i", "acc", "p", "normalize", "softmax"), _F32))
    kw.update(out=OpSpec("float16"), exp2=True, contract=True, kernel="flash")
    kw.update(fields)
    return Plan(name, **kw)


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
    return _quantized(name, q_quant, k_quant, v_quant, p_quant, qk, pv, **fields)


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


def _short_value(x: object) -> str:
    """A field's value in a repr: formats by name (``bfloat16``), rounding modes by name."""
    if isinstance(x, (OpSpec, FloatFormat)):
        return str(x) if isinstance(x, OpSpec) else x.name
    text = re.sub(r"FloatFormat\(name='([^']*)'[^)]*\)", r"\1", repr(x))
    return re.sub(r"<RoundingMode\.(\w+): \d+>", lambda m: m.group(1).lower(), text)


def _short_repr(p: Any, table: dict[str, Any]) -> str:
    """``Plan('triton-bf16')`` for a preset; else its name and the fields that differ from the preset its name
    starts with (``triton-bf16*``, ``triton-bf16[only p]``, ``triton-bf16@h200``), or from ``fp64`` for a name of
    its own: ``Plan('triton-bf16*', p=float32, exp2=False)``. ``str()`` lists every field."""
    base = p.name
    for stop in "*[@":
        base = base.split(stop, 1)[0]
    ref = table.get(base)
    against = "" if ref is not None else ", vs 'fp64'"
    ref = table["fp64"] if ref is None else ref
    diffs = [
        f"{f.name}={_short_value(getattr(p, f.name))}"
        for f in dataclasses.fields(p)
        if f.name != "name" and getattr(p, f.name) != getattr(ref, f.name)
    ]
    return f"{type(p).__name__}({p.name!r}{against if diffs else ''}" + "".join(f", {d}" for d in diffs) + ")"


def _preset(
    name: object,
    hardware: object,
    cls: type[_P],
    table: Callable[[], dict[str, _P]],
    with_hardware: Callable[[_P, str, object], _P],
    words: tuple[str, str, str],
) -> _P:
    """The resolution :func:`plan` and :func:`backward_plan` share: ``name`` an instance of ``cls`` (returned
    as it is) or a preset of ``table()``, ``triton-<fmt>@<profile>`` or ``hardware`` a hardware profile applied
    by ``with_hardware(preset, fmt, profile)``. ``words``: (what a plan is called, the function's name, the
    kernels the presets model) for the messages."""
    what, func, kernels = words
    if isinstance(name, str) and "@" in name:
        if hardware is not None:
            raise ValueError(f"{what} {name!r} names its hardware profile already; do not pass hardware= too")
        name, _, hardware = name.partition("@")
        if not hardware:
            raise ValueError(f"{what} {name + '@'!r}: no hardware profile after '@' (triton-<fmt>@<profile>)")
        from simfloat.profiles import loaded_profile

        hardware = loaded_profile(hardware)
    if hardware is not None and not (isinstance(name, str) and re.fullmatch(r"triton-[a-z0-9]+", name)):
        raise ValueError(f"{func}(hardware=...) applies to the triton-<fmt> presets ({kernels}), got {name!r}")
    if isinstance(name, cls):
        return name
    if not isinstance(name, str):
        raise TypeError(f"plan must be a {cls.__name__} or a preset name, got {type(name).__name__}")
    presets_ = table()
    if name not in presets_:
        raise ValueError(f"unknown {what} {name!r}; presets: {', '.join(presets_)}")
    if hardware is not None:
        return with_hardware(presets_[name], name.split("-", 1)[1], hardware)
    return presets_[name]
