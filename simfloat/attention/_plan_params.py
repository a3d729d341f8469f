"""A plan's vocabulary (its op names and the values of its options) and its lowering for the compiled kernels:
:class:`PlanParams` (the float plans' scalar ops and flags, with the call's scale folded in) and :class:`Features`
(the optional steps of the flash dataflow that every plan has, with or without quantizers).

The functions take any plan (a :class:`~simfloat.attention.Plan`, and the backward plans for :func:`op_params`,
:func:`qk_scale`, :func:`ex2_tab`); :class:`~simfloat.attention.Plan`'s ``params`` and ``_features`` call them.
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import numpy as np

from simfloat.accumulate import AccParams, Chunked, Sequential, acc_params
from simfloat.attention._kernels import host_mul, host_rnd
from simfloat.attention._specs import OpParams, OpSpec
from simfloat.formats import format as _format
from simfloat.hardware import SUM_RULES, Ex2Table, ex2_table, ex2_table_names, ex2_table_value, h200_ex2
from simfloat.rounding import mode_code

FLASH_OPS = ("qk", "scale", "exp", "m_i", "alpha", "l_ij", "l_i", "acc", "p", "pv", "normalize", "out")
BASELINE_OPS = ("qk", "scale", "softmax", "pv", "out")
PLAN_OPS = FLASH_OPS + ("softmax",)
DOT_OPS = ("qk", "pv")
MODEL_OPS = DOT_OPS + ("l_ij",)  # ops that take a model rather than an OpSpec
EXP2_IMPLS = ("correctly_rounded", "h200")  # h200: simfloat.hardware.ex2_approx_f32 (ex2.approx.ftz.f32)
EXP_IMPLS = ("correctly_rounded", "tl.exp")  # tl.exp: exp2(op(x * op(log2 e))), as Triton lowers tl.exp
SUM_ORDERS = SUM_RULES  # Plan.sum_order by its rule (simfloat.hardware.SumOrder); h200-mma: mma_tree_sum
#: Plan.state: the running state's form, (m_i, l_i) or a log-sum-exp (the flash-attention repository's Triton kernel)
STATE_FORMS = ("m_l", "lse")
#: Plan.kv_order: the order a q tile walks its key tiles
KV_ORDERS = ("forward", "reverse", "diagonal_first")
#: Plan.kernel: the kernel a plan is for ("any": flash and baseline)
KERNELS = ("flash", "baseline", "any")
#: Plan.gpu_kernel: the GPU kernel a plan models (None: no one kernel)
GPU_KERNELS = ("triton", "triton-tutorial", "flashattn-triton", "fa3", "fa4", "pytorch")
#: Plan.input_format: the format a plan's kernel reads q, k, v (and dO) in (None: any input)
INPUT_FORMATS = ("bf16", "fp16", "fp32", "e4m3", "e5m2")


def op_params(plan: Any, name: str) -> OpParams:
    """Op ``name`` of a forward or backward plan for the compiled kernels: its format's params and rounding mode."""
    s: OpSpec = getattr(plan, name)
    return OpParams(s.fmt.params, int(s.mode))


def qk_scale(plan: Any, scale: float) -> tuple[float, float]:
    """(``scale_op(scale)``, the kernels' ``qk_scale``): ``scale_op(scale_op(scale) * scale_op(log2 e))`` with
    ``plan.exp2`` (the Triton kernels' host code, H1), else ``scale_op(scale)``."""
    sc = op_params(plan, "scale")
    rounded = host_rnd(float(scale), sc)
    return rounded, (host_mul(rounded, host_rnd(math.log2(math.e), sc), sc) if plan.exp2 else rounded)


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


def plan_params(pl: Any, scale: float) -> PlanParams:
    """The plan for the compiled kernels, with the softmax ``scale`` rounded as the kernels use it.

    flash: ``qk_scale = scale_op(scale_op(scale) * scale_op(log2 e))`` with ``exp2`` (the Triton kernel's
    host code, H1), else ``scale_op(scale)``; baseline: ``scale_op(scale)``.

    Raises:
        ValueError: the rounded scale is not finite and > 0.
    """
    if pl.quantized:
        raise ValueError(f"plan {pl.name!r} has quantizers: its kernel parameters are quant_params()")
    op = functools.partial(op_params, pl)
    sm_scale, qks = qk_scale(pl, scale)
    om = _F32_NE if pl.opmath is None else OpParams(pl.opmath.params, 0)
    if pl.opmath is not None:  # torch: the Python float scale in the opmath type
        sm_scale = host_rnd(float(scale), om)
    qk_scale64 = float(scale) * math.log2(math.e) if pl.exp2 else float(scale)
    for v in (sm_scale, qks):
        if not (math.isfinite(v) and v > 0):
            raise ValueError(f"scale {scale} becomes {v} in {pl.scale.fmt.name}: it must stay finite and > 0")
    f = features(pl)
    return PlanParams(  # type: ignore[call-arg]  # mypy cannot count the * spread
        acc_params(pl.qk),
        acc_params(pl.pv),
        *(op(n) for n in PLAN_OPS if n not in MODEL_OPS),  # type: ignore[arg-type]  # mypy cannot count the * spread
        pl.exp2,
        pl.contract,
        f.per_step,
        f.lazy,
        f.threshold,
        qks,
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
        pl.opmath is not None,
        om,
    )


