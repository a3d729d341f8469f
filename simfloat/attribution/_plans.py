"""The plans an attribution runs: isolation, ablation, the float64 reference and the baseline pairing."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from simfloat.accumulate import BlockFMA, Chunked, Sequential
from simfloat.attention import BASELINE_OPS, FLASH_OPS, Plan, plan, presets
from simfloat.attention.plan import OpSpec
from simfloat.attention.quant_plan import QUANT_FIELDS
from simfloat.formats import FloatFormat
from simfloat.formats import format as _format

__all__ = [
    "BASELINE_PAIRS",
    "FLAGS",
    "ablation_plan",
    "baseline_plan_for",
    "describe",
    "isolation_plan",
    "reference_plan",
]

#: Every :class:`Plan` field but the name, which kernel the plan is for, the profile its models came from and the
#: kernel's input format (not how it computes: ``kernel``, ``gpu_kernel``, ``profile``, ``input_format``) and the
#: quantizer ops (None in the float plans
#: attribution studies; plans with quantizers derive their own, ``Plan.isolate``).
_FIELDS = tuple(
    f.name
    for f in dataclasses.fields(Plan)
    if f.name not in ("name", "kernel", "gpu_kernel", "profile", "input_format") and f.name not in QUANT_FIELDS
)
#: Fields that are part of an op's precision, not algorithm flags: ``opmath`` (a baseline plan's working precision)
#: and ``pv_acc`` (the accumulator's format: alpha's rounding into it is the acc op's, :data:`_WITH_OP`).
_OP_FIELDS = ("opmath", "pv_acc")
#: The fields that go with an op in isolation and ablation plans.
_WITH_OP = {"acc": ("pv_acc",)}
#: The algorithm flags a plan carries besides its ops (every field of :data:`_FIELDS` that is not an op, so a
#: new flag cannot be left out; ``opmath``, a baseline plan's working precision, is no algorithm flag);
#: isolation, ablation and the reference plan keep the plan's.
FLAGS = tuple(f for f in _FIELDS if f not in FLASH_OPS and f not in BASELINE_OPS and f not in _OP_FIELDS)
#: What each kernel's output depends on: every field but the name and the other kernel's own ops (a field
#: added to Plan counts for both until it is known to be an op of one kernel only).
_KEY_FIELDS = {
    "flash": tuple(f for f in _FIELDS if f in FLASH_OPS or f not in BASELINE_OPS),
    "baseline": tuple(f for f in _FIELDS if f in BASELINE_OPS or f not in FLASH_OPS),
}

_FMTS = ("bf16", "fp16", "fp32", "tf32", "e4m3", "e5m2")


def _pairs() -> dict[str, str]:
    names = presets()
    out = {"fp64": "fp64"}
    for f in _FMTS:
        out[f"all-{f}"] = f"all-{f}"  # Golden et al.'s simulator: the same format everywhere, in both kernels
        if f"pytorch-{f}" in names:
            out[f"triton-{f}"] = f"pytorch-{f}"  # the Triton kernel vs what torch's eager attention does
            if f"h200-{f}" in names:
                out[f"h200-{f}"] = f"pytorch-{f}"  # the same kernel with the H200's exp2 and row-sum order
    return out


#: Default baseline plan for each flash preset (``triton-<fmt>`` and ``h200-<fmt>`` -> ``pytorch-<fmt>``,
#: ``all-<fmt>`` -> ``all-<fmt>``, ``fp64`` -> ``fp64``). Presets not listed (tf32/e4m3/e5m2 kernels: torch
#: has no such eager attention) and custom plans need an explicit ``baseline=``.
BASELINE_PAIRS: Mapping[str, str] = _pairs()


def baseline_plan_for(p: Plan | str, override: object = None) -> Plan:
    """The baseline plan paired with flash plan ``p`` for the flash-vs-baseline comparison.

    Args:
        p: the flash plan (a preset name or :class:`Plan`).
        override: ``None`` (use :data:`BASELINE_PAIRS` by the plan's name; ``triton-<f>@<profile>`` takes
            ``triton-<f>``'s pair), a plan or preset name (used as
            is), or a mapping from flash plan names to baseline plans (plans missing from it fall back to the
            pairs).

    Raises:
        ValueError: no pairing is known for this plan and none was given, or the baseline plan is one of the
            flash kernel's own (``triton-``/``h200-``, :meth:`Plan.kernels`).
    """
    fp = plan(p)
    if isinstance(override, Mapping):
        override = override.get(fp.name)
    if override is not None:
        bp = plan(override)  # type: ignore[arg-type]  # plan() raises TypeError for other types
        if "baseline" not in bp.kernels():
            raise ValueError(
                f"baseline plan {bp.name!r} (for {fp.name!r}) is a plan of the flash kernel; the "
                "baseline kernel takes pytorch-<fmt>, all-<fmt>, fp64 or a plan of another name"
            )
        return bp
    base, at, prof = fp.name.partition("@")
    key = base if at and not prof.endswith("*") else fp.name  # triton-<f>@<profile>: the pair of triton-<f>
    if key not in BASELINE_PAIRS:
        raise ValueError(
            f"no baseline plan is paired with flash plan {fp.name!r}: pass baseline=<plan> "
            f"(CLI: --baseline {fp.name}=<plan>); known pairs: "
            + ", ".join(f"{a}->{b}" for a, b in BASELINE_PAIRS.items())
        )
    return plan(BASELINE_PAIRS[key])


def reference_plan(p: Plan | str) -> Plan:
    """Every op float64 (the ``fp64`` preset's entries) under ``p``'s algorithm flags (:data:`FLAGS`: exp2, FMA
    contraction, normalization, lazy rescaling, the exp2 implementation and the row-sum order): what is left
    when all of ``p``'s low precision is removed. With ``exp2_impl="h200"`` that includes the approximation
    of the hardware's ex2.approx.ftz.f32, which no op's format removes. It keeps ``p``'s input format (it runs
    on ``p``'s inputs)."""
    fp = plan(p)
    flags = {f: getattr(fp, f) for f in FLAGS}
    return dataclasses.replace(plan("fp64"), name=f"{fp.name}[all->fp64]", input_format=fp.input_format, **flags)


def isolation_plan(p: Plan | str, op: str) -> Plan:
    """Only ``op`` in ``p``'s precision, every other op float64 (under ``p``'s flags): that op's error
    alone."""
    fp = plan(p)
    _check_op(op)
    keep = {f: getattr(fp, f) for f in (op, *_WITH_OP.get(op, ()))}
    return reference_plan(fp).replace(name=f"{fp.name}[only {op}]", **keep)


def ablation_plan(p: Plan | str, op: str) -> Plan:
    """``p`` with only ``op`` raised to float64: the error that remains without that op's."""
    fp = plan(p)
    _check_op(op)
    raised = {f: getattr(plan("fp64"), f) for f in (op, *_WITH_OP.get(op, ()))}
    return fp.replace(name=f"{fp.name}[{op}->fp64]", **raised)


def _check_op(op: object) -> None:
    if op not in FLASH_OPS:
        raise ValueError(f"unknown op {op!r}; flash ops: {', '.join(FLASH_OPS)}")


def cache_key(kernel: str, p: Plan) -> tuple[object, ...]:
    """What determines ``kernel``'s (``"flash"`` or ``"baseline"``) output under plan ``p`` (the name does
    not)."""
    return (kernel,) + tuple(getattr(p, f) for f in _KEY_FIELDS[kernel])


_SHORT = {
    "bfloat16": "bf16",
    "float16": "fp16",
    "float32": "fp32",
    "float64": "fp64",
    "tfloat32": "tf32",
    "float8_e4m3fn": "e4m3",
    "float8_e5m2": "e5m2",
}


def _fmt(f: str | FloatFormat) -> str:
    name = _format(f).name
    return _SHORT.get(name, name)


def describe(entry: object) -> str:
    """A short label for a plan entry: ``bf16``, ``seq fp32``, ``tc16 F25 fp32/rz``, ``seq fp32 -> bf16``."""
    if isinstance(entry, OpSpec):
        mode = entry.mode.name.lower()
        return _fmt(entry.fmt) + ("" if mode == "nearest_even" else f"/{mode}")
    if isinstance(entry, Sequential):
        s = f"seq {_fmt(entry.fmt)}"
        if entry.product_fmt is not None and _fmt(entry.product_fmt) != _fmt(entry.fmt):
            s += f" (products {_fmt(entry.product_fmt)})"
        if entry.input_fmt is not None:
            s += f" (inputs {_fmt(entry.input_fmt)})"
        return s
    if isinstance(entry, BlockFMA):
        mode = "rz" if str(entry.out_mode).lower().endswith("toward_zero") else str(entry.out_mode)
        return f"tc{entry.block} F{entry.fraction_bits} {_fmt(entry.out_fmt)}/{mode}"
    if isinstance(entry, Chunked):
        return f"{describe(entry.inner)} -> {_fmt(entry.outer_fmt)}"
    return str(entry)
