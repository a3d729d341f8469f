"""The one params record of the forward flash loop (:class:`FlashParams`), built from any :class:`Plan`.

A plan without quantizers and a plan with them run the same dataflow (T1..T14 of the Triton kernels, E1, E2);
what differs is which optional steps run, and each step is chosen by a field of this record:

* quantizer steps (only plans with quantizers): Q/K/V codes with scales, the scores' ``dequant`` or the folded
  scales, Q smoothing's ``delta_s`` (``delta_mode``), the P quantizer (``p_kind`` and its fields), the four
  P.V update forms (``pv_mode``), the fixed P shift (``p_shift``), V's epilogue descale (``v_epilogue``). A
  plan without quantizers has codes = values and no scales: the dequant steps are skipped (never multiplied
  by 1), its P cast is the float code kind ``K_FLOAT`` with ``p`` as the code op, and its P.V is
  ``PV_INTO_ACC`` (``tl.dot(p, v, acc)``);
* float dataflow options (every plan's fields, each at its plan's value): lazy rescaling, the tie shift, FA1's
  per-step normalization, the ``l_ij`` model (sequential, chunked, the H200 ``tl.sum`` tree), the H200 ex2
  table and ``tl.exp``, the running state's form (``lse``), the key tiles' order (``kv_order``) and the
  accumulator's format (``pv_acc``: alpha rounded into it before T11's rescale).

The in-tile row sum is ``l_ij`` (a plan with quantizers has ``l_ij = l_i``'s format and mode, its row sum).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from simfloat.accumulate import AccParams
from simfloat.attention import _quant_kernels as _qk
from simfloat.attention._specs import OpParams, OpSpec
from simfloat.attention.plan import Plan

__all__ = ["ARRAYS", "NO_TABLE", "FlashParams", "flash_params"]

_F64 = OpSpec("float64")


def _op(s: OpSpec) -> OpParams:
    return OpParams(s.fmt.params, int(s.mode))


_F64_OP = _op(_F64)
#: an empty table: no polynomial exp2 (Plan.exp2_emu None), no ex2.approx table, or a record's placeholder for
#: one; read-only, as every array numba compiles the loops for
NO_TABLE = np.zeros(0, dtype=np.int8)
NO_TABLE.setflags(write=False)
#: FlashParams' array fields: compiled code takes the rest as a numpy record (simfloat._jit.record_of) and these apart
ARRAYS = ("ex2_tab", "ex2_poly")


class FlashParams(NamedTuple):
    """Any :class:`~simfloat.attention.Plan` flattened for the forward flash loop, with the call's scale."""

    qk: AccParams
    pv: AccParams
    qk_kind: int  # _quant_kernels.DOT_*: the dots' fast path (DOT_GENERIC: dot_acc)
    pv_kind: int
    scale: OpParams
    exp: OpParams
    m_i: OpParams
    alpha: OpParams
    l_ij: OpParams  # each addition of the in-tile row sum (a chunk's, with l_ij_chunk)
    l_ij_out: OpParams  # with l_ij_chunk: the running sum of the chunk sums
    l_i: OpParams
    acc: OpParams
    normalize: OpParams
    out: OpParams
    dequant: OpParams  # quantizers: the scores' dequantization
    pv_dequant: OpParams  # quantizers: P.V's descale
    exp2: bool
    contract: bool
    qk_scale: float  # the scale as the kernel uses it (log2(e) folded in with exp2), a scale-op value
    qk_scale64: float  # the same in float64, for the shadow execution
    ex2_tab: np.ndarray  # exp/alpha exp2: empty = correctly rounded, else simfloat.hardware.ex2_table()
    exp_tl: bool  # exp/alpha without exp2: tl.exp's exp2(op(x * op(log2 e)))
    sum_order: int  # l_ij: 0 sequential, 1 the H200's tl.sum order in the mma layout
    l_ij_chunk: int  # 0: sequential in l_ij; else chunks of this many keys, each summed from 0 in l_ij
    lazy: bool  # rescale only when m grows by more than threshold
    threshold: float
    tie: bool  # T4's tied-maxima shift
    tie_beta: float
    tie_tol: float
    per_step: bool  # FA1: the accumulator normalized after every key tile
    lse: bool  # Plan.state "lse": the running state is (m_i, lse_i) (the flash-attention repository's Triton kernel)
    kv_order: int  # Plan.kv_order: 0 forward, 1 reverse, 2 diagonal first (_kernels.kv_tile)
    diag_plain: bool  # contract without Plan.contract_diagonal: T6 rounds twice in the causal diagonal tiles
    quantized: bool  # the plan has quantizers (the shadow runs on the unquantized inputs)
    scores_dequant: bool  # quantizers, score_scaling "scores": s = dequant(dequant(s * q_scale) * k_scale)
    folded: bool  # quantizers, score_scaling "folded": s_scale = scale(scale(qk_scale * q_scale) * k_scale)
    delta_mode: int  # _quant_kernels.DELTA_*: Q smoothing's correction
    p_shift: float  # a block P with a fixed first level: scale(log2 qmax) taken off m in P's exponent (else 0)
    v_epilogue: bool  # quantizers, pv_mode into_acc / two_level: V's scale (and P's fixed one) in the epilogue
    pv_mode: int  # _quant_kernels.PV_*: the P.V update (float plans: PV_INTO_ACC)
    consistent: bool  # the row sum from the quantized P
    p_kind: int  # _quant_kernels.K_*: P's quantizer (float plans: K_FLOAT, code op p)
    p_pre: bool
    p_pre_op: OpParams
    p_arith: OpParams
    p_code: OpParams
    p_qmax: float
    p_rule: int
    p_two_level: bool
    p_block: int
    p_scale_op: OpParams
    p_elem_op: OpParams
    p_target: float
    p_scale_zero: float
    ex2_poly: np.ndarray = NO_TABLE  # T7: per key position, 1 = FA4's polynomial exp2 (empty: hardware/exact only)
    alpha_raw: bool = False  # T4, T9: FA3/4's alpha (and lazy test) from the unscaled maxima
    pv_acc: bool = False  # T11: alpha rounded into the accumulator's format first (Plan.pv_acc)
    pv_acc_op: OpParams = _F64_OP  # that rounding (nearest even into Plan.pv_acc)


