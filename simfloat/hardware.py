"""Hardware-measured models of GPU operations (NVIDIA H200, sm_90; measured with ``simfloat_gpu/campaign/probes/``).

* :func:`ex2_approx_f32` / :func:`ex2_approx`: the H200's ``ex2.approx.ftz.f32`` (SASS ``MUFU.EX2``), bit for
  bit on the probes (docs/results/h200-validation.md). The unit works in sign-magnitude fixed point:
  ``|x| = i + f`` with the fraction ``f`` **truncated** to 23 bits, ``2^x = T-(f) * 2^-i`` for x < 0 and
  ``T+(f) * 2^i`` for x > 0. The two 2^23-entry tables ``T-`` / ``T+`` were read off the binades (-2, -1] and
  [1, 2) (every float32 there) and are stored as offsets of -2..+1 ulp from the correctly rounded 2^-f / 2^f
  (2 bits each, xz: 280 KB, ``simfloat/data/ex2_h200.bin.xz``). How well it reproduces held-out inputs is in
  docs/results/h200-validation.md ("Emulator vs the H200"). Positive inputs outside [1, 2) use the same
  construction without probe data (flash attention only feeds x <= 0).
  ``ftz``: subnormal inputs read as 0 (result 1), results below 2^-126 flushed to +0.
* :func:`ex2_poly_f32` / :func:`ex2_poly`: FlashAttention-4's software exp2 (``ex2_emulation`` of
  ``flash_attn/cute/utils.py``, sm100): ``x`` clamped at -127 (``max.f32``), split by a round-down add into
  ``n = floor(x)`` and the fraction ``f = x - n`` (rounded to nearest), ``2^f`` by a degree-3 polynomial in
  Horner form (three float32 FMAs, coefficients :data:`FA4_EX2_POLY`), then ``n`` added into the exponent field
  as an integer. An algorithm, not a measurement: exact at integers, about 1.4e3 float32 ulps from 2^x at worst.
* :func:`exp_approx`: ``tl.exp`` = ``ex2.approx.f32(rn32(x * 1.4426950f))`` (not flushed).
* :func:`mma_tree_sum`: the order of ``tl.sum(p, axis=1)`` over a tile in the tensor-core (mma / wgmma)
  accumulator layout with 4 warps stacked along M (Triton's layout for the flash kernel's chained dots,
  and for every probe tile with one warp along N): lane t (t = 0..3) sums its columns ``8r + 2t, 8r + 2t + 1``
  (r = 0, 1, ...) left to right, then the butterfly ``shfl.xor 2`` then ``shfl.xor 1``:
  ``(s0 + s2) + (s1 + s3)``; with 2 or 4 warps along N, the warps' sums are combined by the same butterfly.
  Measured with the FPRev design on 64x32, 64x64, 128x64, 64x128, 128x128 tiles
  (wgmma and mma.sync).
"""

from __future__ import annotations

import hashlib
import lzma
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from simfloat._jit import bits_f32, bits_f64, f32_bits, fma32, jit, ljit

__all__ = [
    "H200_EX2_SHA256",
    "Ex2Table",
    "ex2_table_value",
    "h200_ex2",
    "mma_sum_warps",
    "SUM_RULES",
    "SumOrder",
    "ex2_table",
    "ex2_table_names",
    "ex2_table_sha256",
    "pack_ex2_table",
    "register_ex2_table",
    "unpack_ex2_table",
    "ex2_approx_f32",
    "ex2_approx",
    "ex2_values",
    "ex2_ftz_neg",
    "exp_approx",
    "ex2_poly_f32",
    "ex2_poly",
    "FA4_EX2_POLY",
    "add_f32",
    "mma_tree_sum",
    "tl_sum_mma",
    "tl_sum_mma_f32",
    "tl_sum_mma_array",
    "tl_sum_mma_rows_f32",
    "TWO23",
]

TWO23 = 8388608
_DATA = Path(__file__).resolve().parent / "data" / "ex2_h200.bin.xz"
_MAGIC = b"SFEX2H200v1\n"
#: :func:`ex2_table_sha256` of the shipped H200 table (a test checks it against the file)
H200_EX2_SHA256 = "b2f744856b2cd3d80595e30125bff6486a2b84bbeefecca822e3d47fb27168cc"
_LOG2E_F32 = float(np.float32(1.4426950408889634))


