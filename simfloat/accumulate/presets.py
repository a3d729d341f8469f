"""The tensor-core presets: one :class:`~simfloat.accumulate.BlockFMA` per GPU architecture, MMA instruction,
operand format and output format, built from a table of instruction parameters.

The table (:data:`_INSTRUCTIONS`) holds, per architecture and instruction, what the hardware does in the terms
MMA-Sim (Xie et al. 2025) models it with: the fraction bits F kept below the largest exponent, the bytes of k
one step sums (block = bytes / operand size), the least alignment exponent (``e_zero``) for fp32 and fp16
results, and for fp8 operands their F and how the accumulator enters a step. A preset is read off the table;
nothing in it depends on which data set checks it. The measurements of Khattak and Mikaitis ("Accurate Models of
NVIDIA Tensor Cores", arXiv 2512.07004: V100, A100, Ada, H100, B200; tests/fixtures/tensor_cores) and MMA-Sim
(tests/core/test_tensor_core_mmasim.py) check them bit for bit; docs/results/tensor-cores.md has the table.
"""

from __future__ import annotations

from typing import Any, Literal, overload

from simfloat.accumulate.models import BlockFMA, Chunked, Interleaved
from simfloat.formats import FloatFormat
from simfloat.formats import format as _format

__all__ = ["INSTRUCTIONS", "VARIANTS", "fp8_mma_sync", "tensor_core"]

_E8M13 = FloatFormat("e8m13", 8, 13)

_ARCHS = {
    "sm70": "sm70",
    "v100": "sm70",
    "volta": "sm70",
    "sm80": "sm80",
    "a100": "sm80",
    "ampere": "sm80",
    "sm86": "sm80",
    "sm89": "sm89",
    "ada": "sm89",
    "l40": "sm89",
    "sm90": "sm90",
    "h100": "sm90",
    "h200": "sm90",
    "hopper": "sm90",
    "sm100": "sm100",
    "b200": "sm100",
    "blackwell": "sm100",
    "sm120": "sm120",
    "rtx_blackwell": "sm120",
}


def _row(f: int, nbytes: int, zero32: int, zero16: int, **fp8: Any) -> dict[str, Any]:
    """One instruction's parameters. fp8 keys: ``fp8_f`` (F of fp8 operands; None: no fp8 kind), ``fp8_add``
    (``"fused"`` or the rounding of the accumulator added after the step), ``fp8_f16`` (fp16 results of fp8
    operands: ``True`` the fp8 datapath with F = ``fp8_f`` rounded to fp16, ``"fp16"`` the instruction's fp16
    MMA on the operands converted to fp16, ``False`` no model), ``f8f6f4`` (the fp6/fp4 kinds and the
    block-scaled kinds exist), ``fp16_only`` (no bf16/tf32 kinds)."""
    base = {"fp8_f": None, "fp8_add": "fused", "fp8_f16": False, "f8f6f4": False, "fp16_only": False}
    return {"f": f, "bytes": nbytes, "zero32": zero32, "zero16": zero16, **base, **fp8}


# (arch, instruction) -> parameters. MMA-Sim's table for every kind it models; B200's mma.sync on fp8 and the
# fp8 kinds of H100's mma.sync from Khattak & Mikaitis' measurements (MMA-Sim has neither). Their fp16 results
# ("fp16"): the fp8 operands converted to fp16 (exact) and each k32 instruction run as two of the arch's fp16
# k16 steps with pairs of k dealt alternately (Interleaved(chunk 32, group 2): the order of Triton's own fp16
# lowering of fp8 dots, fp8_mma_sync; presumably the fp8 fragment's registers split into two fp16 fragments),
# from zero, fp16 results; C added after in one fp16 addition (round to nearest even), as B200's mma.sync adds
# C after the step for fp32 results. Measured: every row of H100's and B200's fp8 -> fp16 data.
_INSTRUCTIONS: dict[tuple[str, str], dict[str, Any]] = {
    ("sm70", "mma.sync"): _row(23, 8, -131, -19, fp16_only=True),
    ("sm80", "mma.sync"): _row(24, 16, -132, -20),
    ("sm89", "mma.sync"): _row(24, 16, -132, -20, fp8_f=13, fp8_f16=True),
    ("sm90", "wgmma"): _row(25, 32, -133, -21, fp8_f=13, fp8_f16=True),
    ("sm90", "mma.sync"): _row(25, 32, -133, -21, fp8_f=13, fp8_f16="fp16"),
    ("sm100", "tcgen05"): _row(25, 32, -133, -21, fp8_f=25, fp8_f16=True, f8f6f4=True),
    ("sm100", "mma.sync"): _row(25, 32, -133, -21, fp8_f=25, fp8_add="nearest_even", fp8_f16="fp16"),
    ("sm120", "mma.sync"): _row(25, 32, -133, -21, fp8_f=25, fp8_f16=True, f8f6f4=True),
}
#: per architecture its MMA instructions, the default (the one a preset models unless told) first
INSTRUCTIONS: dict[str, tuple[str, ...]] = {
    "sm70": ("mma.sync",),
    "sm80": ("mma.sync",),
    "sm89": ("mma.sync",),
    "sm90": ("wgmma", "mma.sync"),
    "sm100": ("tcgen05", "mma.sync"),
    "sm120": ("mma.sync",),
}
_F8F6F4 = ("float8_e4m3fn", "float8_e5m2", "float6_e3m2fn", "float6_e2m3fn", "float4_e2m1fn")
_FP8 = ("float8_e4m3fn", "float8_e5m2")
_BLOCK_KINDS = ("mxf8f6f4", "mxf4", "nvf4")
VARIANTS = ("mmasim", "fasi2021", "h200")


