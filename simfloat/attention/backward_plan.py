"""Backward precision plans: :class:`BackwardPlan` (the format and rounding of every operation of the attention
backward pass), its presets (:func:`backward_presets`, :func:`backward_plan`, the names of the forward's) and its
flattening for the compiled kernels (:class:`BackwardParams`). Resolution, reprs and the hardware profiles' models are
the forward plans' (:mod:`simfloat.attention.plan`)."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from simfloat.accumulate import AccParams, Chunked, Model, Sequential, acc_params, tensor_core
from simfloat.attention._dash import DASH_ORDERS, is_dash
from simfloat.attention._plan_params import check_exp2_impl, check_kernel_fields, ex2_tab, ex2_value
from simfloat.attention._presets import inputs_of
from simfloat.attention._specs import _BIG_CHUNK, OpParams, OpSpec, _checked_format, _dot_spec, _scalar_spec
from simfloat.attention.plan import (
    EXP_IMPLS,
    _op_params,
    _preset,
    _profile_dot,
    _qk_scale,
    _short_repr,
)
from simfloat.formats import FloatFormat
from simfloat.formats import format as _format
from simfloat.hardware import Ex2Table

__all__ = [
    "BACKWARD_OPS",
    "DQ_ACCUMULATIONS",
    "DQ_ORDERS",
    "SCALE_AT",
    "BASELINE_BACKWARD_OPS",
    "FLASH_BACKWARD_OPS",
    "BackwardParams",
    "BackwardPlan",
    "backward_plan",
    "backward_presets",
]

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
#: how Q4 accumulates dQ over the key tiles (:attr:`BackwardPlan.dq_accumulation`)
DQ_ACCUMULATIONS = ("in_mma", "atomic")
#: the named orders of the key tiles' dQ contributions (:attr:`BackwardPlan.dq_order`)
DQ_ORDERS = ("forward", "reverse", "diagonal_first", "seeded", *DASH_ORDERS)
#: an explicit order: a permutation of the key tiles, or ``f(q_tile, n_tiles)`` returning one per query tile
DqOrder = str | tuple[int, ...] | Callable[[int, int], Sequence[int]]
#: where the softmax scale enters the backward (:attr:`BackwardPlan.scale_at`)
SCALE_AT = ("scores", "ds", "k")
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
    """A backward plan flattened for the compiled kernels (see :meth:`BackwardPlan.params`)."""

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
    atomic: bool  # Q4 by per-key-tile contributions added into dq_atomic (else the accumulator enters the MMA)
    dq_atomic: OpParams  # the atomic adds' format and rounding
    scale_ds: bool  # B7': dS multiplied by sm_scale in the ds op before B8's cast (no E1/E3 multiply)
    dq_scale: float  # E3's multiplier of dQ (sm_scale; ln 2 rounded into grad_scale with scale_at="k")
    exp_tl: bool  # B4 without exp2: tl.exp, exp(op(x * op(log2 e))) as Triton lowers it


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
        exp2_impl: ``"correctly_rounded"``, or an ex2.approx table as a value (:class:`simfloat.hardware.Ex2Table`;
            a registered table's name such as ``"h200"``, the measured ex2.approx.ftz.f32, becomes its value), as
            :attr:`~simfloat.attention.Plan.exp2_impl`.
        dq_accumulation: Q4's dataflow. ``"in_mma"`` (default; the Triton kernel's dQ pass): ``dq_i =
            dq(dq_i + sum_j ds_ij k_j)`` per key tile, the accumulator entering each tile's MMA. ``"atomic"``
            (FlashAttention-2/3's CUDA backward): each key tile's contribution ``c_t = dq(sum_j ds_ij k_j)`` an
            MMA from zero, added into a global accumulator, ``dq_i = dq_atomic(dq_i + c_t)`` (atomicAdd), the
            key tiles in the order ``dq_order`` gives; the epilogue E3 as before.
        dq_order: the order in which a dQ query tile walks its key tiles (Q4; with ``"atomic"``, the order of
            their adds): ``"forward"`` (increasing key tile: the default, and FA2/3's ``deterministic=True``),
            ``"reverse"``, ``"diagonal_first"`` (causal: the key tiles some row of the query tile masks in part,
            in increasing order, then the rest from tile 0, as the Triton tutorial's dQ kernel; without
            ``causal`` as forward; under a mask the diagonal is shifted by ``causal_align`` and a window's right
            bound, ``(t * block_m2 + off + right + 1) // block_n2``, a dense mask or key padding has none),
            ``"seeded"`` (``"atomic"`` only: a random
            permutation per (lead, query tile) drawn from ``flash_backward``'s ``seed``: the arrival order of
            the thread blocks, which differs from run to run on a GPU), a tuple (a permutation of the key tiles
            ``0..n-1``, the same for every query tile; a causal query tile sees a prefix of the key tiles and
            takes them in the tuple's relative order) or a callable ``f(q_tile, n_tiles)`` returning a
            permutation of ``range(n_tiles)`` (the key tiles that query tile sees): any deterministic schedule.
            DASH's schedules of FA3's deterministic backward (arXiv 2601.21824, its released code;
            :mod:`simfloat.attention._dash`): ``"dash_descending"`` (Descending Q-Tile Iteration: the same adds
            in the same order as ``"forward"``) and ``"dash_shift"`` (Shift Scheduling on 132 SMs, the released
            code's count; ``"dash_shift:<sms>"`` another): the order depends on the lead index, the key tiles
            and the SM count; causal needs seq_q == seq_k, block_n2 a multiple of block_m2 and an even number of
            key tiles; no attn_mask or window.
            The tiles are the dQ kernel's (``flash_backward``'s ``block_m2``, ``block_n2``).
        dq_atomic: the format and rounding of the atomic adds (default float32, round to nearest: atomicAdd on
            an fp32 buffer).
        scale_at: where the softmax scale enters: ``"scores"`` (default: B4's ``fma(s, qk_scale, -lse)``, then
            E1/E3 ``dK * scale``, ``dQ * scale``); ``"ds"`` (the flash-attention repository's Triton backward:
            B7' ``ds = ds(ds * scale)`` before B8's cast, no E1/E3 multiply); ``"k"`` (the Triton tutorial: the
            host pre-scales K, ``k' = k_scaled(opmath(k * opmath(scale / ln 2)))`` (the product rounded once
            into k_scaled without ``opmath``), B2 and Q4 read k', B4 is ``scale(s - lse)``, E1 ``dK * scale``,
            E3 ``dQ * grad_scale(ln 2)``; needs ``exp2``).
        k_scaled: the format of the pre-scaled K (``scale_at="k"``; default float16, the tutorial's).
        exp_impl: B4 without ``exp2``: ``"correctly_rounded"`` (e**x rounded once into the exp op) or
            ``"tl.exp"`` (Triton's lowering: ``exp(exp2(exp(x * exp(log2 e))))``, the exp2 as ``exp2_impl``), as
            the forward's :attr:`~simfloat.attention.Plan.exp_impl`.
        opmath: baseline_backward, and flash_backward's K pre-scale (``scale_at="k"``): ``None``, or the
            format torch's eager element-wise kernels compute in (their "opmath" type, float32 for bf16/fp16
            tensors): the softmax scale multiplies (``scale``, ``grad_scale``; the K pre-scale) then take the
            Python-float scale rounded into it, round the product into it and that into the op's format, as
            ``tensor * scale`` does. ``None``: the scale rounded into the op's format and the product rounded
            once. The ``pytorch-<fmt>`` presets set float32.
        gpu_kernel: the GPU kernel the plan models, a field rather than a name prefix, as
            :attr:`~simfloat.attention.Plan.gpu_kernel`: ``"triton"`` (``triton-<fmt>``, ``triton-<fmt>@<profile>``,
            ``h200-<fmt>``), ``"triton-tutorial"``, ``"flashattn-triton"``, ``"pytorch"`` (torch's eager
            autograd), or ``None`` (``fp64``, ``all-<fmt>``, a BackwardPlan constructed without it). A hardware
            profile applies to the ``"triton"`` plans without one.
        profile: the name of the hardware profile whose models the plan carries (``h200-<fmt>``: ``"h200"``), or
            ``None``.
        input_format: the format the kernel reads q, k, v and dO in, as :attr:`~simfloat.attention.Plan.input_format`
            (the same presets set it).
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
    exp2_impl: str | Ex2Table = "correctly_rounded"
    opmath: FloatFormat | None = None
    dq_accumulation: str = "in_mma"
    dq_order: DqOrder = "forward"
    dq_atomic: OpSpec = "float32"  # type: ignore[assignment]  # a format name -> an OpSpec in __post_init__
    scale_at: str = "scores"
    exp_impl: str = "correctly_rounded"
    k_scaled: OpSpec = "float16"  # type: ignore[assignment]  # a format name -> an OpSpec in __post_init__
    gpu_kernel: str | None = None
    profile: str | None = None
    input_format: str | None = None

    def __post_init__(self) -> None:
        if self.opmath is not None:
            object.__setattr__(self, "opmath", _checked_format(self.opmath, "BackwardPlan.opmath"))
        if not isinstance(self.name, str):
            raise TypeError(f"BackwardPlan.name must be a string, got {type(self.name).__name__}")
        check_kernel_fields(self, "BackwardPlan")
        for op in BACKWARD_OPS:
            value = getattr(self, op)
            spec = _dot_spec(op, value) if op in _BWD_DOTS else _scalar_spec(op, value)
            object.__setattr__(self, op, spec)
        for flag in ("exp2", "contract"):
            if not isinstance(getattr(self, flag), bool):
                raise TypeError(f"BackwardPlan.{flag} must be a bool, got {type(getattr(self, flag)).__name__}")
        check_exp2_impl(self.exp2_impl, "BackwardPlan.exp2_impl")
        object.__setattr__(self, "exp2_impl", ex2_value(self.exp2_impl))
        object.__setattr__(self, "dq_atomic", _scalar_spec("dq_atomic", self.dq_atomic))
        object.__setattr__(self, "k_scaled", _scalar_spec("k_scaled", self.k_scaled))
        if self.scale_at not in SCALE_AT:
            raise ValueError(f"BackwardPlan.scale_at must be one of {', '.join(SCALE_AT)}, got {self.scale_at!r}")
        if self.exp_impl not in EXP_IMPLS:
            raise ValueError(f"BackwardPlan.exp_impl must be one of {', '.join(EXP_IMPLS)}, got {self.exp_impl!r}")
        if self.exp_impl == "tl.exp" and self.exp2:
            raise ValueError("BackwardPlan.exp_impl='tl.exp' models tl.exp, which a plan with exp2=True never calls")
        if self.scale_at == "k" and not self.exp2:
            raise ValueError("BackwardPlan.scale_at='k' needs exp2=True (K is pre-scaled by scale / ln 2)")
        if self.dq_accumulation not in DQ_ACCUMULATIONS:
            raise ValueError(
                f"BackwardPlan.dq_accumulation must be one of {', '.join(DQ_ACCUMULATIONS)}, "
                f"got {self.dq_accumulation!r}"
            )
        order = self.dq_order
        if isinstance(order, str):
            if order not in DQ_ORDERS and not is_dash(order):
                raise ValueError(
                    f"BackwardPlan.dq_order must be one of {', '.join(DQ_ORDERS)} ('dash_shift:<sms>' for another "
                    f"SM count), a tuple of key tiles or a callable, got {order!r}"
                )
        elif isinstance(order, (tuple, list)):
            tiles = tuple(order)
            if not all(isinstance(t, (int, np.integer)) and not isinstance(t, bool) for t in tiles) or sorted(
                int(t) for t in tiles
            ) != list(range(len(tiles))):
                raise ValueError(f"BackwardPlan.dq_order as a tuple must be a permutation of 0..n-1, got {order!r}")
            object.__setattr__(self, "dq_order", tuple(int(t) for t in tiles))
        elif not callable(order):
            raise TypeError(f"BackwardPlan.dq_order must be a name, a tuple or a callable, got {type(order).__name__}")
        if self.dq_accumulation == "in_mma" and order == "seeded":
            raise ValueError(
                "BackwardPlan.dq_order='seeded' needs dq_accumulation='atomic' (an in-MMA dQ walks its key tiles "
                "in one program order)"
            )

    def replace(self, **changes: object) -> BackwardPlan:
        """A copy with some ops or flags changed (values as for the constructor).

        Raises:
            ValueError: an unknown op or flag (the message lists the valid ones).
            TypeError: a value of the wrong type.
        """
        flags = (
            "exp2",
            "contract",
            "exp2_impl",
            "opmath",
            "dq_accumulation",
            "dq_order",
            "dq_atomic",
            "scale_at",
            "k_scaled",
            "exp_impl",
            "gpu_kernel",
            "profile",
            "input_format",
        )
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
            + (
                f", dq_accumulation=atomic, dq_order={self.dq_order!r}, dq_atomic={self.dq_atomic}"
                if self.dq_accumulation == "atomic"
                else (f", dq_order={self.dq_order!r}" if self.dq_order != "forward" else "")
            )
            + (f", scale_at={self.scale_at}" if self.scale_at != "scores" else "")
            + (f", k_scaled={self.k_scaled}" if self.scale_at == "k" else "")
            + (f", exp_impl={self.exp_impl}" if self.exp_impl != "correctly_rounded" else "")
            + ")"
        )

    def params(self, scale: float) -> BackwardParams:
        """The plan for the compiled kernels, with the softmax ``scale`` rounded as the kernels use it:
        ``qk_scale = scale_op(scale_op(scale) * scale_op(log2 e))`` with ``exp2``, else ``scale_op(scale)``;
        ``sm_scale = grad_scale_op(scale)``. With ``scale_at="k"`` qk_scale is 1 (K carries the scale) and
        E3's ``dq_scale = grad_scale_op(ln 2)``, else sm_scale.

        Raises:
            ValueError: a rounded scale is not finite and > 0.
        """
        from simfloat.attention._kernels import host_rnd

        op = functools.partial(_op_params, self)
        qk_scale = 1.0 if self.scale_at == "k" else _qk_scale(self, scale)[1]
        sm_scale = host_rnd(float(scale), op("grad_scale"))
        dq_scale = host_rnd(math.log(2.0), op("grad_scale")) if self.scale_at == "k" else sm_scale
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
            ex2_tab(self.exp2_impl),
            self.dq_accumulation == "atomic",
            op("dq_atomic"),
            self.scale_at == "ds",
            dq_scale,
            self.exp_impl == "tl.exp",
        )


def _bwd_uniform(name: str, fmt: str, dot: Model, inputs: str | None = None) -> BackwardPlan:
    f: Any = fmt  # a format name: OpSpecs after __post_init__
    return BackwardPlan(name, f, f, dot, f, f, f, dot, dot, f, f, dot, dot, f, f, f, input_format=inputs)


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
        gpu_kernel="triton",
        input_format=inputs_of(fmt),
    )


def _bwd_with_hardware(base: BackwardPlan, fmt: str, hardware: object) -> BackwardPlan:
    """The backward triton-<fmt> with a hardware profile's models, as the forward's (:func:`_with_hardware`):
    the profile's tensor-core model for every dot (B2, B5, B6, B9, Q4) and its exp2 (B4). The B4 shift stays
    fused whatever the profile's contraction fact: the kernel calls ``tl.fma`` itself; the backward has no
    tl.sum of the mma layout (D2 sums a blocked layout, sequential here)."""
    from simfloat.profiles import load_profile, register_profile

    prof = register_profile(load_profile(hardware))  # type: ignore[arg-type]
    changes: dict[str, object] = {"name": f"{base.name}@{prof.name}", "profile": prof.name}
    changes["exp2_impl"] = prof.exp2_impl()
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
    return BackwardPlan(f"pytorch-{fmt}", *ops, opmath=fp32, gpu_kernel="pytorch", input_format=fmt)  # type: ignore[arg-type]  # names -> OpSpecs, formats in __post_init__


@functools.cache
def _build_backward() -> dict[str, BackwardPlan]:
    out = {"fp64": _bwd_uniform("fp64", "float64", Sequential("float64", product_fmt="float64"))}
    for fmt in ("bf16", "fp16", "fp32", "tf32", "e4m3", "e5m2"):
        f = _format(fmt).name
        out[f"all-{fmt}"] = _bwd_uniform(f"all-{fmt}", f, Sequential(f, product_fmt=f), inputs_of(fmt))
    for fmt in ("bf16", "fp16", "fp32", "tf32"):
        out[f"triton-{fmt}"] = _bwd_triton(fmt)
    for fmt in ("bf16", "fp16", "tf32"):
        out[f"h200-{fmt}"] = _bwd_h200(fmt)
    for fmt in ("bf16", "fp16", "fp32"):
        out[f"pytorch-{fmt}"] = _bwd_pytorch(fmt)
    out["triton-tutorial-fp16"] = _bwd_tutorial()
    for fmt in ("bf16", "fp16"):
        out[f"flashattn-triton-{fmt}"] = _bwd_flashattn(fmt)
    return out


def _bwd_flashattn(fmt: str) -> BackwardPlan:
    # the flash-attention repository's Triton backward (flash_attn/flash_attn_triton.py, _bwd_kernel, one
    # program over the key tiles): triton-<fmt>'s ops with tl.exp of the contracted qk * scale - lse (natural
    # log units), the scale applied to dS before its cast and no dK/dQ epilogue multiply
    return dataclasses.replace(
        _bwd_triton(fmt),
        name=f"flashattn-triton-{fmt}",
        exp2=False,
        exp_impl="tl.exp",
        scale_at="ds",
        gpu_kernel="flashattn-triton",
    )


def _bwd_tutorial() -> BackwardPlan:
    # the Triton tutorial's backward (python/tutorials/06-fused-attention.py, causal): triton-fp16's ops with K
    # pre-scaled by the host (torch's fp16 * Python float: the product in fp32, then fp16), P = exp2(qk - M),
    # dK * sm_scale and dQ * fp32(ln 2) on store, and the dQ kernel's diagonal key tiles first. Its tiles are
    # call data: flash_backward(block_m=BLOCK_M1, block_n=BLOCK_N1, block_m2=BLOCK_M2, block_n2=BLOCK_N2)
    fp32: Any = "float32"
    return dataclasses.replace(
        _bwd_triton("fp16"),
        name="triton-tutorial-fp16",
        scale_at="k",
        k_scaled="float16",  # type: ignore[arg-type]  # a format name -> an OpSpec in __post_init__
        opmath=fp32,
        dq_order="diagonal_first",
        gpu_kernel="triton-tutorial",
    )


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
        ``triton-tutorial-fp16``: the Triton tutorial's backward (``06-fused-attention.py``, causal): K
        pre-scaled by ``scale / ln 2`` on the host (``scale_at="k"``), ``dQ * ln 2`` on store, dQ's diagonal key
        tiles first; run it with the tutorial's tiles, ``block_m=32, block_n=128, block_m2=128, block_n2=32``
        (its masked sub-tiles of 16 give the same bits under sm90's 16-wide MMA steps).
        ``flashattn-triton-<fmt>`` (bf16, fp16): the flash-attention repository's Triton backward: tl.exp of the
        contracted ``qk * scale - lse``, dS scaled before its cast (``scale_at="ds"``), one tile shape.

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
