"""The one preset table of forward plans (float and with quantizers), a hardware profile applied to a
``triton-<fmt>`` preset, and the resolution of a plan name that :func:`simfloat.attention.plan` and
:func:`simfloat.attention.backward_plan` share.

The builders take the plan type as ``make`` (:func:`table` is called with :class:`~simfloat.attention.Plan`),
so that this module does not import it: the Plan type's ``repr`` reads the table.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable
from typing import Any, TypeVar

from simfloat.accumulate import BlockFMA, Chunked, Model, Sequential, tensor_core
from simfloat.attention import quant_plan as _qp
from simfloat.attention._plan_params import SUM_ORDERS
from simfloat.attention._specs import _BIG_CHUNK, OpSpec
from simfloat.attention.quant import QUANTIZERS
from simfloat.attention.quant_plan import QUANT_FLAGS, QUANT_OPS
from simfloat.formats import FloatFormat
from simfloat.formats import format as _format
from simfloat.hardware import Ex2Table

#: Plan or BackwardPlan (:func:`resolve`)
_P = TypeVar("_P")


def _uniform(make: Callable[..., Any], name: str, fmt: str, dot: Model, inputs: str | None = None) -> Any:
    f: Any = fmt  # a format name: OpSpecs after __post_init__
    ops = dict.fromkeys(("scale", "exp", "m_i", "alpha", "l_i", "acc", "p", "normalize", "out", "softmax"), f)
    return make(name, qk=dot, pv=dot, **ops, input_format=inputs)


def inputs_of(fmt: str) -> str:
    """The input format of a ``<family>-<fmt>`` preset's kernel: ``fmt``, fp32 for tf32 (tf32 kernels read fp32)."""
    return "fp32" if fmt == "tf32" else fmt


#: the float32 ops of a GPU kernel's plan (the softmax's state and arithmetic; a plan sets the others)
_F32_OPS = ("scale", "exp", "m_i", "alpha", "l_i", "acc", "normalize", "softmax")
#: what the GPU flash kernels' plans share: exp2 with log2(e) folded into the scale, FMA contraction
_FLASH: dict[str, Any] = {"exp2": True, "contract": True, "kernel": "flash"}


def _kernel_plan(make: Callable[..., Any], name: str, qk: Model, pv: Model, p: Any, out: Any, **fields: Any) -> Any:
    """A plan of one GPU kernel: its dots, P's and the output's formats, the ops of :data:`_F32_OPS` float32
    unless ``fields`` sets them, and ``fields`` (its kernel, ``gpu_kernel`` and flags)."""
    ops: dict[str, Any] = dict.fromkeys(_F32_OPS, "float32")  # format names: OpSpecs after __post_init__
    return make(name, qk=qk, pv=pv, p=p, out=out, **{**ops, **fields})


def _triton(make: Callable[..., Any], fmt: str) -> Any:
    f = _format(fmt).name
    # fp32 inputs: "ieee" dots (an FMA loop); tf32: fp32 inputs with tf32 tensor cores (Triton's default)
    dot = Sequential("float32") if fmt == "fp32" else tensor_core("sm90", f)
    io = "float32" if fmt in ("fp32", "tf32") else f
    fields = {"gpu_kernel": "triton", "input_format": inputs_of(fmt)}
    return _kernel_plan(make, f"triton-{fmt}", dot, dot, io, io, **_FLASH, **fields)


def _flashattn_triton(make: Callable[..., Any], fmt: str) -> Any:
    # flash_attn/flash_attn_triton.py of the flash-attention repository (forward, no bias): triton-<fmt>'s formats
    # and dots, tl.exp of the fp32 scores (no log2(e) folded in), FMA contraction of qk * scale - m_ij, and the
    # running state kept as (m_i, lse_i) (Plan.state)
    return dataclasses.replace(
        _triton(make, fmt),
        name=f"flashattn-triton-{fmt}",
        exp2=False,
        exp_impl="tl.exp",
        state="lse",
        gpu_kernel="flashattn-triton",
    )