def fp8_mma_sync(arch: str = "sm90") -> Interleaved:
    """``tl.dot`` of fp8 (e4m3/e5m2) operands where Triton issues mma.sync instead of an fp8 MMA (sm_90 with
    M < 64): the operands are converted to fp16 (exactly) and each 32-wide chunk of k is split into two k16
    mma.sync.m16n8k16.f16 steps, in alternating pairs of k (:class:`Interleaved` over the sm90 fp16 preset).

    This is Triton's lowering, not the PTX fp8 ``mma.sync`` (``tensor_core("sm90", "e4m3",
    instruction="mma.sync")``). Measured on the H200 probe ``e4m3_16_32_32`` (tests/fixtures/gpu/h200/probes):
    this model reproduces every output, where the fp16 preset in plain k order misses some; e5m2 and K > 32
    follow the same conversion but were not probed.

    Args:
        arch: ``"sm90"`` (the only architecture measured).

    Returns:
        ``Interleaved(tensor_core("sm90", "fp16"), chunk=32, group=2)``; K must be a multiple of 32.
    """
    if not isinstance(arch, str) or arch.lower() != "sm90":
        raise ValueError(f"fp8_mma_sync: only arch 'sm90' is modelled, got {arch!r}")
    return Interleaved(tensor_core("sm90", "fp16"), chunk=32, group=2)


def _resolve(arch: object, instruction: object, variant: object) -> tuple[str, str, str]:
    if not isinstance(arch, str) or arch.lower() not in _ARCHS:
        raise ValueError(f"unknown tensor-core arch {arch!r}; known: {', '.join(sorted(set(_ARCHS.values())))}")
    a_key = _ARCHS[arch.lower()]
    instrs = INSTRUCTIONS[a_key]
    ins = instrs[0] if instruction is None else instruction
    if ins not in instrs:
        raise ValueError(f"tensor_core: {a_key} has no instruction {instruction!r}; it has {', '.join(instrs)}")
    default = "h200" if a_key == "sm90" else "mmasim"
    var = default if variant is None else variant
    allowed = {"sm90": ("h200", "mmasim"), "sm80": ("mmasim", "fasi2021")}.get(a_key, ("mmasim",))
    if var not in allowed:
        raise ValueError(f"tensor_core: variant {variant!r} is not one of {allowed} for {a_key}")
    return a_key, str(ins), str(var)


@overload
def tensor_core(
    arch: str,
    input_format: str | FloatFormat,
    b_format: str | FloatFormat | None = None,
    *,
    kind: str | None = None,
    variant: str | None = None,
    out_format: Literal["fp32", "float32"] = "fp32",
    instruction: str | None = None,
) -> BlockFMA: ...


@overload
def tensor_core(
    arch: str,
    input_format: str | FloatFormat,
    b_format: str | FloatFormat | None = None,
    *,
    kind: str | None = None,
    variant: str | None = None,
    out_format: str | FloatFormat,
    instruction: str | None = None,
) -> BlockFMA | Interleaved: ...


