"""The kernel kinds of the validation campaign, one record each: what a config of the kind may hold, how its
Triton kernel runs, which emulator plan models it, how the emulator runs it and how its outputs are compared.

A kind is a row of :data:`KINDS`; the grid (:mod:`simfloat_gpu.campaign.grid`), the runs
(:mod:`simfloat_gpu.campaign.running`), the comparison (:mod:`simfloat_gpu.campaign.compare`) and the fixtures
(:mod:`simfloat_gpu.campaign.fixtures`) read the row instead of testing ``cfg.kind``. Adding a kernel to the
campaign is one more row (and its configs in :func:`simfloat_gpu.campaign.grid.grid`).

The plan families a flash config is compared under (``<family>-<fmt>`` presets, or a hardware profile
registered by :func:`use_hardware`) live here too: they are the flash kind's plans.

Imports only the standard library at import time: torch, triton, the kernels and simfloat are loaded where used.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

__all__ = [
    "KINDS",
    "KernelKind",
    "PLAN_FAMILIES",
    "INT8_VARIANTS",
    "SAGE_VARIANTS",
    "family_names",
    "known_family",
    "kind_of",
    "profile_of",
    "use_hardware",
]

#: emulator plan families a flash config is compared under (``<family>-<fmt>`` presets)
PLAN_FAMILIES = ("triton", "h200")
#: hardware profiles registered as plan families by :func:`use_hardware` (family = the profile's name)
_PROFILES: dict[str, Any] = {}

#: variants of the INT-FlashAttention kernel (simfloat_gpu.kernels.int8_attention)
INT8_VARIANTS = ("int8", "half-int8")
#: variants of the SageAttention-style kernel (simfloat_gpu.kernels.sage_attention), by emulator preset
SAGE_VARIANTS = ("sage2-int8-fp8",)


class Config(Protocol):
    """What a kind reads of a config (:class:`simfloat_gpu.campaign.grid.Config`, which checks its fields
    against the kind's row)."""

    @property
    def kind(self) -> str: ...

    @property
    def fmt(self) -> str: ...

    @property
    def block_m(self) -> int: ...

    @property
    def block_n(self) -> int: ...

    @property
    def causal(self) -> bool: ...

    @property
    def out(self) -> str: ...

    @property
    def variant(self) -> str: ...

    @property
    def row_sum(self) -> str: ...

    @property
    def precision(self) -> str: ...


def use_hardware(profile: Any) -> str:
    """Register a hardware profile (:class:`simfloat.profiles.HardwareProfile`, a shipped name or a profile
    file) as a plan family of this process: flash configs compared under the family (its name) use
    ``plan("triton-<fmt>", hardware=profile)``; a profile named like a built-in family replaces it.
    Returns the family name.

    Raises:
        ValueError: not a valid profile (see :func:`simfloat.profiles.load_profile`).
    """
    from simfloat.profiles import load_profile

    prof = load_profile(profile)
    _PROFILES[prof.name] = prof
    return prof.name


def known_family(family: str) -> bool:
    """Whether ``family`` is a built-in plan family or a profile registered by :func:`use_hardware`."""
    return family in PLAN_FAMILIES or family in _PROFILES


def family_names() -> tuple[str, ...]:
    """The plan families of this process: the built-in ones, then the registered profiles."""
    return PLAN_FAMILIES + tuple(_PROFILES)


def profile_of(family: str) -> Any:
    """The hardware profile registered as ``family``, or None (a built-in family)."""
    return _PROFILES.get(family)


def _host(t: Any) -> np.ndarray:
    return t.float().cpu().numpy()


# ----------------------------------------------------------------------------------------------------
# flash: simfloat_gpu.kernels.flash_attention against simfloat.attention.flash
# ----------------------------------------------------------------------------------------------------


def run_flash(cfg: Config, q: Any, k: Any, v: Any, out_dtype: Any) -> tuple[Any, Any, Any]:
    """The Triton flash kernel on torch tensors under ``cfg``'s tile, mask and dot precision (fp32 inputs:
    ``cfg.precision``; otherwise the kernel's default): (o in ``out_dtype``, m, l)."""
    from simfloat_gpu.kernels.flash_attention import flash_attention

    o, m, l = flash_attention(  # noqa: E741
        q,
        k,
        v,
        causal=cfg.causal,
        block_m=cfg.block_m,
        block_n=cfg.block_n,
        return_stats=True,
        out_dtype=out_dtype,
        input_precision=cfg.precision or None,
    )
    return o, m, l


def _flash_kernel(cfg: Config, tq: Any, tk: Any, tv: Any, device: str, fp32_too: bool) -> dict[str, np.ndarray]:
    import torch

    res: dict[str, np.ndarray] = {}
    outs = ["fp32"] if cfg.out == "fp32" else (["low", "fp32"] if fp32_too else ["low"])
    for which in outs:
        o, m, l = run_flash(cfg, tq, tk, tv, torch.float32 if which == "fp32" else tq.dtype)  # noqa: E741
        if which == cfg.out:
            res["out"], res["m"], res["l"] = _host(o), _host(m), _host(l)
        if which == "fp32":
            res["out32"] = _host(o)
    return res


def _flash_plan(cfg: Config, family: str) -> str:
    if not known_family(family):
        raise ValueError(f"unknown plan family {family!r}; families: {', '.join(family_names())}")
    return f"triton-{cfg.fmt}@{family}" if family in _PROFILES else f"{family}-{cfg.fmt}"


def _flash_emulator(
    cfg: Config, q: np.ndarray, k: np.ndarray, v: np.ndarray, out: str, family: str, plan: Any
) -> dict[str, np.ndarray]:
    import simfloat.attention as A

    if plan is not None:
        pl = plan
    elif family in _PROFILES:
        pl = A.plan(f"triton-{cfg.fmt}", hardware=_PROFILES[family])
    else:
        pl = A.plan(_flash_plan(cfg, family))
    if out == "fp32" and plan is None:
        pl = pl.replace(out="float32")
    o, m, l = A.flash(  # noqa: E741
        q, k, v, plan=pl, block_m=cfg.block_m, block_n=cfg.block_n, causal=cfg.causal, return_stats=True
    )
    return {"out": o, "m": m, "l": l}


# ----------------------------------------------------------------------------------------------------
# int8: simfloat_gpu.kernels.int8_attention against simfloat.attention.int8_flash
# ----------------------------------------------------------------------------------------------------

#: (variant, row sum) -> the emulator's int8 preset
_INT8_PRESETS = {
    ("int8", "reference"): "int8-reference",
    ("int8", "consistent"): "int8-consistent",
    ("half-int8", "reference"): "half-int8",
    ("half-int8", "consistent"): "half-int8-consistent",
}


def _int8_kernel(cfg: Config, tq: Any, tk: Any, tv: Any, device: str, fp32_too: bool) -> dict[str, np.ndarray]:
    from simfloat_gpu.kernels.int8_attention import int8_attention

    o, m, l = int8_attention(  # noqa: E741
        tq,
        tk,
        tv,
        block_m=cfg.block_m,
        block_n=cfg.block_n,
        causal=cfg.causal,
        variant=cfg.variant,
        row_sum=cfg.row_sum,
        return_stats=True,
    )
    return {"out": _host(o), "m": _host(m), "l": _host(l)}


def _int8_plan(cfg: Config, family: str) -> str:
    return _INT8_PRESETS[cfg.variant, cfg.row_sum]


def _int8_emulator(
    cfg: Config, q: np.ndarray, k: np.ndarray, v: np.ndarray, out: str, family: str, plan: Any
) -> dict[str, np.ndarray]:
    from simfloat.attention import int8_flash

    o, m, l = int8_flash(  # noqa: E741
        q, k, v, plan=_int8_plan(cfg, family), block_m=cfg.block_m, block_n=cfg.block_n, causal=cfg.causal,
        return_stats=True,
    )  # fmt: skip
    return {key: np.asarray(x, dtype=np.float64) for key, x in (("out", o), ("m", m), ("l", l))}


# ----------------------------------------------------------------------------------------------------
# sage: simfloat_gpu.kernels.sage_attention against simfloat.attention.quant_flash
# ----------------------------------------------------------------------------------------------------


def _sage_kernel(cfg: Config, tq: Any, tk: Any, tv: Any, device: str, fp32_too: bool) -> dict[str, np.ndarray]:
    import torch

    from simfloat.attention import mean_key, plan
    from simfloat_gpu.kernels.sage_attention import sage_attention

    km = mean_key(_host(tk), plan(cfg.variant).k_smooth or "float32")  # the emulator's mean key
    o, m, l = sage_attention(  # noqa: E741
        tq,
        tk,
        tv,
        km=torch.from_numpy(km.astype(np.float32)).to(device),
        block_m=cfg.block_m,
        block_n=cfg.block_n,
        causal=cfg.causal,
        return_stats=True,
    )
    return {"out": _host(o), "m": _host(m), "l": _host(l)}


def _sage_plan(cfg: Config, family: str) -> str:
    return cfg.variant


def _sage_emulator(
    cfg: Config, q: np.ndarray, k: np.ndarray, v: np.ndarray, out: str, family: str, plan: Any
) -> dict[str, np.ndarray]:
    import simfloat.attention as A

    o, m, l = A.quant_flash(  # noqa: E741
        q, k, v, plan=cfg.variant, block_m=cfg.block_m, block_n=cfg.block_n, causal=cfg.causal, return_stats=True
    )
    return {"out": o, "m": m, "l": l}


# ----------------------------------------------------------------------------------------------------
# the table
# ----------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class KernelKind:
    """One kernel kind of the campaign.

    Attributes:
        name: the kind (``Config.kind``).
        variants: the values ``Config.variant`` may take (empty: the kind has no variants, ``variant`` is "").
        requirement: the error message of a config of the kind with another variant or output (quantized
            kernels: fp16 outputs only).
        fp32_inputs: whether fp32 inputs (with a dot ``precision``) are configs of the kind.
        fp32_output: whether the kernel also writes an fp32 output (compared as ``out32``) besides the output
            in the input format.
        every_family: whether a fixture is compared under every plan family asked for (flash), or once under
            the kind's own preset (quantized kernels: the family does not change their plan).
        label: the kind's part of a config id.
        kernel: ``kernel(cfg, q, k, v, device, fp32_too)`` runs the Triton kernel on torch tensors; returns
            float32 numpy arrays ``out``, ``m``, ``l`` and, where it writes one, ``out32``.
        plan: ``plan(cfg, family)``, the emulator plan's name for a config under a plan family.
        emulator: ``emulator(cfg, q, k, v, out, family, plan)`` runs the emulator (``out``: "fp32" or "low";
            ``plan``: a given :class:`simfloat.attention.Plan` or None); returns ``out``, ``m``, ``l``.
    """

    name: str
    variants: tuple[str, ...]
    requirement: str
    fp32_inputs: bool
    fp32_output: bool
    every_family: bool
    label: Callable[[Config], str]
    kernel: Callable[..., dict[str, np.ndarray]]
    plan: Callable[[Config, str], str]
    emulator: Callable[..., dict[str, np.ndarray]]


#: every kernel kind, by name
KINDS: dict[str, KernelKind] = {
    k.name: k
    for k in (
        KernelKind(
            "flash",
            variants=(),
            requirement="",
            fp32_inputs=True,
            fp32_output=True,
            every_family=True,
            label=lambda cfg: "flash",
            kernel=_flash_kernel,
            plan=_flash_plan,
            emulator=_flash_emulator,
        ),
        KernelKind(
            "int8",
            variants=INT8_VARIANTS,
            requirement="int8 configs need variant 'int8' or 'half-int8' and out 'low' (fp16)",
            fp32_inputs=False,
            fp32_output=False,
            every_family=False,
            label=lambda cfg: f"{cfg.variant}-{cfg.row_sum[:3]}",
            kernel=_int8_kernel,
            plan=_int8_plan,
            emulator=_int8_emulator,
        ),
        KernelKind(
            "sage",
            variants=SAGE_VARIANTS,
            requirement=f"sage configs need variant one of {SAGE_VARIANTS} and out 'low' (fp16)",
            fp32_inputs=False,
            fp32_output=False,
            every_family=False,
            label=lambda cfg: cfg.variant,
            kernel=_sage_kernel,
            plan=_sage_plan,
            emulator=_sage_emulator,
        ),
    )
}


def kind_of(cfg: Config) -> KernelKind:
    """The :class:`KernelKind` of a config."""
    return KINDS[cfg.kind]