def _triton_tutorial(make: Callable[..., Any], fmt: str) -> Any:
    # python/tutorials/06-fused-attention.py of the triton repository (forward): triton-<fmt>, whose T6 is its
    # contracted qk * qk_scale - m_ij, except in the causal diagonal tiles (Plan.contract_diagonal)
    return dataclasses.replace(
        _triton(make, fmt),
        name=f"triton-tutorial-{fmt}",
        contract_diagonal=False,
        gpu_kernel="triton-tutorial",
    )


def _pytorch(make: Callable[..., Any], fmt: str) -> Any:
    f = _format(fmt).name
    if fmt == "fp32":
        qk: Model = Sequential("float32")
        pv: Model = Sequential("float32")
    else:  # fp32 accumulation from 0, the result rounded once into fmt; P read as fmt
        qk = Chunked(_BIG_CHUNK, Sequential("float32"), outer_fmt=f)
        pv = Chunked(_BIG_CHUNK, Sequential("float32", input_fmt=f), outer_fmt=f)
    om = None if fmt == "fp32" else "float32"  # torch multiplies a bf16/fp16 tensor by a float in float32
    fields = {"scale": f, "kernel": "baseline", "opmath": om, "gpu_kernel": "pytorch", "input_format": fmt}
    return _kernel_plan(make, f"pytorch-{fmt}", qk, pv, f, f, **fields)


def profile_dot(prof: Any, fmt: str) -> Model | None:
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


def with_hardware(base: Any, fmt: str, hardware: object) -> Any:
    """triton-<fmt> with a hardware profile's models (simfloat.profiles): the tensor-core model of the
    profile's wgmma part for the format (else its other parts; absent: the sm90 preset stays), its exp2
    (``exp2_impl``), its tl.sum rule of the mma layout (``sum_order``) and its FMA contraction fact. A part the
    profile does not have keeps triton-<fmt>'s default."""
    from simfloat.profiles import load_profile, register_profile

    prof = register_profile(load_profile(hardware))  # type: ignore[arg-type]
    changes: dict[str, object] = {"name": f"{base.name}@{prof.name}", "profile": prof.name}
    model = profile_dot(prof, fmt)
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
        changes["sum_order"] = mma_sum.order()
    if prof.isa is not None:
        changes["contract"] = prof.isa.fma_contraction
    return dataclasses.replace(base, **changes)


def _h200(make: Callable[..., Any], fmt: str) -> Any:
    # triton-<fmt> on an H200 (sm_90, triton 3.6) as measured: the shipped profile simfloat/data/profiles/h200.json
    # (fitted from tests/fixtures/gpu/h200/probes; docs/results/h200-validation.md), under its historic name
    return dataclasses.replace(with_hardware(_triton(make, fmt), fmt, "h200"), name=f"h200-{fmt}")


def _fa(make: Callable[..., Any], gen: int, fmt: str) -> Any:
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
    p: Any = _format(f).replace(overflow="saturate", name=f"{f}_satfinite") if fp8 else f  # cvt .satfinite
    out = "bfloat16" if fp8 else f  # FA3/FA4 write fp8 attention's output in bf16
    extra: dict[str, Any] = {"exp2_emu": "fa4", "lazy_threshold": None if fp8 else 8.0} if gen == 4 else {}
    fields = {"exp2_impl": "h200", "p_offset": 8 if fp8 else 0, "alpha_raw": True, "kv_order": "reverse"}
    fields.update(gpu_kernel=f"fa{gen}", input_format=inputs_of(fmt))  # the kernel reads q, k, v in fmt
    return _kernel_plan(make, f"fa{gen}-{fmt}", dot, dot, p, out, **_FLASH, **fields, **extra)