def tensor_core(
    arch: str,
    input_format: str | FloatFormat,
    b_format: str | FloatFormat | None = None,
    *,
    kind: str | None = None,
    variant: str | None = None,
    out_format: str | FloatFormat = "fp32",
    instruction: str | None = None,
) -> BlockFMA | Interleaved:
    """Tensor-core accumulation models (every difference between architectures and instructions is a field
    value read off the instruction table).

    Args:
        arch: ``"sm70"`` (V100), ``"sm80"`` (A100), ``"sm89"`` (Ada), ``"sm90"`` (H100/H200), ``"sm100"``
            (B200) or ``"sm120"`` (RTX Blackwell); names such as ``"v100"``, ``"a100"``, ``"hopper"``,
            ``"blackwell"`` too.
        input_format: operand format (the A operand's): fp16 (every arch), bf16 and tf32 (fp32 operands; sm80
            and later), e4m3/e5m2 (sm89 and later), e3m2/e2m3/e2m1 (``kind::f8f6f4``: sm100 tcgen05, sm120).
        b_format: the B operand's format where it differs (mixed f8f6f4 kinds); default ``input_format``.
        kind: ``None`` (plain MMA), or a block-scaled kind of sm100 (tcgen05) / sm120: ``"mxf8f6f4"``
            (fp8/fp6/fp4 elements, ue8m0 scales per 32 k), ``"mxf4"`` (e2m1, ue8m0 per 32 k), ``"nvf4"``
            (e2m1, ue4m3 per 16 k). Block-scaled models run through :func:`matmul_scaled`.
        variant: ``None`` for the default. sm90: ``"h200"`` (the default: measured bit for bit on an H200,
            tests/fixtures/gpu/h200) or ``"mmasim"`` (adds MMA-Sim's accumulator clamps, ``acc_emin`` = the
            output format's emin and ``zero_exp`` = e_zero: they differ from the default only where the
            accumulator and every product of a step lie below the output format's least normal). sm80:
            ``"mmasim"`` (the default, MMA-Sim's Ampere model: alignment by the operands' exponent sum) or
            ``"fasi2021"`` (the published model of Fasi et al. 2021: alignment by each product's exponent, no
            clamps; fp32 results only). Other archs: ``"mmasim"`` only.
        out_format: ``"fp32"`` (default) or ``"fp16"``: the format of C and D. fp16 results exist for fp16
            and fp8 operands (and the f8f6f4 kinds), never for bf16/tf32 or block-scaled kinds; c must then be
            an fp16 value.
        instruction: the MMA instruction modelled; ``None``: the arch's default, the first of
            :data:`INSTRUCTIONS` (``"mma.sync"`` on sm70, sm80, sm89, sm120 -- ``wmma`` compiles to it --;
            ``"wgmma"`` on sm90, also with ``"mma.sync"``; ``"tcgen05"`` on sm100, also with
            ``"mma.sync"``). They differ only for fp8: sm100's ``mma.sync`` sums a step's products from zero
            (F=25, truncated to fp32) and adds the accumulator in one round-to-nearest-even addition
            (``acc_add``), where tcgen05 aligns the accumulator with the products; the fp6/fp4 and
            block-scaled kinds are tcgen05's on sm100.

    Returns:
        The :class:`BlockFMA` model. Per MMA-Sim: sm70 sums 8 bytes of k per step (4 fp16) with F=23; sm80/sm89
        16 bytes (8 fp16/bf16, 4 tf32, 16 fp8) with F=24 (fp8 on sm89: F=13, fp32 results truncated to e8m13);
        sm90 32 bytes (16, 8, 32) with F=25 (fp8: F=13, e8m13); sm100/sm120 32 bytes with F=25 for every kind,
        fp8/fp6/fp4 included; mxf8f6f4 blocks of 32 with the scales' exponents added to the products'; mxf4/nvf4
        steps of 64 k, each group of 16 products summed exactly, scaled and aligned by the scales' exponents
        with F=35. fp32 results are rounded toward zero, fp16 results to nearest even (the same F; e_zero
        -19, -20, -21 for sm70, sm80/sm89, sm90 and later).

        fp16 results of fp8 operands on sm90's and sm100's ``mma.sync``: the fp8 operands converted to fp16 and
        each k32 instruction run as two of the arch's fp16 k16 steps (F=25, fp16 results) in the fragment's k
        order (pairs of k alternating between the steps), from zero, C added after in one fp16 addition
        rounded to nearest even: an :class:`Interleaved` (chunk 32, groups of 2) of a :class:`Chunked` (chunks
        of 32, fp16 outer sum) of the fp16 preset; K must be a multiple of 32. :func:`matmul` and :func:`dot`
        run it; attention plans take BlockFMA, Sequential and Chunked models only.

    Raises:
        ValueError: an unknown arch, format, kind, variant, output format or instruction, or a combination the
            architecture lacks.
    """
    a_key, ins, var = _resolve(arch, instruction, variant)
    d = _INSTRUCTIONS[(a_key, ins)]
    fa = _format(input_format)
    fb = _format(b_format) if b_format is not None else fa
    out = _format(out_format)
    if out.name not in ("float32", "float16"):
        raise ValueError(f"tensor_core: out_format must be 'fp32' or 'fp16', got {out_format!r}")
    fp16_out = out.name == "float16"
    if kind is not None and kind not in _BLOCK_KINDS:
        raise ValueError(f"tensor_core: kind must be None or one of {_BLOCK_KINDS}, got {kind!r}")
    if kind is not None and not d["f8f6f4"]:
        raise ValueError(f"tensor_core: block-scaled kind {kind!r} needs sm100 (tcgen05) or sm120, got {a_key} {ins}")
    if kind is not None and fp16_out:
        raise ValueError(f"tensor_core: block-scaled kind {kind!r} has fp32 results only")
    names = (fa.name, fb.name)
    clamps: dict[str, Any] = {}
    if var == "mmasim":
        clamps = {"acc_emin": out.emin, "zero_exp": d["zero16"] if fp16_out else d["zero32"]}
    # the output rounding: fp32 toward zero, fp16 to nearest even
    res: dict[str, Any] = {"out_fmt": out.name, "out_mode": "nearest_even"} if fp16_out else {}
    if kind in ("mxf4", "nvf4"):
        if names != ("float4_e2m1fn", "float4_e2m1fn"):
            raise ValueError(f"tensor_core: kind {kind!r} takes e2m1 operands, got {fa.name} and {fb.name}")
        return BlockFMA(
            64,
            35,
            align="scale",
            acc_emin=-126,
            zero_exp=-139,
            scale_block=32 if kind == "mxf4" else 16,
            scale_emin=-127 if kind == "mxf4" else -6,
            group=16,
        )
    if kind == "mxf8f6f4":
        if not set(names) <= set(_F8F6F4):
            raise ValueError(f"tensor_core: kind 'mxf8f6f4' takes fp8/fp6/fp4 operands, got {fa.name}, {fb.name}")
        return BlockFMA(
            32,
            25,
            align="exponent_sum",
            operand_emin=fa.emin,
            operand_emin_b=fb.emin if fb != fa else None,
            scale_block=32,
            scale_emin=-127,
            **clamps,
        )
    if fa != fb and not set(names) <= set(_F8F6F4):
        raise ValueError(f"tensor_core: mixed operand formats exist only among fp8/fp6/fp4, got {names}")
    if d["fp16_only"] and fa.name != "float16":
        raise ValueError(f"tensor_core: {a_key} has a tensor-core kind for fp16 operands only, got {fa.name!r}")
    if fp16_out and fa.name not in ("float16",) + _F8F6F4:
        raise ValueError(f"tensor_core: {fa.name} operands have fp32 results only (out_format='fp16' is for fp16/fp8)")
    if var == "fasi2021":
        if fp16_out:
            raise ValueError("tensor_core: variant 'fasi2021' models fp32 results only")
        if fa.name in ("float32", "tfloat32"):
            return BlockFMA(4, 24, input_fmt="tfloat32", input_mode="toward_zero")
        if fa.name in ("bfloat16", "float16"):
            return BlockFMA(8, 24)
        raise ValueError(f"tensor_core: no {a_key} preset for {fa.name!r} (variant fasi2021)")
    if fa.name in ("float32", "tfloat32"):
        return BlockFMA(
            d["bytes"] // 4, d["f"], input_fmt="tfloat32", input_mode="toward_zero", align="exponent_sum",
            operand_emin=-126, **clamps,
        )  # fmt: skip
    if fa.name in ("bfloat16", "float16"):
        return BlockFMA(d["bytes"] // 2, d["f"], align="exponent_sum", operand_emin=fa.emin, **res, **clamps)
    if set(names) <= set(_F8F6F4):
        small = not set(names) <= set(_FP8)
        if d["fp8_f"] is None or (small and not d["f8f6f4"]):
            raise ValueError(f"tensor_core: {a_key} {ins} has no tensor-core kind for {fa.name} x {fb.name}")
        if fp16_out and not d["fp8_f16"]:
            raise ValueError(f"tensor_core: no model of {a_key} {ins}'s fp16 results for {fa.name} operands")
        if fp16_out and d["fp8_f16"] == "fp16":
            step = tensor_core(a_key, "float16", out_format="fp16", instruction=ins, variant=variant)
            assert isinstance(step, BlockFMA)  # fp16 operands: always a BlockFMA
            two = Chunked(chunk=32, inner=step, outer_fmt="float16", outer_mode="nearest_even")
            return Interleaved(two, chunk=32, group=2)
        f8 = d["fp8_f"]
        if f8 == 13 and not fp16_out:  # the fp32 result truncated to 13 fraction bits
            res = {"out_fmt": _E8M13, "out_mode": "toward_zero"}
        if d["fp8_add"] != "fused":
            res["acc_add"] = d["fp8_add"]
        return BlockFMA(
            d["bytes"],
            f8,
            align="exponent_sum",
            operand_emin=fa.emin,
            operand_emin_b=fb.emin if fb != fa else None,
            **res,
            **clamps,
        )
    raise ValueError(f"no tensor-core preset for input format {fa.name!r} on {a_key}")
