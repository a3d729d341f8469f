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
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

import numpy as np

from simfloat.accumulate import AccParams, BlockFMA, Chunked, Model, Sequential, acc_params, tensor_core
from simfloat.formats import FloatFormat, FormatParams
from simfloat.formats import format as _format
from simfloat.rounding import RoundingMode, mode_code

__all__ = [
    "BACKWARD_OPS",
    "BASELINE_OPS",
    "FLASH_OPS",
    "BackwardPlan",
    "OpSpec",
    "Plan",
    "backward_plan",
    "backward_presets",
    "plan",
    "presets",
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
_BIG_CHUNK = 1 << 40  # one chunk: "accumulate, then round the result once into outer_fmt"


def _checked_format(fmt: object, what: str) -> FloatFormat:
    if not isinstance(fmt, (str, FloatFormat)):
        raise TypeError(f"{what}: expected a format (FloatFormat or name), got {type(fmt).__name__}")
    f = _format(fmt)
    if f.emin - f.mantissa_bits < -1074 or f.emax > 1023:
        raise ValueError(f"{what}: format {f.name} has values outside float64's range")
    return f


def _checked_mode(mode: object, what: str) -> RoundingMode:
    m = mode_code(mode)  # type: ignore[arg-type]  # mode_code raises TypeError for other types
    if m == RoundingMode.STOCHASTIC:
        raise ValueError(f"{what}: stochastic rounding is not supported in attention plans")
    return m


@dataclass(frozen=True)
class OpSpec:
    """One scalar operation: its exact result is rounded once into ``fmt`` with ``mode``.

    Attributes:
        fmt: target format (a :class:`FloatFormat`; names such as ``"bf16"`` are accepted).
        mode: rounding mode (any but stochastic).
    """

    fmt: FloatFormat
    mode: RoundingMode = RoundingMode.NEAREST_EVEN

    if TYPE_CHECKING:  # what the generated __init__ accepts: __post_init__ turns names into the field types

        def __init__(self, fmt: FloatFormat | str, mode: RoundingMode | str | int = RoundingMode.NEAREST_EVEN) -> None:
            pass

    def __post_init__(self) -> None:
        object.__setattr__(self, "fmt", _checked_format(self.fmt, "OpSpec.fmt"))
        object.__setattr__(self, "mode", _checked_mode(self.mode, "OpSpec.mode"))

    def __str__(self) -> str:
        rn = self.mode == RoundingMode.NEAREST_EVEN
        return self.fmt.name + ("" if rn else f"/{self.mode.name.lower()}")


def _scalar_spec(name: str, value: object) -> OpSpec:
    if isinstance(value, OpSpec):
        return value
    if isinstance(value, (str, FloatFormat)):
        return OpSpec(value)
    if isinstance(value, tuple) and len(value) == 2:
        return OpSpec(*value)
    is_model = isinstance(value, (Sequential, BlockFMA, Chunked))
    hint = " (accumulation models are for 'qk' and 'pv')" if is_model else ""
    raise TypeError(f"op {name!r} takes a format, (format, mode) or OpSpec, got {type(value).__name__}{hint}")


def _models(m: Model) -> tuple[Sequential | BlockFMA, ...]:
    return (m.inner,) if isinstance(m, Chunked) else (m,)


def _dot_spec(name: str, value: object) -> Model:
    if isinstance(value, (str, FloatFormat)):
        value = (value, RoundingMode.NEAREST_EVEN)
    if isinstance(value, tuple) and len(value) == 2:
        f = _checked_format(value[0], f"op {name!r}")
        return Sequential(f, _checked_mode(value[1], f"op {name!r}"), product_fmt=f)
    if not isinstance(value, (Sequential, BlockFMA, Chunked)):
        raise TypeError(
            f"op {name!r} takes an accumulation model (Sequential, BlockFMA, Chunked), a format or "
            f"(format, mode), got {type(value).__name__}"
        )
    acc_params(value)  # validates formats and modes
    for inner in _models(value):
        m = inner.mode if isinstance(inner, Sequential) else inner.out_mode
        _checked_mode(m, f"op {name!r}")
    return value


def sum_once(
    fmt: FloatFormat | str, mode: RoundingMode | str = "nearest_even", acc: FloatFormat | str = "float32"
) -> Chunked:
    """The row-sum model "accumulate in ``acc``, round the result once into ``fmt``" (as a torch reduction
    of a low-precision tensor does: float32 partial sums, one cast), for a plan's ``l_ij``.

    Args:
        fmt: the format of the sum's result; mode: its rounding.
        acc: the format of the partial sums (each addition rounded to nearest even into it).

    Returns:
        a :class:`~simfloat.accumulate.Chunked` model with one chunk.
    """
    return Chunked(_BIG_CHUNK, Sequential(acc), outer_fmt=fmt, outer_mode=mode)


def _sum_spec(name: str, value: object) -> Sequential | Chunked:
    """A row-sum model: a format / (format, mode) / OpSpec (sequential: each addition rounded into it), a
    :class:`Sequential` without product or input formats, or a one-level :class:`Chunked` of such a model."""
    if isinstance(value, OpSpec):
        value = (value.fmt, value.mode)
    if isinstance(value, (str, FloatFormat)):
        value = (value, RoundingMode.NEAREST_EVEN)
    if isinstance(value, tuple) and len(value) == 2:
        f = _checked_format(value[0], f"op {name!r}")
        return Sequential(f, _checked_mode(value[1], f"op {name!r}"))
    if isinstance(value, Chunked):
        if value.splits is not None:
            raise ValueError(f"op {name!r}: a row sum takes Chunked(chunk=...), not splits (the tile decides k)")
        inner = _sum_spec(name, value.inner)
        if not isinstance(inner, Sequential):
            raise ValueError(f"op {name!r}: a Chunked row sum takes a Sequential inner model")
        f = _checked_format(value.outer_fmt, f"op {name!r}: outer_fmt")
        m = _checked_mode(value.outer_mode, f"op {name!r}: outer_mode")
        return Chunked(value.chunk, inner, outer_fmt=f, outer_mode=m)
    if isinstance(value, Sequential):
        if value.product_fmt is not None or value.input_fmt is not None:
            raise ValueError(
                f"op {name!r} sums P: its Sequential model takes no product_fmt or input_fmt (each term is added "
                "exactly, then the sum rounded)"
            )
        f = _checked_format(value.fmt, f"op {name!r}")
        return Sequential(f, _checked_mode(value.mode, f"op {name!r}"))
    raise TypeError(
        f"op {name!r} takes a format, (format, mode), OpSpec, Sequential or Chunked (see sum_once), "
        f"got {type(value).__name__}"
    )


class OpParams(NamedTuple):
    """An :class:`OpSpec` for njit code."""

    p: FormatParams
    mode: int


def _op_params(plan: Plan | BackwardPlan, name: str) -> OpParams:
    """Op ``name`` of a forward or backward plan for njit kernels: its format's params and rounding mode."""
    s: OpSpec = getattr(plan, name)
    return OpParams(s.fmt.params, int(s.mode))


def _qk_scale(plan: Plan | BackwardPlan, scale: float) -> tuple[float, float]:
    """(``scale_op(scale)``, the kernels' ``qk_scale``): ``scale_op(scale_op(scale) * scale_op(log2 e))`` with
    ``plan.exp2`` (the Triton kernels' host code, H1), else ``scale_op(scale)``."""
    from simfloat.attention._kernels import mul, rnd

    sc = _op_params(plan, "scale")
    rounded = rnd(float(scale), sc)
    return rounded, (mul(rounded, rnd(math.log2(math.e), sc), sc) if plan.exp2 else rounded)


class PlanParams(NamedTuple):
    """A plan flattened for njit kernels, with the call's scale folded in (see :meth:`Plan.params`)."""

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
    exp_tl: bool = False  # flash exp/alpha without exp2: tl.exp's exp2(op(x * op(log2 e))) (reference engine)
    tie: bool = False  # flash T4: the tied-maxima shift (Plan.tie_shift) is on
    tie_beta: float = 0.0  # its factor, a constant of the m_i format
    tie_tol: float = 0.0  # its tolerance, a constant of the scale op's format


@dataclass(frozen=True)
class Plan:
    """Format and rounding of every operation of the flash and baseline attention kernels.

    Scalar ops hold an :class:`OpSpec`, ``qk``/``pv`` an accumulation model. Construct presets with
    :func:`plan` and derive variants with :meth:`replace`.

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
            ex2.approx.ftz.f32 of :mod:`simfloat.hardware`, then rounded into the op's format), or the name
            of another ex2 table a hardware profile registered (``"table-<sha256 prefix>"``, same model).
        sum_order: flash: order of the row sum l_ij: ``"sequential"`` or ``"h200-mma"`` (the measured
            tl.sum order over a tile in the tensor-core accumulator layout,
            :func:`simfloat.hardware.mma_tree_sum`).
        lazy_threshold: flash: rescale only if ``m_i(m_new - m_old) > lazy_threshold`` (exp/exp2 units of the
            scaled scores; the threshold is rounded into the m_i format); ``None`` always rescales.
        exp_impl: flash without ``exp2``: ``"correctly_rounded"`` (e**x rounded once into the op's format) or
            ``"tl.exp"`` (a kernel calling ``tl.exp``, which Triton lowers to ``ex2(x * log2e)``: the exp and
            alpha ops compute ``op(exp2(op(x * op(log2 e))))``, with ``exp2_impl``'s exp2; the H200's without
            flushing, as ex2.approx.f32). Plans with it run on the reference engine.
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
    exp2_impl: str = "correctly_rounded"
    sum_order: str = "sequential"
    exp_impl: str = "correctly_rounded"
    tie_shift: float | None = None
    tie_tol: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise TypeError(f"Plan.name must be a string, got {type(self.name).__name__}")
        for op in _OPS:
            value = getattr(self, op)
            if op == "l_ij":
                continue
            spec = _dot_spec(op, value) if op in _DOTS else _scalar_spec(op, value)
            object.__setattr__(self, op, spec)
        lij = (self.l_i.fmt, self.l_i.mode) if self.l_ij is None else self.l_ij
        object.__setattr__(self, "l_ij", _sum_spec("l_ij", lij))
        for flag in ("exp2", "contract"):
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
        bare format there means sequential accumulation with products and partial sums rounded into it).

        A plan of a kernel's own preset family (see :meth:`kernels`) takes only what that kernel uses: no
        ``softmax`` on a ``triton-``/``h200-`` plan, none of the flash-only ops (``exp``, ``m_i``, ``alpha``,
        ``l_i``, ``acc``, ``p``, ``normalize``) or flags on a ``pytorch-`` plan; such a change would change
        nothing. ``fp64``, ``all-<fmt>`` and plans with other names serve both kernels and take every entry.

        Raises:
            ValueError: unknown op or flag name (the message lists the valid ones), or an entry the plan's
                kernel never uses (the message lists the kernel's ops).
            TypeError: a value of the wrong type.
        """
        flags = [f.name for f in dataclasses.fields(self) if f.name not in _OPS and f.name != "name"]
        unknown = sorted(set(changes) - set(_OPS) - set(flags) - {"name"})
        if unknown:
            raise ValueError(f"unknown plan entries {unknown}; ops: {', '.join(_OPS)}; flags: {', '.join(flags)}")
        kernels = self.kernels()
        if len(kernels) == 1:
            kernel = kernels[0]
            used = FLASH_OPS + tuple(flags) if kernel == "flash" else BASELINE_OPS
            unused = [c for c in changes if c != "name" and c not in used]
            if unused:
                raise ValueError(
                    f"plan {self.name!r} is for the {kernel} kernel, which never uses "
                    f"{', '.join(map(repr, unused))} (the change would do nothing); the {kernel} kernel's ops: "
                    f"{', '.join(FLASH_OPS if kernel == 'flash' else BASELINE_OPS)}"
                    + (f"; its flags: {', '.join(flags)}" if kernel == "flash" else "; it has no flags")
                )
        if "name" not in changes:
            changes["name"] = self.name if self.name.endswith("*") else self.name + "*"
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]  # checked in __post_init__

    def kernels(self) -> tuple[str, ...]:
        """The kernels this plan is for, by the preset family its name starts with: ``("flash",)`` for
        ``triton-<fmt>``, ``triton-<fmt>@<profile>`` and ``h200-<fmt>`` (the Triton flash kernel),
        ``("baseline",)`` for ``pytorch-<fmt>`` (torch's eager attention), ``("flash", "baseline")`` for
        ``fp64``, ``all-<fmt>`` and any other name. Plans derived with :meth:`replace` keep the name's family,
        and so the kernel."""
        family = self.name.split("-", 1)[0]
        return {"triton": ("flash",), "h200": ("flash",), "pytorch": ("baseline",)}.get(family, ("flash", "baseline"))

    def __repr__(self) -> str:
        return _short_repr(self, _build())

    def __str__(self) -> str:
        ops = ", ".join(f"{op}={getattr(self, op)}" for op in _OPS)
        return (
            f"Plan({self.name}: {ops}; exp2={self.exp2}, contract={self.contract}, "
            f"normalization={self.normalization}, lazy_threshold={self.lazy_threshold}"
            + (f", exp2_impl={self.exp2_impl}" if self.exp2_impl != "correctly_rounded" else "")
            + (f", sum_order={self.sum_order}" if self.sum_order != "sequential" else "")
            + (f", exp_impl={self.exp_impl}" if self.exp_impl != "correctly_rounded" else "")
            + (f", tie_shift={self.tie_shift}, tie_tol={self.tie_tol}" if self.tie_shift is not None else "")
            + ")"
        )

    def params(self, scale: float) -> PlanParams:
        """The plan for njit kernels, with the softmax ``scale`` rounded as the kernels use it.

        flash: ``qk_scale = scale_op(scale_op(scale) * scale_op(log2 e))`` with ``exp2`` (the Triton kernel's
        host code, H1), else ``scale_op(scale)``; baseline: ``scale_op(scale)``.

        Raises:
            ValueError: the rounded scale is not finite and > 0.
        """
        from simfloat.attention._kernels import rnd

        op = functools.partial(_op_params, self)
        sc = op("scale")
        sm_scale, qk_scale = _qk_scale(self, scale)
        qk_scale64 = float(scale) * math.log2(math.e) if self.exp2 else float(scale)
        for v in (sm_scale, qk_scale):
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"scale {scale} becomes {v} in {self.scale.fmt.name}: it must stay finite and > 0")
        t = self.lazy_threshold
        threshold = 0.0 if t is None else rnd(t, op("m_i"))  # a constant of the m_i format, as in the kernel
        tie = self.tie_shift is not None
        tie_beta = rnd(self.tie_shift, op("m_i")) if self.tie_shift is not None else 0.0
        tie_tol = rnd(self.tie_tol, sc)
        if tie and not tie_beta > 1:
            raise ValueError(f"Plan.tie_shift={self.tie_shift} rounds to {tie_beta} in {self.m_i.fmt.name}: not > 1")
        return PlanParams(  # type: ignore[call-arg]  # mypy cannot count the * spread
            acc_params(self.qk),
            acc_params(self.pv),
            *(op(n) for n in _OPS if n not in _MODELS),  # type: ignore[arg-type]  # mypy cannot count the * spread
            self.exp2,
            self.contract,
            self.normalization == "per_step",
            t is not None,
            threshold,
            qk_scale,
            qk_scale64,
            sm_scale,
            _ex2_tab(self.exp2_impl),
            SUM_ORDERS.index(self.sum_order),
            *self._l_ij_params(),
            self.exp_impl == "tl.exp",
            tie,
            tie_beta,
            tie_tol,
        )

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