def unpack_ex2_table(blob: bytes, what: str = "ex2 table") -> np.ndarray:
    """The int8[2^24] table of an xz blob written by :func:`pack_ex2_table` (read-only).

    Raises:
        ValueError: ``blob`` (named ``what`` in the message) is not such a table.
    """
    try:
        raw = lzma.decompress(blob)
    except lzma.LZMAError as exc:
        raise ValueError(f"{what}: not xz data ({exc})") from None
    if not raw.startswith(_MAGIC):
        raise ValueError(f"{what}: not an ex2 table")
    packed = np.frombuffer(raw, dtype=np.uint8, offset=len(_MAGIC))
    if packed.size != TWO23 // 2:
        raise ValueError(f"{what}: {packed.size} bytes, expected {TWO23 // 2}")
    out = np.empty(packed.size * 4, dtype=np.int8)
    for k in range(4):
        out[k::4] = ((packed >> (2 * k)) & 3).astype(np.int8) - 2
    out.setflags(write=False)
    return out


def _checked_table(table: np.ndarray, what: str) -> np.ndarray:
    t = np.asarray(table)
    if t.shape != (2 * TWO23,) or t.dtype != np.int8:
        raise ValueError(f"{what}: expected int8[{2 * TWO23}], got {t.dtype}{list(t.shape)}")
    if t.size and (int(t.min()) < -2 or int(t.max()) > 1):
        raise ValueError(f"{what}: offsets must lie in -2..+1 ulp, got {int(t.min())}..{int(t.max())}")
    return t


def pack_ex2_table(table: np.ndarray) -> bytes:
    """An ex2 table (int8[2^24]: offsets -2..+1 of T-(f), then T+(f)) as xz bytes, 2 bits per entry.

    Raises:
        ValueError: wrong shape or dtype, or an offset outside -2..+1.
    """
    t = (_checked_table(table, "pack_ex2_table(table)").astype(np.int16) + 2).astype(np.uint8)
    packed = t[0::4] | (t[1::4] << 2) | (t[2::4] << 4) | (t[3::4] << 6)
    return lzma.compress(_MAGIC + packed.tobytes(), preset=9 | lzma.PRESET_EXTREME)


def ex2_table_sha256(table: np.ndarray) -> str:
    """sha256 (hex) of an ex2 table's int8 entries: the identity a hardware profile records."""
    return hashlib.sha256(np.ascontiguousarray(_checked_table(table, "ex2_table_sha256(table)")).tobytes()).hexdigest()


@lru_cache(maxsize=1)
def _h200_table() -> np.ndarray:
    return unpack_ex2_table(_DATA.read_bytes(), str(_DATA.name))


@dataclass(frozen=True)
class Ex2Table:
    """An ex2.approx table as a value (what a plan built from a hardware profile carries in ``exp2_impl``, so
    that it is complete in any process, a pickled copy included): equal and hashed by its name and sha256.

    Attributes:
        name: ``"table-<first 16 hex digits of its sha256>"``. sha256: :func:`ex2_table_sha256` of the table.
        table: int8[2^24] (:func:`ex2_table`'s layout), read-only.
    """

    name: str
    sha256: str
    table: np.ndarray = field(compare=False, repr=False)

    def __str__(self) -> str:
        return self.name

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # the shipped H200 table travels as a reference (every process has the file), any other as its bytes
        if self.sha256 == H200_EX2_SHA256 and self.name == "h200":
            return (h200_ex2, ())
        return (Ex2Table, (self.name, self.sha256, self.table))


@lru_cache(maxsize=1)
def h200_ex2() -> Ex2Table:
    """The shipped H200 table (``simfloat/data/ex2_h200.bin.xz``, ex2.approx.ftz.f32 of an H200) as a value,
    named ``"h200"``: what the h200 profile's plans and a plan's ``exp2_impl="h200"`` carry."""
    return Ex2Table("h200", H200_EX2_SHA256, _h200_table())