def features(pl: Any) -> Features:
    """The float dataflow's optional steps (hardware models, lazy rescaling, tie shift, FA1, the l_ij model)
    for the compiled kernels; a plan with quantizers has them too (each at its plan's value).

    Raises:
        ValueError: tie_shift rounds to 1 or less in the m_i format.
    """
    m_i = op_params(pl, "m_i")
    t = pl.lazy_threshold
    threshold = 0.0 if t is None else host_rnd(t, m_i)  # a constant of the m_i format, as in the kernel
    tie = pl.tie_shift is not None
    tie_beta = host_rnd(pl.tie_shift, m_i) if pl.tie_shift is not None else 0.0
    tie_tol = host_rnd(pl.tie_tol, op_params(pl, "scale"))
    if tie and not tie_beta > 1:
        raise ValueError(f"Plan.tie_shift={pl.tie_shift} rounds to {tie_beta} in {pl.m_i.fmt.name}: not > 1")
    return Features(
        pl.normalization == "per_step",
        t is not None,
        threshold,
        ex2_tab(pl.exp2_impl),
        pl.sum_order.code,
        *l_ij_params(pl),
        pl.exp_impl == "tl.exp",
        tie,
        tie_beta,
        tie_tol,
        pl.state == "lse",
        KV_ORDERS.index(pl.kv_order),
        pl.contract and not pl.contract_diagonal,
    )


def l_ij_params(pl: Any) -> tuple[OpParams, OpParams, int]:
    m = pl.l_ij
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


def ex2_tab(impl: str | Ex2Table) -> np.ndarray:
    if isinstance(impl, Ex2Table):
        return impl.table
    if impl == "correctly_rounded":
        return _NO_TABLE
    return ex2_table(impl)


def ex2_value(impl: str | Ex2Table) -> str | Ex2Table:
    """A checked ``exp2_impl`` (:func:`check_exp2_impl`) as a plan carries it: ``"correctly_rounded"`` as it is,
    a table's name (``"h200"``, a registered one) as the table's value (:class:`simfloat.hardware.Ex2Table`)."""
    if isinstance(impl, Ex2Table) or impl == "correctly_rounded":
        return impl
    return h200_ex2() if impl == "h200" else ex2_table_value(ex2_table(impl))


def check_kernel_fields(p: Any, what: str) -> None:
    """The fields that say which GPU kernel a plan models, a forward or a backward one's (``what``: its type's
    name): ``gpu_kernel`` (None or one of :data:`GPU_KERNELS`), ``profile`` (None or a profile's name) and
    ``input_format`` (None or one of :data:`INPUT_FORMATS`)."""
    for field in ("gpu_kernel", "profile", "input_format"):
        v = getattr(p, field)
        if v is not None and not isinstance(v, str):
            raise TypeError(f"{what}.{field} must be None or a string, got {type(v).__name__}")
    if p.gpu_kernel is not None and p.gpu_kernel not in GPU_KERNELS:
        raise ValueError(f"{what}.gpu_kernel must be None or one of {GPU_KERNELS}, got {p.gpu_kernel!r}")
    if p.input_format is not None and p.input_format not in INPUT_FORMATS:
        raise ValueError(f"{what}.input_format must be None or one of {INPUT_FORMATS}, got {p.input_format!r}")


def check_pv_acc(p: Any) -> None:
    """``Plan.pv_acc``: None or a format (made a :class:`~simfloat.formats.FloatFormat`), on a flash plan whose
    acc op rounds into it, with the ``into_acc`` P.V form and deferred normalization.

    Raises:
        ValueError: an unknown format or a plan the field has no form for (the message names it).
    """
    if p.pv_acc is None:
        return
    fmt = _format(p.pv_acc)
    object.__setattr__(p, "pv_acc", fmt)
    what = f"Plan.pv_acc={fmt.name!r} (the P.V accumulator's format)"
    if p.kernel == "baseline":
        raise ValueError(f"{what} belongs to the flash kernel, not kernel='baseline'")
    if p.acc.fmt != fmt:
        raise ValueError(
            f"{what}: the acc op rescales that accumulator and must round into the same format, got "
            f"acc={p.acc.fmt.name!r}; set acc={fmt.name!r} too (or pv_acc=None)"
        )
    if p.normalization != "deferred":
        raise ValueError(f"{what} has no form with normalization={p.normalization!r}; use 'deferred'")
    if p.pv_update is not None and p.pv_update != "into_acc":
        raise ValueError(
            f"{what} is the accumulator an into_acc P.V adds into; pv_update={p.pv_update!r} keeps its own "
            "(a fresh P.V per tile is held in the pv MMA's output format): set pv_update='into_acc' or pv_acc=None"
        )


def check_exp2_impl(impl: object, what: str) -> None:
    """EXP2_IMPLS, an ex2 table as a value (:class:`simfloat.hardware.Ex2Table`, what a hardware profile's plan
    carries) or the name of a table registered with :func:`simfloat.hardware.register_ex2_table`."""
    if isinstance(impl, Ex2Table):
        return
    if impl not in EXP2_IMPLS and impl not in ex2_table_names():
        known = EXP2_IMPLS + tuple(n for n in ex2_table_names() if n not in EXP2_IMPLS)
        raise ValueError(
            f"{what} must be one of {known} (registered tables) or a simfloat.hardware.Ex2Table, got {impl!r}"
        )