@functools.cache
def table(make: Callable[..., Any]) -> dict[str, Any]:
    """The one preset table, float and quantized plans by name, each built by ``make`` (the Plan type)."""
    out = {"fp64": _uniform(make, "fp64", "float64", Sequential("float64", product_fmt="float64"))}
    for fmt in ("bf16", "fp16", "fp32", "tf32", "e4m3", "e5m2"):
        f = _format(fmt).name
        out[f"all-{fmt}"] = _uniform(make, f"all-{fmt}", f, Sequential(f, product_fmt=f), inputs_of(fmt))
    for fmt in ("bf16", "fp16", "fp32", "tf32", "e4m3", "e5m2"):
        out[f"triton-{fmt}"] = _triton(make, fmt)
    for fmt in ("bf16", "fp16", "tf32", "e4m3", "e5m2"):
        out[f"h200-{fmt}"] = _h200(make, fmt)
    for fmt in ("bf16", "fp16", "fp32"):
        out[f"pytorch-{fmt}"] = _pytorch(make, fmt)
    for fmt in ("bf16", "fp16"):
        out[f"flashattn-triton-{fmt}"] = _flashattn_triton(make, fmt)
    out["triton-tutorial-fp16"] = _triton_tutorial(make, "fp16")
    for gen in (3, 4):
        for fmt in ("bf16", "fp16", "e4m3"):
            out[f"fa{gen}-{fmt}"] = _fa(make, gen, fmt)
    quantized = _qp.quant_table(functools.partial(quantized_plan, make))
    assert not set(out) & set(quantized), "one preset table: float and quantized names must differ"
    out.update(quantized)
    return out


_F32 = OpSpec("float32")


def quantized_plan(make: Callable[..., Any], name: str, *quantizers_and_dots: Any, **fields: Any) -> Any:
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
    return make(name, **kw)


def short_value(x: object) -> str:
    """A field's value in a repr: formats by name (``bfloat16``), rounding modes by name, an ex2 table by its
    name (``'h200'``)."""
    if isinstance(x, Ex2Table):
        return repr(x.name)
    if isinstance(x, (OpSpec, FloatFormat)):
        return str(x) if isinstance(x, OpSpec) else x.name
    text = re.sub(r"FloatFormat\(name='([^']*)'[^)]*\)", r"\1", repr(x))
    return re.sub(r"<RoundingMode\.(\w+): \d+>", lambda m: m.group(1).lower(), text)


def short_repr(p: Any, table: dict[str, Any]) -> str:
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
        f"{f.name}={short_value(getattr(p, f.name))}"
        for f in dataclasses.fields(p)
        if f.name != "name" and getattr(p, f.name) != getattr(ref, f.name)
    ]
    return f"{type(p).__name__}({p.name!r}{against if diffs else ''}" + "".join(f", {d}" for d in diffs) + ")"


def resolve(
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
    if hardware is not None and not isinstance(name, str):
        raise ValueError(f"{func}(hardware=...) applies to the triton-<fmt> presets ({kernels}), got {name!r}")
    if isinstance(name, cls):
        return name
    if not isinstance(name, str):
        raise TypeError(f"plan must be a {cls.__name__} or a preset name, got {type(name).__name__}")
    presets_ = table()
    if name not in presets_:
        raise ValueError(f"unknown {what} {name!r}; presets: {', '.join(presets_)}")
    preset = presets_[name]
    if hardware is not None:
        if not _takes_hardware(preset):
            raise ValueError(f"{func}(hardware=...) applies to the triton-<fmt> presets ({kernels}), got {name!r}")
        return with_hardware(preset, name.split("-", 1)[1], hardware)
    return presets_[name]


def _takes_hardware(preset: Any) -> bool:
    """Whether a hardware profile applies to ``preset``, a forward or backward plan: a plan of the Triton flash
    kernel without a profile yet (its ``gpu_kernel`` and ``profile`` fields)."""
    return bool(preset.gpu_kernel == "triton" and preset.profile is None)
