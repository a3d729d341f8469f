"""Block-scaled quantization: OCP MX (MXFP8, MXFP6, MXFP4) and NVFP4, 1-D blocks along an axis or 2-D tiles.

A block of ``block`` consecutive elements (or a ``(b0, b1)`` tile) shares one scale ``X`` in ``scale_fmt``; each
element is stored as ``round(v / (X * g), elem_fmt)`` with ``g`` an optional tensor-wide scale (NVFP4's fp32
second level), so that ``v ~ code * X * g``. The scale of a block is its largest magnitude ``amax`` divided by a
target and rounded into ``scale_fmt`` once, from the exact quotient:

* ``"floor"`` — OCP MX v1.0 (section 6.3): ``X = 2**(floor(log2 amax) - emax_elem)``, i.e. ``amax / 2**emax_elem``
  rounded down; the largest elements may exceed the element format and saturate.
* ``"ceil"`` — round ``amax / elem_max`` up (NVIDIA's RCEIL, ``cvt.rp.satfinite.ue8m0``): no element overflows.
* ``"nearest"`` — round ``amax / elem_max`` to nearest, ties to even (NVFP4's ue4m3 scales).

Elements are rounded from the exact quotient ``v / (X * g)`` (the product ``X * g`` is exact in float64) with
``elem_mode``, saturating at the element format's largest value when ``saturate`` is set (the MX spec's rule;
NVFP4 likewise). A block whose ``amax`` is zero gets the scale format's smallest nonnegative value (0, or 2**-127
for e8m0, which has no zero) and zero elements; a block holding NaN or infinity gets a NaN scale and NaN elements,
so the block dequantizes to NaN rather than to a number. A trailing partial block (length not a multiple of
``block``) is scaled by the elements it has.

:class:`BlockFormat` is the quantizer as a value (the presets :data:`MXFP8_E4M3`, ..., :data:`NVFP4`, or
:func:`block_format` by name), so a plan can hold it as an op; :func:`quantize_block` applies one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from simfloat import ops
from simfloat.formats import FloatFormat
from simfloat.formats import format as _format
from simfloat.rounding import RoundingMode, mode_code

__all__ = [
    "SCALE_ROUNDINGS",
    "BlockFormat",
    "BlockQuantized",
    "MXFP4",
    "MXFP6_E2M3",
    "MXFP6_E3M2",
    "MXFP8_E4M3",
    "MXFP8_E5M2",
    "NVFP4",
    "block_format",
    "quantize_block",
]

#: scale rounding name -> (divide amax by 2**emax_elem instead of elem_max, rounding mode of the quotient)
SCALE_RULES = {
    "floor": (True, RoundingMode.DOWN),
    "ceil": (False, RoundingMode.UP),
    "nearest": (False, RoundingMode.NEAREST_EVEN),
}
_SCALE_ALIASES = {"ocp": "floor", "down": "floor", "rceil": "ceil", "up": "ceil", "rne": "nearest"}
SCALE_ROUNDINGS = tuple(SCALE_RULES)


def checked_scale_rounding(name: object) -> str:
    if not isinstance(name, str):
        raise TypeError(f"scale_rounding must be a str, got {type(name).__name__}")
    key = _SCALE_ALIASES.get(name.lower(), name.lower())
    if key not in SCALE_RULES:
        known = ", ".join(sorted(SCALE_RULES) + sorted(_SCALE_ALIASES))
        raise ValueError(f"scale_rounding must be one of {known}; got {name!r}")
    return key


def _block_shape(block: object) -> tuple[int, ...]:
    b = (block,) if isinstance(block, (int, np.integer)) and not isinstance(block, bool) else block
    if not isinstance(b, tuple) or not 1 <= len(b) <= 2:
        raise ValueError(f"block must be a positive int or a tuple of one or two positive ints, got {block!r}")
    for v in b:
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"block must be a positive int or a tuple of one or two positive ints, got {block!r}")
    return tuple(int(v) for v in b)


@dataclass(frozen=True)
class BlockFormat:
    """A block-scaled quantizer (a value: plans hold it as an op; :meth:`quantize` applies it).

    Attributes:
        elem_fmt: element format (e.g. ``"float8_e4m3fn"``, ``"float4_e2m1fn"``).
        block: elements per block along ``axis`` (an int), or a ``(b0, b1)`` tile over two axes.
        scale_fmt: format of the shared scales (``"float8_e8m0fnu"`` for MX, ``"ue4m3"`` for NVFP4).
        scale_rounding: ``"floor"`` (OCP MX), ``"ceil"`` (RCEIL) or ``"nearest"`` (see the module docstring).
        elem_mode: rounding mode of the elements (default nearest-even).
        saturate: elements and scales beyond their format's largest value saturate to it (else they follow
            the format's overflow policy, NaN for e4m3fn and e8m0).
        axis: the blocked axis (an int) or, for a tile, two axes; ``None``: the last one or two axes.
        name: label of the preset (not part of the numerics).

    Raises:
        ValueError / TypeError: an unknown format, mode or scale rounding, a bad block or axis.
    """

    elem_fmt: FloatFormat | str
    block: int | tuple[int, ...]
    scale_fmt: FloatFormat | str = "float8_e8m0fnu"
    scale_rounding: str = "floor"
    elem_mode: RoundingMode | str = "nearest_even"
    saturate: bool = True
    axis: int | tuple[int, ...] | None = None
    name: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        for attr in ("elem_fmt", "scale_fmt"):
            try:
                _format(getattr(self, attr))
            except (TypeError, ValueError) as err:
                raise type(err)(f"BlockFormat.{attr}: {err}") from None
        try:
            mode_code(self.elem_mode)
        except (TypeError, ValueError) as err:
            raise type(err)(f"BlockFormat.elem_mode: {err}") from None
        b = _block_shape(self.block)
        checked_scale_rounding(self.scale_rounding)
        if not isinstance(self.saturate, bool):
            raise TypeError(f"BlockFormat.saturate must be a bool, got {self.saturate!r}")
        if self.axis is not None:
            ax = (self.axis,) if isinstance(self.axis, (int, np.integer)) else self.axis
            if not isinstance(ax, tuple) or len(ax) != len(b) or not all(isinstance(a, (int, np.integer)) for a in ax):
                raise ValueError(
                    f"BlockFormat.axis must name {len(b)} axis/axes for block {self.block!r}, got {self.axis!r}"
                )

    def quantize(self, x: np.ndarray, global_scale: float | str | None = None) -> BlockQuantized:
        """:func:`quantize_block` of ``x`` with this format."""
        return quantize_block(
            x,
            self.elem_fmt,
            block=self.block,
            scale_fmt=self.scale_fmt,
            scale_rounding=self.scale_rounding,
            axis=self.axis,
            global_scale=global_scale,
            elem_mode=self.elem_mode,
            saturate=self.saturate,
        )


@dataclass(frozen=True)
class BlockQuantized:
    """A block-quantized tensor.

    Attributes:
        codes: element values (float64, each a value of ``elem_fmt``), shaped like the input.
        scales: the shared scales (float64 values of ``scale_fmt``), shaped like the input with each blocked axis
            of length ``n`` replaced by ``ceil(n / b)``.
        global_scale: the tensor scale ``g`` (1.0 when none was given).
        elem_fmt, scale_fmt: the formats.
        block: the block shape; axes: the blocked axes (nonnegative).
    """

    codes: np.ndarray
    scales: np.ndarray
    global_scale: float
    elem_fmt: FloatFormat
    scale_fmt: FloatFormat
    block: tuple[int, ...]
    axes: tuple[int, ...]

    def expanded_scales(self) -> np.ndarray:
        """The scale of every element (``scales`` repeated over each block), shaped like ``codes``."""
        return _expand(self.scales, self.axes, self.block, self.codes.shape)

    def dequantize(self) -> np.ndarray:
        """``codes * scale * global_scale`` per element, float64 (exact: each factor has few significant
        bits)."""
        with np.errstate(invalid="ignore"):
            return self.codes * (self.expanded_scales() * self.global_scale)


def _expand(scales: np.ndarray, axes: tuple[int, ...], block: tuple[int, ...], shape: tuple[int, ...]) -> np.ndarray:
    for ax, b in zip(axes, block, strict=True):
        scales = np.repeat(scales, b, axis=ax)
    return scales[tuple(slice(0, n) for n in shape)]


def _axes(axis: object, ndim: int, nb: int) -> tuple[int, ...]:
    if axis is None:
        ax: tuple[object, ...] = tuple(range(-nb, 0))
    elif isinstance(axis, (int, np.integer)) and not isinstance(axis, bool):
        ax = (axis,)
    elif isinstance(axis, tuple):
        ax = axis
    else:
        raise TypeError(f"axis must be an int, a tuple of ints or None, got {type(axis).__name__}")
    if len(ax) != nb:
        raise ValueError(f"axis names {len(ax)} axes but block has {nb} dimension(s)")
    out = []
    for a in ax:
        if isinstance(a, bool) or not isinstance(a, (int, np.integer)) or not -ndim <= a < ndim:
            raise ValueError(f"axis {a!r} is out of range for an array of {ndim} dimension(s)")
        out.append(int(a) % ndim)
    if len(set(out)) != len(out):
        raise ValueError(f"axis names the same axis twice: {axis!r}")
    return tuple(out)


def _block_amax(a: np.ndarray, axes: tuple[int, ...], block: tuple[int, ...]) -> np.ndarray:
    """max |a| over each block (NaN if the block holds a NaN), zero-padding partial blocks."""
    pad = [(0, 0)] * a.ndim
    for ax, b in zip(axes, block, strict=True):
        pad[ax] = (0, -a.shape[ax] % b)
    p = np.pad(np.abs(a), pad)
    shape: list[int] = []
    red = []
    for d in range(p.ndim):
        if d in axes:
            b = block[axes.index(d)]
            shape += [p.shape[d] // b, b]
            red.append(len(shape) - 1)
        else:
            shape.append(p.shape[d])
    return np.max(p.reshape(shape), axis=tuple(red))


def _global(global_scale: object, amax: float, elem: FloatFormat, scale: FloatFormat) -> float:
    if global_scale is None:
        return 1.0
    if isinstance(global_scale, str):
        if global_scale != "auto":
            raise ValueError(f"global_scale must be a positive float, 'auto' or None, got {global_scale!r}")
        if not math.isfinite(amax):
            raise ValueError(f"global_scale='auto' needs a finite tensor, whose largest magnitude is {amax}")
        if amax == 0.0:
            return 1.0
        # NVFP4's tensor scale: amax / (scale max * element max), as float32 (rounded to nearest)
        return float(np.float32(amax / (scale.max * elem.max)))
    if isinstance(global_scale, bool) or not isinstance(global_scale, (int, float, np.floating, np.integer)):
        raise TypeError(f"global_scale must be a positive float, 'auto' or None, got {type(global_scale).__name__}")
    g = float(global_scale)
    if not (math.isfinite(g) and g > 0.0):
        raise ValueError(f"global_scale must be a positive finite number, got {global_scale!r}")
    if float(np.float32(g)) != g:
        raise ValueError(f"global_scale must be a float32 value (the tensor scale is fp32), got {g!r}")
    return g


def quantize_block(
    x: np.ndarray,
    elem_fmt: FloatFormat | str,
    *,
    block: int | tuple[int, ...],
    scale_fmt: FloatFormat | str = "float8_e8m0fnu",
    scale_rounding: str = "floor",
    axis: int | tuple[int, ...] | None = None,
    global_scale: float | str | None = None,
    elem_mode: RoundingMode | str = "nearest_even",
    saturate: bool = True,
) -> BlockQuantized:
    """Quantize ``x`` with one shared scale per block (see the module docstring for the rules).

    Args:
        x: float32 or float64 array of any shape.
        elem_fmt: element format (e.g. ``"e4m3"``, ``"e5m2"``, ``"e2m3"``, ``"e3m2"``, ``"fp4"``).
        block: elements per block along ``axis`` (32 for MX, 16 for NVFP4), or a tile ``(b0, b1)`` such as
            ``(16, 16)`` for 2-D weight blocks over two axes.
        scale_fmt: scale format: ``"float8_e8m0fnu"`` (MX) or ``"ue4m3"`` (NVFP4), or any other format.
        scale_rounding: ``"floor"`` (OCP MX), ``"ceil"`` (RCEIL) or ``"nearest"``.
        axis: blocked axis (int) or two axes for a tile; ``None``: the last axis (the last two for a tile).
        global_scale: the tensor-wide fp32 scale ``g`` (NVFP4's second level), ``"auto"`` for
            ``float32(amax / (scale_fmt.max * elem_fmt.max))`` over the whole tensor, or ``None`` (1.0).
        elem_mode: rounding mode of the elements.
        saturate: saturate elements and scales at their format's largest value (MX and NVFP4 do).

    Returns:
        :class:`BlockQuantized` with ``codes`` shaped like ``x`` and ``scales`` shaped like ``x`` with each
        blocked axis of length n replaced by ceil(n / b); ``dequantize()`` gives ``codes * scale * g``.

    Raises:
        TypeError: ``x`` is not a float32/float64 array, or an argument of the wrong type.
        ValueError: an unknown format, mode or scale rounding; a bad block, axis or global scale.
    """
    if not isinstance(x, np.ndarray) or x.dtype not in (np.float32, np.float64):
        what = x.dtype if isinstance(x, np.ndarray) else type(x).__name__
        raise TypeError(f"x must be a float32 or float64 numpy array, got {what}")
    if x.ndim == 0:
        raise ValueError("x must have at least one dimension")
    ef = _format(elem_fmt)
    sf = _format(scale_fmt)
    bshape = _block_shape(block)
    axes = _axes(axis, x.ndim, len(bshape))
    by_emax, smode = SCALE_RULES[checked_scale_rounding(scale_rounding)]
    em = int(mode_code(elem_mode))
    if not isinstance(saturate, bool):
        raise TypeError(f"saturate must be a bool, got {saturate!r}")
    if saturate:
        ef_r = ef.replace(overflow="saturate", name=ef.name)
        sf_r = sf.replace(overflow="saturate", name=sf.name)
    else:
        ef_r, sf_r = ef, sf
    x64 = x.astype(np.float64, copy=False)
    with np.errstate(invalid="ignore"):
        tensor_amax = float(np.max(np.abs(x64))) if x64.size else 0.0
    g = _global(global_scale, tensor_amax, ef, sf)
    amax = _block_amax(x64, axes, bshape)
    target = math.ldexp(1.0, ef.emax) if by_emax else ef.max
    finite = np.isfinite(amax)
    zero = amax == 0.0
    live = finite & ~zero
    # the exact quotient amax / (target * g), rounded once into the scale format (target * g is exact)
    scales = np.where(live, ops.div(np.where(live, amax, 1.0), target * g, sf_r, smode), 0.0)
    smallest = 0.0 if sf.zero else sf.tiny
    scales = np.where(zero, smallest, scales)
    scales = np.where(finite, scales, np.nan)
    per = _expand(scales, axes, bshape, x.shape) * g  # exact: a scale times an fp32 value
    ok = per > 0.0  # zero scales (all-zero blocks, or underflow into a scale format with zero) give zero codes
    with np.errstate(invalid="ignore", divide="ignore"):
        codes = ops.div(x64, np.where(ok, per, 1.0), ef_r, em)
        codes = np.where(ok, codes, x64 * 0.0)  # signed zeros (inf * 0 is NaN: those blocks are NaN anyway)
    codes = np.where(np.isnan(per), np.nan, codes)
    return BlockQuantized(codes, scales, g, ef, sf, bshape, axes)


MXFP8_E4M3 = BlockFormat("float8_e4m3fn", 32, name="mxfp8_e4m3")
MXFP8_E5M2 = BlockFormat("float8_e5m2", 32, name="mxfp8_e5m2")
MXFP6_E2M3 = BlockFormat("float6_e2m3fn", 32, name="mxfp6_e2m3")
MXFP6_E3M2 = BlockFormat("float6_e3m2fn", 32, name="mxfp6_e3m2")
MXFP4 = BlockFormat("float4_e2m1fn", 32, name="mxfp4")
NVFP4 = BlockFormat("float4_e2m1fn", 16, scale_fmt="ue4m3", scale_rounding="nearest", name="nvfp4")

_PRESETS = {p.name: p for p in (MXFP8_E4M3, MXFP8_E5M2, MXFP6_E2M3, MXFP6_E3M2, MXFP4, NVFP4)}


def block_format(name: str) -> BlockFormat:
    """A preset by name: ``"mxfp8_e4m3"``, ``"mxfp8_e5m2"``, ``"mxfp6_e2m3"``, ``"mxfp6_e3m2"``, ``"mxfp4"``
    (OCP MX v1.0: 32-element blocks, e8m0 scales rounded down) or ``"nvfp4"`` (16-element blocks, ue4m3 scales
    rounded to nearest; give it a ``global_scale``).

    Raises:
        ValueError: an unknown name.
    """
    key = name.lower() if isinstance(name, str) else name
    if key not in _PRESETS:
        raise ValueError(f"unknown block format {name!r}; known: {', '.join(_PRESETS)}")
    return _PRESETS[key]