def flash_params(pl: Plan, scale: float) -> FlashParams:
    """The :class:`FlashParams` of a plan (with or without quantizers) for the softmax ``scale``.

    Raises:
        ValueError: the rounded scale is not finite and > 0, or tie_shift rounds to 1 or less.
    """
    f = pl._features()
    options: dict[str, Any] = dict(
        ex2_tab=f.ex2_tab,
        exp_tl=f.exp_tl,
        sum_order=f.sum_order,
        l_ij=f.l_ij,
        l_ij_out=f.l_ij_out,
        l_ij_chunk=f.l_ij_chunk,
        lazy=f.lazy,
        threshold=f.threshold,
        tie=f.tie,
        tie_beta=f.tie_beta,
        tie_tol=f.tie_tol,
        per_step=f.per_step,
        lse=f.lse,
        kv_order=f.kv_order,
        diag_plain=f.diag_plain,
        pv_acc=pl.pv_acc is not None,
        pv_acc_op=_F64_OP if pl.pv_acc is None else _op(OpSpec(pl.pv_acc)),
    )
    if not pl.quantized:
        pp = pl.params(scale)
        f64 = _op(_F64)
        shared: dict[str, Any] = {n: getattr(pp, n) for n in _SHARED}
        return FlashParams(
            **shared,
            **options,
            qk_kind=_qk.DOT_GENERIC,
            pv_kind=_qk.DOT_GENERIC,
            dequant=f64,
            pv_dequant=f64,
            quantized=False,
            scores_dequant=False,
            folded=False,
            delta_mode=_qk.DELTA_NONE,
            p_shift=float(pl.p_offset),  # FA3/4's max offset: P = exp2(x + p_offset)
            v_epilogue=False,
            pv_mode=_qk.PV_INTO_ACC,
            consistent=False,
            p_kind=_qk.K_FLOAT,  # the float plans' P cast: a float code with op p, no scale
            p_pre=False,
            p_pre_op=f64,
            p_arith=f64,
            p_code=pp.p,
            p_qmax=float(2**pl.p_offset),  # the factor the offset puts into l and acc (the traces' unit)
            p_rule=0,
            p_two_level=False,
            p_block=1,
            p_scale_op=f64,
            p_elem_op=f64,
            p_target=1.0,
            p_scale_zero=0.0,
            alpha_raw=pl.alpha_raw,
        )
    qp = pl.quant_params(scale)
    shared = {n: getattr(qp, n) for n in _SHARED}
    quant: dict[str, Any] = {
        n: getattr(qp, n) for n in FlashParams._fields if n in qp._fields and n not in shared and n not in options
    }
    return FlashParams(
        **shared,
        **options,
        **quant,
        quantized=True,
        scores_dequant=not qp.folded,
        v_epilogue=qp.pv_mode in (_qk.PV_INTO_ACC, _qk.PV_TWO_LEVEL),
    )


#: the fields PlanParams and QParams both carry, with the same meaning
_SHARED = (
    "qk",
    "pv",
    "scale",
    "exp",
    "m_i",
    "alpha",
    "l_i",
    "acc",
    "normalize",
    "out",
    "exp2",
    "contract",
    "qk_scale",
    "qk_scale64",
)