def _ex2_tab(impl: str) -> np.ndarray:
    if impl == "correctly_rounded":
        return _NO_TABLE
    from simfloat.hardware import ex2_table

    return ex2_table(impl)


def _check_exp2_impl(impl: object, what: str) -> None:
    """EXP2_IMPLS, or the name of an ex2 table registered by a hardware profile (simfloat.hardware)."""
    from simfloat.hardware import ex2_table_names

    if impl not in EXP2_IMPLS and impl not in ex2_table_names():
        known = EXP2_IMPLS + tuple(n for n in ex2_table_names() if n not in EXP2_IMPLS)
        raise ValueError(f"{what} must be one of {known} (tables of loaded hardware profiles), got {impl!r}")


def _uniform(name: str, fmt: str, dot: Model) -> Plan:
    return Plan(name, dot, *([fmt] * 7), dot, fmt, fmt, fmt)  # type: ignore[arg-type, call-arg]  # names -> OpSpecs in __post_init__; * spread


def _triton(fmt: str) -> Plan:
    f = _format(fmt).name
    # fp32 inputs: "ieee" dots (an FMA loop); tf32: fp32 inputs with tf32 tensor cores (Triton's default)
    dot = Sequential("float32") if fmt == "fp32" else tensor_core("sm90", f)
    wide = fmt in ("fp32", "tf32")
    io = "float32" if wide else f
    return Plan(f"triton-{fmt}", dot, *(["float32"] * 6), io, dot, "float32", io, "float32", exp2=True, contract=True)  # type: ignore[arg-type, call-arg, misc]  # names -> OpSpecs in __post_init__; * spread


