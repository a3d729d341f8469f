"""The :class:`Plan` type: one type for the float and quantized plans, its entries' checks and its derived plans.

The preset table is :mod:`simfloat.attention._presets`, the lowering for the compiled kernels
:mod:`simfloat.attention._plan_params`; :mod:`simfloat.attention.plan` is the public face of all three.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from simfloat.accumulate import Chunked, Model, Sequential
from simfloat.attention import quant_plan as _qp
from simfloat.attention._plan_params import (
    BASELINE_OPS,
    DOT_OPS,
    EXP_IMPLS,
    FLASH_OPS,
    KERNELS,
    KV_ORDERS,
    PLAN_OPS,
    STATE_FORMS,
    SUM_ORDERS,
    Features,
    PlanParams,
    check_exp2_impl,
    check_kernel_fields,
    check_pv_acc,
    ex2_value,
    features,
    plan_params,
)
from simfloat.attention._quant_kernels import QParams
from simfloat.attention._specs import OpSpec, _dot_spec, _scalar_spec, _sum_spec
from simfloat.attention.quant import QUANTIZERS, Quant
from simfloat.attention.quant_plan import QUANT_FIELDS, QUANT_FLAGS, QUANT_OPS
from simfloat.formats import FloatFormat
from simfloat.formats import format as _format
from simfloat.hardware import Ex2Table, SumOrder

__all__ = ["Plan"]

#: the entries besides its ops a plan of the baseline kernel takes
_BASELINE_FLAGS = ("opmath",)


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
        exp2_impl: flash: ``"correctly_rounded"``, or an ex2.approx table as a value
            (:class:`simfloat.hardware.Ex2Table`: exp/alpha exp2 through the measured ex2.approx.ftz.f32 of
            :mod:`simfloat.hardware`, then rounded into the op's format), what a hardware profile's plan carries,
            complete in any process. ``"h200"`` stands for the shipped H200 table
            (:func:`simfloat.hardware.h200_ex2`) and the name of a table registered with
            :func:`simfloat.hardware.register_ex2_table` (``"table-<sha256 prefix>"``) for that table: both
            become the value.
        sum_order: flash: order of the row sum l_ij as a value (:class:`simfloat.hardware.SumOrder`: the rule
            and its warp-layout rule), given as it or by its rule: ``"sequential"`` or ``"h200-mma"`` (the
            measured tl.sum order over a tile in the tensor-core accumulator layout,
            :func:`simfloat.hardware.mma_tree_sum`; a hardware profile's tl.sum part of the mma layout).
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

        gpu_kernel: the GPU kernel the plan models, a field rather than a name prefix: ``"triton"`` (the
            Triton flash kernel: ``triton-<fmt>``, ``triton-<fmt>@<profile>``, ``h200-<fmt>``),
            ``"triton-tutorial"``, ``"flashattn-triton"``, ``"fa3"``, ``"fa4"``, ``"pytorch"`` (torch's eager
            attention), or ``None`` (a plan of no one kernel: ``fp64``, ``all-<fmt>``, the quantized presets, a
            Plan constructed without it). A hardware profile applies to the ``"triton"`` plans without one.
        profile: the name of the hardware profile (:mod:`simfloat.profiles`) whose models the plan carries
            (``plan("triton-<fmt>", hardware=...)``, ``h200-<fmt>``: ``"h200"``), or ``None``.
        input_format: the format the plan's kernel reads q, k, v in (its caller rounds them first), a short name
            (``"bf16"``, ``"fp16"``, ``"fp32"``, ``"e4m3"``, ``"e5m2"``): ``<fmt>`` for ``triton-``, ``h200-``,
            ``all-``, ``pytorch-``, ``flashattn-triton-``, ``triton-tutorial-``, ``fa3-`` and ``fa4-<fmt>``
            (``"fp32"`` for the tf32 kernels), kept by the plans derived from them; ``None`` (any input) for
            ``fp64`` and the quantized presets. Entry points warn for inputs outside it
            (:class:`~simfloat.attention.InputFormatWarning`).

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
            block P quantizer or a block-scaled pv MMA needs it).

    The accumulator's format (flash plans, with or without quantizers):
        pv_acc: the format the P.V accumulator is held in between key tiles, or ``None`` (default: the acc op's
            format, alpha used as computed). A kernel that keeps its accumulator in fp16 (SageAttention's
            ``pv_accum_dtype="fp16"``: ``mma`` with fp16 C and D, ``pv`` a ``tensor_core(...,
            out_format="fp16")`` model) rescales it by alpha in that format: T11 becomes ``acc(acc *
            pv_acc(alpha))``, alpha rounded to nearest even into it first (``__hmul2(acc,
            __floats2half2_rn(alpha))``); ``l_i`` keeps the unrounded alpha. The acc op must round into the same
            format (``acc=pv_acc``); the ``into_acc`` P.V form only (a plan with quantizers: ``pv_update
            ="into_acc"``), no FA1 ``normalization``. Attribution counts alpha's rounding as the acc op's.
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
    sum_order: SumOrder = SumOrder()  # a rule's name is accepted too (__post_init__ makes it the value)
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
    pv_acc: FloatFormat | str | None = None
    gpu_kernel: str | None = None
    profile: str | None = None
    input_format: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise TypeError(f"Plan.name must be a string, got {type(self.name).__name__}")
        check_kernel_fields(self, "Plan")
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
        for op in PLAN_OPS:
            value = getattr(self, op)
            if op == "l_ij":
                continue
            spec = _dot_spec(op, value) if op in DOT_OPS else _scalar_spec(op, value)
            object.__setattr__(self, op, spec)
        lij = (self.l_i.fmt, self.l_i.mode) if self.l_ij is None else self.l_ij
        object.__setattr__(self, "l_ij", _sum_spec("l_ij", lij))
        for flag in ("exp2", "contract", "contract_diagonal"):
            if not isinstance(getattr(self, flag), bool):
                raise TypeError(f"Plan.{flag} must be a bool, got {type(getattr(self, flag)).__name__}")
        if self.normalization not in ("deferred", "per_step"):
            raise ValueError(f"Plan.normalization must be 'deferred' or 'per_step', got {self.normalization!r}")
        check_exp2_impl(self.exp2_impl, "Plan.exp2_impl")
        object.__setattr__(self, "exp2_impl", ex2_value(self.exp2_impl))
        if not isinstance(self.sum_order, SumOrder):
            if self.sum_order not in SUM_ORDERS:
                raise ValueError(f"Plan.sum_order must be one of {SUM_ORDERS}, got {self.sum_order!r}")
            object.__setattr__(self, "sum_order", SumOrder(self.sum_order))
        if self.sum_order.rule != "sequential" and isinstance(self.l_ij, Chunked):
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
        check_pv_acc(self)
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
        return {"flash": FLASH_OPS, "baseline": BASELINE_OPS}.get(self.kernel, PLAN_OPS)

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
        flags = [f.name for f in dataclasses.fields(self) if f.name not in PLAN_OPS and f.name != "name"]
        unknown = sorted(set(changes) - set(PLAN_OPS) - set(flags) - {"name"})
        if self.quantized:
            unknown = sorted(set(changes) - set(QUANT_OPS) - set(QUANT_FLAGS) - {"name"})
            if unknown:
                raise ValueError(
                    f"unknown plan entries {unknown} for plan {self.name!r} (a plan with quantizers); ops: "
                    f"{', '.join(QUANT_OPS)}; flags: {', '.join(QUANT_FLAGS)}"
                )
        elif unknown:
            raise ValueError(f"unknown plan entries {unknown}; ops: {', '.join(PLAN_OPS)}; flags: {', '.join(flags)}")
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
        from simfloat.attention import _presets

        return _presets.short_repr(self, _presets.table(Plan))

    def __str__(self) -> str:
        if self.quantized:
            qops = ", ".join(f"{op}={getattr(self, op)}" for op in QUANT_OPS)
            return (
                f"Plan({self.name}: {qops}; exp2={self.exp2}, contract={self.contract}, "
                f"row_sum={self.row_sum}, score_scaling={self.score_scaling}, pv_update={self.pv_update}"
                + self._options_str()
                + ")"
            )
        ops = ", ".join(f"{op}={getattr(self, op)}" for op in PLAN_OPS)
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
            + (f", sum_order={self.sum_order}" if self.sum_order != SumOrder() else "")
            + (f", exp_impl={self.exp_impl}" if self.exp_impl != "correctly_rounded" else "")
            + (f", state={self.state}" if self.state != "m_l" else "")
            + (f", kv_order={self.kv_order}" if self.kv_order != "forward" else "")
            + (", contract_diagonal=False" if not self.contract_diagonal else "")
            + (f", exp2_emu={self.exp2_emu}" if self.exp2_emu is not None else "")
            + (f", p_offset={self.p_offset}" if self.p_offset else "")
            + (", alpha_raw=True" if self.alpha_raw else "")
            + (f", pv_acc={self.pv_acc.name}" if isinstance(self.pv_acc, FloatFormat) else "")
        )

    def params(self, scale: float) -> PlanParams:
        """The plan for the compiled kernels, with the softmax ``scale`` rounded as the kernels use it
        (:func:`simfloat.attention._plan_params.plan_params`).

        flash: ``qk_scale = scale_op(scale_op(scale) * scale_op(log2 e))`` with ``exp2`` (the Triton kernel's
        host code, H1), else ``scale_op(scale)``; baseline: ``scale_op(scale)``.

        Raises:
            ValueError: the rounded scale is not finite and > 0, or a plan with quantizers.
        """
        return plan_params(self, scale)

    def _features(self) -> Features:
        """The float dataflow's optional steps for the compiled kernels (:func:`features`)."""
        return features(self)

    def quant_params(self, scale: float) -> QParams:
        """A plan with quantizers for the compiled kernels, with the host's qk_scale (H1): ``scale(scale(sm_scale) *
        scale(log2 e))`` with exp2, else ``scale(sm_scale)``.

        Raises:
            ValueError: the rounded scale is not finite and > 0, or a plan without quantizers (see :meth:`params`).
        """
        return _qp.quant_params(self._quantized_only("quant_params"), scale)