def ex2_table_value(table: np.ndarray) -> Ex2Table:
    """An ex2 table as a plan's ``exp2_impl`` value: :func:`h200_ex2` for the shipped H200 table, else an
    :class:`Ex2Table` named ``"table-<first 16 hex digits of its sha256>"``.

    Raises:
        ValueError: wrong shape or dtype, or an offset outside -2..+1.
    """
    sha = ex2_table_sha256(table)
    if sha == H200_EX2_SHA256:
        return h200_ex2()
    t = np.array(table, dtype=np.int8)
    t.setflags(write=False)
    return Ex2Table(f"table-{sha[:16]}", sha, t)


#: the tl.sum orders of a P tile the kernels model: ``"sequential"`` (left to right) and ``"h200-mma"`` (the H200's
#: order in the tensor-core accumulator layout, :func:`mma_tree_sum`); :attr:`SumOrder.code` is the index
SUM_RULES = ("sequential", "h200-mma")


@dataclass(frozen=True)
class SumOrder:
    """The order of ``tl.sum`` over a flash kernel's P tile (the row sum l_ij) as a value: what a plan carries in
    ``sum_order`` (a hardware profile's tl.sum part of the mma layout, or the sequential default), with the
    layout rule that says how many warps share a row (:meth:`warps_n`).

    Attributes:
        rule: one of :data:`SUM_RULES`.
    """

    rule: str = "sequential"

    def __post_init__(self) -> None:
        if self.rule not in SUM_RULES:
            raise ValueError(f"sum order must be one of {SUM_RULES}, got {self.rule!r}")

    def __str__(self) -> str:
        return self.rule

    def __repr__(self) -> str:
        return repr(self.rule)

    @property
    def code(self) -> int:
        """The order as the compiled kernels read it: its index in :data:`SUM_RULES` (0 sequential)."""
        return SUM_RULES.index(self.rule)

    def warps_n(self, block_m: int, head_dim_v: int) -> int:
        """The warps along the keys that the order reduces a row over, for a kernel's requested q tile of
        ``block_m`` rows and value head dim ``head_dim_v``: the mma layout's rule (:func:`mma_sum_warps`) for
        ``"h200-mma"``; 1 for ``"sequential"`` (no layout: one pass left to right)."""
        return mma_sum_warps(block_m, head_dim_v) if self.rule == "h200-mma" else 1


def mma_sum_warps(block_m: int, head_dim_v: int) -> int:
    """The warps along the keys of the mma layout that ``tl.sum`` reduces a flash kernel's P tile in (the
    ``warps_n`` of :func:`mma_tree_sum`): Triton gives the kernel's 4 warps to the keys (4) when the requested
    q tile has fewer than 64 rows and fewer than head_dim_v, else stacks them along the rows (1)."""
    return 4 if (block_m < 64 and block_m < head_dim_v) else 1


_TABLES: dict[str, np.ndarray] = {}


def register_ex2_table(table: np.ndarray) -> str:
    """Make an ex2 table usable by name (``Plan.exp2_impl``, :func:`ex2_table`) and return the name:
    ``"h200"`` if it is the shipped H200 table, else ``"table-<first 16 hex digits of its sha256>"``.

    Raises:
        ValueError: wrong shape or dtype, or an offset outside -2..+1.
    """
    sha = ex2_table_sha256(table)
    if sha == H200_EX2_SHA256:
        return "h200"
    name = f"table-{sha[:16]}"
    if name not in _TABLES:
        t = np.array(table, dtype=np.int8)
        t.setflags(write=False)
        _TABLES[name] = t
    return name


def ex2_table_names() -> tuple[str, ...]:
    """The names :func:`ex2_table` knows: ``"h200"`` and those of :func:`register_ex2_table`."""
    return ("h200", *_TABLES)


def ex2_table(name: str = "h200") -> np.ndarray:
    """int8[2^24]: ulp offsets of T-(f) (first 2^23) and T+(f) (last 2^23) from the correctly rounded value,
    f = index * 2^-23. ``name``: ``"h200"`` (the shipped H200 table) or a name from :func:`register_ex2_table`.

    Raises:
        ValueError: unknown name (the message lists the known ones).
    """
    if name == "h200":
        return _h200_table()
    if name not in _TABLES:
        raise ValueError(f"unknown ex2 table {name!r}; known: {', '.join(ex2_table_names())}")
    return _TABLES[name]