def _pytorch(fmt: str) -> Plan:
    f = _format(fmt).name
    if fmt == "fp32":
        qk: Model = Sequential("float32")
        pv: Model = Sequential("float32")
    else:  # fp32 accumulation from 0, the result rounded once into fmt; P read as fmt
        qk = Chunked(_BIG_CHUNK, Sequential("float32"), outer_fmt=f)
        pv = Chunked(_BIG_CHUNK, Sequential("float32", input_fmt=f), outer_fmt=f)
    return Plan(f"pytorch-{fmt}", qk, f, *(["float32"] * 5), f, pv, "float32", f, "float32")  # type: ignore[arg-type, call-arg]  # names -> OpSpecs in __post_init__; * spread


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
    # (fitted from tests/fixtures/gpu/h200/probes; README "GPU validation (H200)"), under its historic name
    return dataclasses.replace(_with_hardware(_triton(fmt), fmt, "h200"), name=f"h200-{fmt}")


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
    return out


def presets() -> dict[str, Plan]:
    """All preset plans by name (see :func:`plan`)."""
    return dict(_build())


def plan(name: str | Plan, hardware: object = None) -> Plan:
    """A preset precision plan (a :class:`Plan` is returned unchanged).

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
        ``pytorch-<fmt>`` (baseline): each matmul accumulated in fp32 from zero and rounded once into <fmt>,
            scale in <fmt>, softmax in fp32, P read by the P.V matmul as <fmt>, output <fmt>.
        fmt is one of bf16, fp16, fp32, tf32, e4m3, e5m2 (pytorch: bf16, fp16, fp32).

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


def _short_repr(p: Plan | BackwardPlan, table: dict[str, Any]) -> str:
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
    if hardware is not None and not (isinstance(name, str) and name.startswith("triton-")):
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


# -- backward ------------------------------------------------------------------------------------------------

BACKWARD_OPS = (
    "delta",
    "lse",
    "qk",
    "scale",
    "exp",
    "p",
    "dv",
    "dp",
    "ds",
    "ds_cast",
    "dk",
    "dq",
    "grad_scale",
    "grad",
    "softmax",
)
_BWD_DOTS = ("qk", "dv", "dp", "dk", "dq")
#: the ops :func:`simfloat.attention.flash_backward` uses (``softmax`` is baseline_backward's only)
FLASH_BACKWARD_OPS = BACKWARD_OPS[:-1]
#: the ops :func:`simfloat.attention.baseline_backward` uses
BASELINE_BACKWARD_OPS = (
    "delta",
    "qk",
    "scale",
    "softmax",
    "p",
    "dv",
    "dp",
    "ds",
    "ds_cast",
    "dk",
    "dq",
    "grad_scale",
    "grad",
)


class BackwardParams(NamedTuple):
    """A backward plan flattened for njit kernels (see :meth:`BackwardPlan.params`)."""

    qk: AccParams
    dv: AccParams
    dp: AccParams
    dk: AccParams
    dq: AccParams
    delta: OpParams
    lse: OpParams
    scale: OpParams
    exp: OpParams
    p: OpParams
    ds: OpParams
    ds_cast: OpParams
    grad_scale: OpParams
    grad: OpParams
    softmax: OpParams
    exp2: bool
    contract: bool
    qk_scale: float  # the scale as P's recomputation uses it (log2(e) folded in with exp2), a scale-op value
    sm_scale: float  # the scale rounded into the grad_scale op's format (dK, dQ epilogues)
    ex2_tab: np.ndarray  # empty = correctly rounded exp2, else simfloat.hardware.ex2_table()


@dataclass(frozen=True)
class BackwardPlan:
    """Format and rounding of every operation of the attention backward pass
    (``simfloat_gpu/kernels/flash_attention_bwd.py``).

    Dots (``qk dv dp dk dq``) hold accumulation models, the others an :class:`OpSpec`. Build presets with
    :func:`backward_plan` and variants with :meth:`replace`.

    Attributes:
        name: label.
        delta: ``rowsum(dO * O)``: each product and each partial sum (sequential) rounded into it (D2).
        lse: the log-sum-exp ``m + log(l)`` (log2 units with ``exp2``): the log and the add (D3).
        qk: score dot q.k (from 0; B2). scale: ``fma(qk, qk_scale, -lse)`` (one rounding with ``contract``,
            else the multiply and the subtraction each) and the host's qk_scale (B4).
        exp: exp2 (or exp) of the shifted scores, P (B4). p: cast of P before the dV dot (B5).
        dv: ``dV += P^T dO`` (B5). dp: ``dP = dO V^T`` (from 0; B6).
        ds: ``P * (dP - delta)``: the subtraction and the multiply (B7). ds_cast: cast of dS before the dK and
            dQ dots (B8).
        dk: ``dK += dS^T Q`` (B9). dq: ``dQ += dS K`` (Q4).
        grad_scale: the softmax scale and the epilogue multiplies ``dK * scale``, ``dQ * scale`` (E1, E3).
        grad: cast of dQ, dK, dV on store (E2, E3).
        softmax: baseline_backward only: the format of the forward softmax it recomputes.
        exp2: exp2 with log2(e) folded into the scale (the Triton kernel), else exp.
        contract: the B4 shift as one fused rounding.
        exp2_impl: ``"correctly_rounded"`` or ``"h200"`` (the measured ex2.approx.ftz.f32, see :class:`Plan`).
        opmath: baseline_backward only: ``None``, or the format torch's eager element-wise kernels compute in
            (their "opmath" type, float32 for bf16/fp16 tensors): the softmax scale multiplies (``scale``,
            ``grad_scale``) then take the Python-float scale rounded into it, round the product into it and
            that into the op's format, as ``tensor * scale`` does. ``None``: the scale rounded into the op's
            format and the product rounded once. The ``pytorch-<fmt>`` presets set float32.
    """

    name: str
    delta: OpSpec
    lse: OpSpec
    qk: Model
    scale: OpSpec
    exp: OpSpec
    p: OpSpec
    dv: Model
    dp: Model
    ds: OpSpec
    ds_cast: OpSpec
    dk: Model
    dq: Model
    grad_scale: OpSpec
    grad: OpSpec
    softmax: OpSpec
    exp2: bool = False
    contract: bool = False
    exp2_impl: str = "correctly_rounded"
    opmath: FloatFormat | None = None

    def __post_init__(self) -> None:
        if self.opmath is not None:
            object.__setattr__(self, "opmath", _checked_format(self.opmath, "BackwardPlan.opmath"))
        if not isinstance(self.name, str):
            raise TypeError(f"BackwardPlan.name must be a string, got {type(self.name).__name__}")
        for op in BACKWARD_OPS:
            value = getattr(self, op)
            spec = _dot_spec(op, value) if op in _BWD_DOTS else _scalar_spec(op, value)
            object.__setattr__(self, op, spec)
        for flag in ("exp2", "contract"):
            if not isinstance(getattr(self, flag), bool):
                raise TypeError(f"BackwardPlan.{flag} must be a bool, got {type(getattr(self, flag)).__name__}")
        _check_exp2_impl(self.exp2_impl, "BackwardPlan.exp2_impl")

    def replace(self, **changes: object) -> BackwardPlan:
        """A copy with some ops or flags changed (values as for the constructor).

        Raises:
            ValueError: an unknown op or flag (the message lists the valid ones).
            TypeError: a value of the wrong type.
        """
        flags = ("exp2", "contract", "exp2_impl", "opmath")
        unknown = sorted(set(changes) - set(BACKWARD_OPS) - set(flags) - {"name"})
        if unknown:
            raise ValueError(
                f"unknown backward plan entries {unknown}; ops: {', '.join(BACKWARD_OPS)}; flags: {', '.join(flags)}"
            )
        if "name" not in changes:
            changes["name"] = self.name if self.name.endswith("*") else self.name + "*"
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]  # checked in __post_init__

    def __repr__(self) -> str:
        return _short_repr(self, _build_backward())

    def __str__(self) -> str:
        ops = ", ".join(f"{op}={getattr(self, op)}" for op in BACKWARD_OPS)
        return (
            f"BackwardPlan({self.name}: {ops}; exp2={self.exp2}, contract={self.contract}"
            + (f", exp2_impl={self.exp2_impl}" if self.exp2_impl != "correctly_rounded" else "")
            + (f", opmath={self.opmath.name}" if self.opmath is not None else "")
            + ")"
        )

    def params(self, scale: float) -> BackwardParams:
        """The plan for njit kernels, with the softmax ``scale`` rounded as the kernels use it:
        ``qk_scale = scale_op(scale_op(scale) * scale_op(log2 e))`` with ``exp2``, else ``scale_op(scale)``;
        ``sm_scale = grad_scale_op(scale)``.

        Raises:
            ValueError: a rounded scale is not finite and > 0.
        """
        from simfloat.attention._kernels import rnd

        op = functools.partial(_op_params, self)
        qk_scale = _qk_scale(self, scale)[1]
        sm_scale = rnd(float(scale), op("grad_scale"))
        for v in (qk_scale, sm_scale):
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"scale {scale} becomes {v} in the plan's formats: it must stay finite and > 0")
        return BackwardParams(  # type: ignore[call-arg]  # mypy cannot count the * spread
            *(acc_params(getattr(self, d)) for d in _BWD_DOTS),  # type: ignore[arg-type]  # mypy cannot count the * spread
            *(op(n) for n in BACKWARD_OPS if n not in _BWD_DOTS),
            self.exp2,
            self.contract,
            qk_scale,
            sm_scale,
            _ex2_tab(self.exp2_impl),
        )


def _bwd_uniform(name: str, fmt: str, dot: Model) -> BackwardPlan:
    return BackwardPlan(name, fmt, fmt, dot, fmt, fmt, fmt, dot, dot, fmt, fmt, dot, dot, fmt, fmt, fmt)  # type: ignore[arg-type]  # names -> OpSpecs in __post_init__


def _bwd_triton(fmt: str) -> BackwardPlan:
    f = _format(fmt).name
    dot = Sequential("float32") if fmt == "fp32" else tensor_core("sm90", f)
    io: Any = "float32" if fmt in ("fp32", "tf32") else f  # format names: OpSpecs after __post_init__
    fp32: Any = "float32"
    return BackwardPlan(
        f"triton-{fmt}",
        fp32,
        fp32,
        dot,
        fp32,
        fp32,
        io,
        dot,
        dot,
        fp32,
        io,
        dot,
        dot,
        fp32,
        io,
        fp32,
        exp2=True,
        contract=True,
    )


def _bwd_with_hardware(base: BackwardPlan, fmt: str, hardware: object) -> BackwardPlan:
    """The backward triton-<fmt> with a hardware profile's models, as the forward's (:func:`_with_hardware`):
    the profile's tensor-core model for every dot (B2, B5, B6, B9, Q4) and its exp2 (B4). The B4 shift stays
    fused whatever the profile's contraction fact: the kernel calls ``tl.fma`` itself; the backward has no
    tl.sum of the mma layout (D2 sums a blocked layout, sequential here)."""
    from simfloat.profiles import load_profile, register_profile

    prof = register_profile(load_profile(hardware))  # type: ignore[arg-type]
    changes: dict[str, object] = {"name": f"{base.name}@{prof.name}", "exp2_impl": prof.exp2_impl()}
    model = _profile_dot(prof, fmt)
    if model is not None:
        changes.update(dict.fromkeys(_BWD_DOTS, model))
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def _bwd_h200(fmt: str) -> BackwardPlan:
    # the backward triton-<fmt> on an H200, from the shipped profile as the forward's h200-<fmt>
    return dataclasses.replace(_bwd_with_hardware(_bwd_triton(fmt), fmt, "h200"), name=f"h200-{fmt}")


def _bwd_pytorch(fmt: str) -> BackwardPlan:
    # torch's eager autograd of softmax(scale * q k^T) v in <fmt>: every matmul accumulated in fp32 from zero and
    # rounded once into <fmt>; the scale multiply in <fmt>; softmax and its backward (the row sum of dP * P, then
    # P * (dP - sum)) in fp32, stored in <fmt>
    f = _format(fmt).name
    if fmt == "fp32":
        dot: Model = Sequential("float32")
    else:
        dot = Chunked(_BIG_CHUNK, Sequential("float32"), outer_fmt=f)
    fp32 = "float32"
    # the Python-float scale multiplies in float32 (torch's opmath), the product then rounded into <fmt>
    ops = (fp32, fp32, dot, f, fp32, f, dot, dot, fp32, f, dot, dot, f, f, fp32)
    return BackwardPlan(f"pytorch-{fmt}", *ops, opmath=fp32)  # type: ignore[arg-type]  # names -> OpSpecs, formats in __post_init__


@functools.cache
def _build_backward() -> dict[str, BackwardPlan]:
    out = {"fp64": _bwd_uniform("fp64", "float64", Sequential("float64", product_fmt="float64"))}
    for fmt in ("bf16", "fp16", "fp32", "tf32", "e4m3", "e5m2"):
        f = _format(fmt).name
        out[f"all-{fmt}"] = _bwd_uniform(f"all-{fmt}", f, Sequential(f, product_fmt=f))
    for fmt in ("bf16", "fp16", "fp32", "tf32"):
        out[f"triton-{fmt}"] = _bwd_triton(fmt)
    for fmt in ("bf16", "fp16", "tf32"):
        out[f"h200-{fmt}"] = _bwd_h200(fmt)
    for fmt in ("bf16", "fp16", "fp32"):
        out[f"pytorch-{fmt}"] = _bwd_pytorch(fmt)
    return out


def backward_presets() -> dict[str, BackwardPlan]:
    """All preset backward plans by name (see :func:`backward_plan`)."""
    return dict(_build_backward())


def backward_plan(name: str | BackwardPlan, hardware: object = None) -> BackwardPlan:
    """A preset backward precision plan (a :class:`BackwardPlan` is returned unchanged).

    With ``hardware`` (a profile, a shipped profile's name such as ``"h200"`` or a profile file, as for
    :func:`plan`), a ``triton-<fmt>`` preset becomes ``triton-<fmt>@<profile name>``: the profile's tensor-core
    model for every dot and its exp2 (a part the profile lacks keeps the default); the name parses back
    (``backward_plan("triton-bf16@h200")``). ``backward_plan("h200-bf16")`` is ``backward_plan("triton-bf16@h200")``
    under its historic name (every other field equal).

    Presets (the names of the forward's, :func:`plan`):
        ``fp64``: every op float64 (golden). ``all-<fmt>``: every op in <fmt>, sequential dots with rounded
        products, exp (not exp2), no contraction.
        ``triton-<fmt>``: ``simfloat_gpu/kernels/flash_attention_bwd.py``: sm90 tensor-core dots (``triton-fp32``: FMA
        loops),
        exp2 with an fp32 qk_scale, the B4 shift fused, fp32 delta/lse/P/dS arithmetic, P and dS cast to <fmt>,
        gradients stored in <fmt>. ``h200-<fmt>``: with the shipped H200 profile (its measured exp2).
        ``pytorch-<fmt>``: torch's eager autograd (:func:`simfloat.attention.baseline_backward`).

    Raises:
        ValueError: unknown name (the message lists the presets); ``hardware`` with a plan other than a
            ``triton-<fmt>`` preset, or a profile a plan cannot use; a ``@<profile>`` that is no shipped, loaded
            or file profile.
        TypeError: ``name`` is neither a string nor a BackwardPlan.
    """
    return _preset(
        name,
        hardware,
        BackwardPlan,
        backward_presets,
        _bwd_with_hardware,
        ("backward plan", "backward_plan", "the Triton kernels"),
    )