@jit
def _step_ulps(base, off):
    """The float32 ``off`` ulps away from the float32 ``base`` > 0 (|off| <= 2): neighbouring positive float32
    values have consecutive bit patterns, across binades too."""
    return np.float64(bits_f32(np.int32(f32_bits(np.float32(base)) + off)))


@jit
def _pow2(k):
    """2**k for -1022 <= k <= 1023 (exact, from bits)."""
    return bits_f64(np.uint64(k + 1023) << np.uint64(52))


@jit
def ex2_approx_f32(x: float, tab: np.ndarray, ftz: bool) -> float:
    """ex2.approx(.ftz).f32 of a float32 value ``x`` (given as a float), as a float (a float32 value)."""
    if x != x:
        return x
    if ftz and abs(x) < 1.1754943508222875e-38:
        x = 0.0
    if x == 0.0:
        return 1.0
    if x >= 128.0:
        return math.inf
    if x < -160.0:
        return 0.0
    a = abs(x)
    i = math.floor(a)
    f = int((a - i) * 8388608.0)  # exact product; truncation
    if x < 0.0:
        base = float(np.float32(math.exp2(-f * 1.1920928955078125e-07)))
        y = _step_ulps(base, tab[f]) * _pow2(-int(i))
    else:
        base = float(np.float32(math.exp2(f * 1.1920928955078125e-07)))
        y = _step_ulps(base, tab[TWO23 + f]) * _pow2(int(i))
    if y < 1.1754943508222875e-38:
        if ftz:
            return 0.0
        return float(np.float32(y))
    if y > 3.4028234663852886e38:
        return math.inf
    return y


# -- the ex2 of flash's scores as a value table: x <= 0 is one table load and an exact power-of-two scale ------

# the value tables of the tables in use, by id (each entry keeps its table alive, so an id is never reused)
_VALUES: dict[int, tuple[np.ndarray, np.ndarray]] = {}
# none: read-only as the tables are, so that plans with and without one share one compiled loop
_NO_VALUES = np.empty(0, dtype=np.float32)
_NO_VALUES.setflags(write=False)


def ex2_values(tab: np.ndarray) -> np.ndarray:
    """The table ``T-`` of :func:`ex2_approx_f32` as values: float32[2^23], entry f = the float32 2^(-f 2^-23)
    moved by the measured offset ``tab[f]`` (what :func:`ex2_approx_f32` computes per call with libm's exp2);
    built once per table and process (32 MiB; about 0.1 s). An empty ``tab`` gives an empty array.

    Args:
        tab: an ex2 table, int8[2^24] (:func:`ex2_table`'s layout), or empty.
    """
    if tab.size == 0:
        return _NO_VALUES
    hit = _VALUES.get(id(tab))
    if hit is None or hit[0] is not tab:
        vals = np.empty(TWO23, dtype=np.float32)
        _fill_ex2_values(_checked_table(tab, "ex2_values(tab)"), vals)
        vals.setflags(write=False)
        if len(_VALUES) >= 4:  # a few tables per process at most; the oldest goes
            _VALUES.pop(next(iter(_VALUES)))
        hit = _VALUES[id(tab)] = (tab, vals)
    return hit[1]


@jit
def _fill_ex2_values(tab, vals):
    for f in range(TWO23):
        base = float(np.float32(math.exp2(-f * 1.1920928955078125e-07)))  # as ex2_approx_f32 (x < 0)
        vals[f] = np.float32(_step_ulps(base, tab[f]))


@jit
def ex2_ftz_neg(x: np.ndarray, n: int, vals: np.ndarray, tab: np.ndarray) -> None:
    """x[:n] = :func:`ex2_approx_f32` (x[:n], tab, ftz=True), float32 values held as floats, by the value table
    ``vals = ex2_values(tab)``: for x <= 0, ``|x| = i + f`` (f truncated to 23 bits), ``vals[f] * 2^-i``, flushed
    below 2^-126, 1 for |x| < 2^-126. Branch free (a table load per value) when every x[:n] is <= 0 (flash's
    scores minus their maximum); otherwise (x > 0, NaN) each value goes through :func:`ex2_approx_f32`."""
    for j in range(n):  # the rare inputs the loop below does not handle
        xj = x[j]
        if not xj <= 0.0:
            for jj in range(n):
                x[jj] = ex2_approx_f32(x[jj], tab, True)
            return
    for j in range(n):
        a = -x[j]  # >= 0
        a = a if a < 200.0 else 200.0  # x < -160 gives 0, as any x whose result is below 2^-126
        i = math.floor(a)
        f = np.int64((a - i) * 8388608.0)  # exact product; truncation
        y = np.float64(vals[f]) * bits_f64(np.uint64(1023 - np.int64(i)) << np.uint64(52))  # exact: 2^-i, i <= 200
        y = y if y >= 1.1754943508222875e-38 else 0.0  # ftz results
        x[j] = y if a >= 1.1754943508222875e-38 else 1.0  # ftz inputs, and 0


@jit
def _ex2_array(x, out, tab, ftz):
    for n in range(x.size):
        out[n] = ex2_approx_f32(float(x[n]), tab, ftz)


def ex2_approx(x: np.ndarray, ftz: bool = True, table: str | Ex2Table = "h200") -> np.ndarray:
    """ex2.approx(.ftz).f32 on a float32 array (float32 result), with the named table (:func:`ex2_table`;
    default the H200's) or an :class:`Ex2Table`. Usable as ``simfloat_gpu.interpreter.faithful(exp2=ex2_approx)``."""
    xf = np.ascontiguousarray(x, dtype=np.float32)
    out = np.empty(xf.size, dtype=np.float64)
    tab = table.table if isinstance(table, Ex2Table) else ex2_table(table)
    _ex2_array(xf.reshape(-1), out, tab, bool(ftz))
    return out.astype(np.float32).reshape(xf.shape)


#: FlashAttention-4's degree-3 polynomial for 2^f on [0, 1), lowest degree first (float32 values; the published
#: ``POLY_EX2[3]`` of ``flash_attn/cute/utils.py``)
FA4_EX2_POLY = (1.0, 0.695146143436431884765625, 0.227564394474029541015625, 0.077119089663028717041015625)
_P0, _P1, _P2, _P3 = (np.float32(c) for c in FA4_EX2_POLY)


@jit
def ex2_poly_f32(x: float) -> float:
    """FlashAttention-4's software exp2 of a float32 value ``x`` <= 127 (given as a float), as a float (the float32
    value of the kernel's bits).

    ``xc = max(x, -127)`` (NaN gives -127, as ``max.f32``); ``n = floor(xc)`` (the kernel's ``add.rm`` of
    1.5 * 2^23, exact); ``f = rn(xc - n)``; ``p = fma(fma(fma(c3, f, c2), f, c1), f, c0)`` in float32; the result's
    bits are ``bits(p) + n * 2^23`` (32-bit integer add: ``n`` lands in the exponent field; -127 gives +0 and
    exponents below -126 give subnormal-pattern values, as the kernel's integer add does)."""
    xc = x if x > -127.0 else -127.0
    n = math.floor(xc)
    f = fma32(np.float32(1.0), np.float32(xc), np.float32(-n))  # xc - n, one rounding
    p = fma32(fma32(fma32(_P3, f, _P2), f, _P1), f, _P0)
    v = (np.int64(f32_bits(p)) + np.int64(n) * 8388608) & 0xFFFFFFFF
    if v >= 2147483648:
        v -= 4294967296
    return np.float64(bits_f32(np.int32(v)))


@jit
def _poly_array(x, out):
    for n in range(x.size):
        out[n] = ex2_poly_f32(float(x[n]))


def ex2_poly(x: np.ndarray) -> np.ndarray:
    """:func:`ex2_poly_f32` on a float32 array (float32 result; inputs <= 127)."""
    xf = np.ascontiguousarray(x, dtype=np.float32)
    if np.any(xf > 127.0):
        raise ValueError("ex2_poly: FlashAttention-4's software exp2 takes inputs <= 127 (the kernel assumes it)")
    out = np.empty(xf.size, dtype=np.float64)
    _poly_array(xf.reshape(-1), out)
    return out.astype(np.float32).reshape(xf.shape)


def exp_approx(x: np.ndarray) -> np.ndarray:
    """``tl.exp`` on the H200: ex2.approx.f32(rn32(x * 1.4426950f)), not flushed."""
    xf = np.asarray(x, dtype=np.float32)
    with np.errstate(over="ignore", under="ignore"):
        t = (xf.astype(np.float64) * _LOG2E_F32).astype(np.float32)
    return ex2_approx(t, ftz=False)


@jit
def add_f32(a: float, b: float, o: Any) -> float:
    """float32 ``a + b`` of two float32 values (the GPU's native addition; ``o`` is unused), as a float."""
    return np.float64(np.float32(a) + np.float32(b))


@ljit
def mma_tree_sum(p: np.ndarray, n: int, warps_n: int, add: Callable[..., float], o: Any) -> float:
    """tl.sum of ``p[:n]`` in the measured order of the mma accumulator layout, every addition ``add(a, b, o)``.

    The one model of this order (the reference kernel's ``row_sum``, the vector engine's row sum and
    :func:`simfloat.profiles.tl_sum` all call it). With ``nw = min(warps_n, ceil(n / 8))`` warps along the row
    (at least 1): lane t (0..3) of warp w sums its columns ``8w + 2t + 8 warps_n r`` and ``+ 1`` (r = 0, 1, ...)
    left to right, the first column taken as it is (an empty lane is 0); then the lane butterfly
    ``(s0 + s2) + (s1 + s3)``; then the warp butterfly (2 warps: ``w0 + w1``; 4: ``(w0 + w2) + (w1 + w3)``; 3, a
    row of 17..24 values over 4 warps: the same with ``w3 = 0``).

    Args:
        p: the values (float64 array).
        n: how many leading values to sum.
        warps_n: warps along the row: 1, 2 or 4.
        add: an njit addition ``add(a, b, o) -> float``: :func:`add_f32`, or a rounded op such as
            ``simfloat.attention._kernels.add``.
        o: the op's parameters, passed to ``add``.
    """
    nw = max(1, min(warps_n, (n + 7) // 8))
    period = 8 * warps_n
    # the warps' sums in a loop, not one inlined call per warp: numba inlines (and types) each call site's body
    # anew, and four warps of four lanes were sixteen copies of the lane loop
    w0 = w1 = w2 = w3 = 0.0
    for w in range(nw):
        w0, w1, w2, w3 = _put(w, _warp_sum(p, n, 8 * w, period, add, o), w0, w1, w2, w3)
    if nw == 1:
        return w0
    if nw == 2:
        return add(w0, w1, o)
    return add(add(w0, w2, o), add(w1, w3, o), o)  # 3 warps (17..24 values over 4): w3 = 0


# The order's functions are inlined into their callers (ljit): numba does not cache a function whose machine code
# passes a function argument (``add``) to a call that is not inlined ("dynamic globals"), and every cache of the
# engine would go with it.


@ljit
def _put(i, x, a0, a1, a2, a3):
    """(a0, a1, a2, a3) with slot ``i`` (0..3) set to ``x``: four partial sums kept in scalars, filled by a loop."""
    return (x if i == 0 else a0), (x if i == 1 else a1), (x if i == 2 else a2), (x if i == 3 else a3)


@ljit
def _warp_sum(p, n, c0, period, add, o):
    """One warp's sum: its lanes (columns from ``c0``) combined by the butterfly (s0 + s2) + (s1 + s3)."""
    s0 = s1 = s2 = s3 = 0.0
    for t in range(4):  # one call site of the lane loop (see mma_tree_sum)
        s0, s1, s2, s3 = _put(t, _lane_sum(p, n, c0 + 2 * t, period, add, o), s0, s1, s2, s3)
    return add(add(s0, s2, o), add(s1, s3, o), o)


@ljit
def _lane_sum(p, n, c0, period, add, o):
    """One lane's columns ``c0 + period r`` and ``+ 1`` (r = 0, 1, ...) below n, left to right from the first as it
    is; a lane without columns holds 0."""
    if c0 >= n:
        return 0.0
    s = p[c0]
    for k in range(1, 2 * ((n - c0 + period - 1) // period)):
        c = c0 + (k >> 1) * period + (k & 1)
        if c >= n:
            break
        s = add(s, p[c], o)
    return s


@jit
def tl_sum_mma_f32(p: np.ndarray, n: int, warps_n: int = 1) -> float:
    """tl.sum of p[:n] (float32 values as floats) in the measured mma-layout order with ``warps_n`` warps along the
    row, fp32 additions (:func:`mma_tree_sum`; a compiled function of its own, which the vector engine calls)."""
    return mma_tree_sum(p, n, warps_n, add_f32, 0)


def tl_sum_mma(p: np.ndarray, warps_n: int = 1) -> np.ndarray:
    """tl.sum(p, axis=-1) in the measured mma-layout order with ``warps_n`` warps along the row (float32)."""
    return tl_sum_mma_array(np.asarray(p, dtype=np.float32), warps_n)


def tl_sum_mma_array(p: np.ndarray, warps_n: int = 1) -> np.ndarray:
    """Row sums over the last axis of float32 values in the order of :func:`mma_tree_sum`, fp32 additions.

    Args:
        p: float32 values, shape (..., n).
        warps_n: warps along the row: 1, 2 or 4.

    Returns:
        float32 array of shape p.shape[:-1].

    Raises:
        ValueError: warps_n not 1, 2 or 4.
    """
    if warps_n not in (1, 2, 4):
        raise ValueError(f"tl_sum_mma: warps_n must be 1, 2 or 4, got {warps_n!r}")
    p2 = np.ascontiguousarray(p, dtype=np.float32)
    flat = p2.reshape(-1, p2.shape[-1]).astype(np.float64)
    out = np.empty(flat.shape[0], dtype=np.float64)
    _sum_rows(flat, int(warps_n), out)
    return out.astype(np.float32).reshape(p2.shape[:-1])


@jit
def _sum_rows(x, warps_n, out):
    for r in range(x.shape[0]):
        out[r] = mma_tree_sum(x[r], x.shape[1], warps_n, add_f32, 0)


@jit
def tl_sum_mma_rows_f32(pt: np.ndarray, g: int, n: int, warps_n: int, work: np.ndarray, out: np.ndarray) -> None:
    """out[r] = :func:`tl_sum_mma_f32` (pt[:n, r], n, warps_n) for the rows r < g at once: the same tree of fp32
    additions, each step a loop over the rows (independent sums, contiguous loads, no branches) that LLVM
    vectorizes.

    Args:
        pt: float32 (>= n, >= g): the values transposed, a row's values in a column.
        g, n: rows and values per row. warps_n: 1, 2 or 4.
        work: float32 scratch (>= 16, >= g): the lanes' partial sums.
        out: float64 (>= g), written.
    """
    nw = max(1, min(warps_n, (n + 7) // 8))
    period = 8 * warps_n
    for w in range(nw):
        for t in range(4):  # lane t of warp w: columns c0 + period k and + 1, left to right from the first as it is
            s = work[4 * w + t]
            c0 = 8 * w + 2 * t
            if c0 >= n:
                for r in range(g):
                    s[r] = np.float32(0.0)
                continue
            col = pt[c0]
            for r in range(g):
                s[r] = col[r]
            for k in range(1, 2 * ((n - c0 + period - 1) // period)):
                c = c0 + (k >> 1) * period + (k & 1)
                if c >= n:
                    break
                col = pt[c]
                for r in range(g):
                    s[r] = s[r] + col[r]
        for r in range(g):  # the lane butterfly: (s0 + s2) + (s1 + s3), into lane 0
            work[4 * w, r] = (work[4 * w, r] + work[4 * w + 2, r]) + (work[4 * w + 1, r] + work[4 * w + 3, r])
    if nw == 1:
        for r in range(g):
            out[r] = np.float64(work[0, r])
    elif nw == 2:
        for r in range(g):
            out[r] = np.float64(work[0, r] + work[4, r])
    else:  # 3 warps (17..24 values over 4): w3 = 0
        if nw == 3:
            for r in range(g):
                work[12, r] = np.float32(0.0)
        for r in range(g):
            out[r] = np.float64((work[0, r] + work[8, r]) + (work[4, r] + work[12, r]))
