"""simfloat.round and the njit scalar API against an exact oracle (tests/oracle.py), ml_dtypes and torch.

Values are enumerated rather than sampled wherever that is affordable: every code point of the small formats,
every representable value with its midpoints and their float64 neighbours, every float32 bit pattern (slow).
"""

from __future__ import annotations

import math
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction

import ml_dtypes
import numba
import numpy as np
import oracle
import pytest

import simfloat
from simfloat import rounding
from simfloat.formats import FloatFormat
from simfloat.rounding import RoundingMode, mode_code, round_exact, round_scalar, sticky

MODES = oracle.MODES  # the deterministic modes, by the names simfloat accepts too
ALL_MODES = (*MODES, "stochastic")
# the scale formats (unsigned / without zero: float8_e8m0fnu, ue4m3) lie outside the oracle's model; their
# rounding is checked against ml_dtypes and e4m3fn in tests/core/test_blockfmt_formats.py
NAMED = {n: f for n, f in simfloat.formats().items() if f.signed and f.zero}
SMALL = [f for f in NAMED.values() if f.bits <= 16]  # formats whose every code is enumerated

ML_TYPES = {
    "bfloat16": ml_dtypes.bfloat16,
    "float16": np.float16,
    "float8_e4m3fn": ml_dtypes.float8_e4m3fn,
    "float8_e5m2": ml_dtypes.float8_e5m2,
    "float8_e4m3": ml_dtypes.float8_e4m3,
    "float8_e3m4": ml_dtypes.float8_e3m4,
    "float8_e4m3fnuz": ml_dtypes.float8_e4m3fnuz,
    "float8_e5m2fnuz": ml_dtypes.float8_e5m2fnuz,
    "float6_e2m3fn": ml_dtypes.float6_e2m3fn,
    "float6_e3m2fn": ml_dtypes.float6_e3m2fn,
    "float4_e2m1fn": ml_dtypes.float4_e2m1fn,
}


def _uint(dtype: np.dtype) -> type:
    return {4: np.uint32, 8: np.uint64}[np.dtype(dtype).itemsize]


def assert_same(x: np.ndarray, got: np.ndarray, exp: np.ndarray, what: str) -> None:
    """Bit-for-bit equality (signed zeros included); any NaN matches any NaN."""
    got = np.asarray(got)
    exp = np.asarray(exp, dtype=got.dtype)
    u = _uint(got.dtype)
    bad = (got.view(u) != exp.view(u)) & ~(np.isnan(got) & np.isnan(exp))
    if bad.any():
        idx = np.flatnonzero(bad)[:6]
        rows = ", ".join(f"x={float(x.flat[i])!r}: got {float(got.flat[i])!r} want {float(exp.flat[i])!r}" for i in idx)
        raise AssertionError(f"{what}: {int(bad.sum())} of {bad.size} differ; {rows}")


# -- format zoo
# ----------------------------------------------------------------------------------------------------


def _variants() -> list[FloatFormat]:
    f = NAMED
    out = list(f.values())
    out += [
        simfloat.format("e6m9"),
        simfloat.format("e3m4"),
        FloatFormat("float8_e4m3", 4, 3),  # IEEE-like e4m3 with infinities
        FloatFormat("e2m0", 2, 0),  # no fraction bits at all
        FloatFormat("e3m0fn", 3, 0, nan="fn", has_infinity=False, overflow="nan"),
        FloatFormat("e1m3", 1, 3, nan="none", has_infinity=False, overflow="saturate"),
        FloatFormat("e5m22", 5, 22),  # float32 inputs: too few dropped bits for the bit kernel
        FloatFormat("e11m50", 11, 50),  # float32 inputs take the generic path, float64 the bit kernel
        FloatFormat("e9m5", 9, 5),  # range beyond float32's
        f["float8_e5m2"].replace(overflow="nan", name="e5m2_ovf_nan"),
    ]
    for name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float16", "bfloat16", "float4_e2m1fn"):
        if f[name].overflow != "saturate":
            out.append(f[name].replace(overflow="saturate", name=name + "_sat"))
    for name in (
        "float8_e4m3fn",
        "float8_e5m2",
        "float8_e4m3fnuz",
        "float6_e2m3fn",
        "float4_e2m1fn",
        "float16",
        "bfloat16",
        "tfloat32",
        "float32",
    ):
        out.append(f[name].replace(subnormals=False, name=name + "_ftz"))
    out.append(simfloat.format("e6m9").replace(subnormals=False, name="e6m9_ftz"))
    return out


VARIANTS = _variants()


def _binade_values(fmt: FloatFormat, full: bool, per_binade: int = 128) -> np.ndarray:
    """Nonnegative representable values (of fmt with subnormals) as float64: every value if ``full`` (<=
    20-bit formats), else every value of a few binades (subnormals, the two lowest normal binades, [0.5, 2),
    the two top binades), thinned to the first and last ``per_binade // 2`` fraction codes of each when a
    binade is larger. Built from exponent and fraction integers, not from simfloat."""
    with_sub = fmt.replace(subnormals=True) if not fmt.subnormals else fmt
    if full:
        return np.array(oracle.finite_values(with_sub, nonnegative=True))
    s = oracle.spec(with_sub)
    m = s.mbits
    max_value = float(s.max)
    nfrac = 1 << m
    if nfrac <= per_binade:
        fracs = list(range(nfrac))
    else:
        fracs = list(range(per_binade // 2)) + list(range(nfrac - per_binade // 2, nfrac))
    exps = {s.emin, s.emin + 1, -1, 0, s.emin + 300}
    top = math.frexp(max_value)[1] - 1  # exponent of the top binade
    exps |= {top, top - 1}
    vals = {0.0}
    for f in fracs:  # subnormals
        vals.add(math.ldexp(f, s.emin - m))
    for e in exps:
        if e < s.emin or e > top:
            continue
        for f in fracs:
            v = math.ldexp(nfrac + f, e - m)
            if v <= max_value:
                vals.add(v)
    return np.array(sorted(vals))


def _points(fmt: FloatFormat, full: bool, per_binade: int = 128) -> tuple[np.ndarray, np.ndarray]:
    """float64 and float32 test inputs: each value, each midpoint, its float64 (resp. float32) neighbours,
    values just off each representable value, the top and bottom edges, both signs, zeros, infinities, NaN."""
    v = _binade_values(fmt, full, per_binade)
    s = oracle.spec(fmt)
    max_value = float(s.max)
    top_q = math.ldexp(1.0, s.max_exp)  # quantum of the top binade
    mids = v[:-1] + (v[1:] - v[:-1]) / 2  # exact: the quantum is at least 4x coarser than float64's
    mids = np.concatenate([mids, [max_value + top_q / 2]])  # the midpoint above max (unbounded exponent range)
    small = math.ldexp(1.0, s.emin - s.mbits)
    edges = [
        max_value + top_q,
        2 * max_value,
        max_value * 2.0**40,
        1e300,
        np.finfo(np.float64).max,
        small / 2,
        small / 4,
        small * 0.75,
        5e-324,
        1e-310,
        2.0**-1022,
        2.0**-1070,
        2.0**-149,
        2.0**-126,
        2.0**-127,
        1e-40,
        3.4028234663852886e38,
        1.0,
    ]
    with np.errstate(over="ignore"):
        pos64 = np.concatenate(
            [
                v,
                np.nextafter(v, np.inf),
                np.nextafter(v, 0),
                mids,
                np.nextafter(mids, 0),
                np.nextafter(mids, np.inf),
                edges,
                np.nextafter(edges, 0),
                np.nextafter(edges, np.inf),
            ]
        )
        pos64 = pos64[np.isfinite(pos64)]
        x64 = np.unique(np.concatenate([pos64, -pos64, [0.0, -0.0, np.inf, -np.inf, np.nan]]))
        x64 = np.concatenate([x64, [-0.0]])  # unique() merges the zeros
        # float32 inputs: those of the points that are float32 numbers, and float32 neighbours of the
        # midpoints
        f32 = pos64.astype(np.float32)
        exact = f32[(f32.astype(np.float64) == pos64) & np.isfinite(f32)]
        m32 = mids.astype(np.float32)
        m32 = m32[(m32.astype(np.float64) == mids) & np.isfinite(m32)]
        pos32 = np.concatenate(
            [
                exact,
                np.nextafter(m32, np.float32(0)),
                np.nextafter(m32, np.float32(np.inf)),
                np.nextafter(exact, np.float32(np.inf)),
            ]
        )
        pos32 = pos32[np.isfinite(pos32)]
    x32 = np.unique(np.concatenate([pos32, -pos32, np.array([0.0, np.inf, -np.inf, np.nan], np.float32)]))
    x32 = np.concatenate([x32, np.array([-0.0], np.float32)])
    return x64, x32


_ORACLE_CACHE: dict[tuple[str, float], list[float]] = {}


def _result_dtype(x: np.ndarray, fmt: FloatFormat) -> type:
    """float32 only for float32 input into a format whose every value is a float32 (its own rule, not simfloat's)."""
    s = oracle.spec(fmt)
    fits = s.mbits <= 23 and s.max <= oracle.spec(simfloat.float32).max and s.emin - s.mbits >= -149
    return np.float32 if x.dtype == np.float32 and fits else np.float64


def _oracle_table(xs: np.ndarray, fmt: FloatFormat) -> dict[str, np.ndarray]:
    out = np.empty((len(MODES), xs.size))
    key0 = repr(fmt)
    for i, x in enumerate(xs.astype(np.float64).tolist()):
        key = (key0, x) if not (x == 0 and math.copysign(1, x) < 0) else (key0, "-0")
        r = _ORACLE_CACHE.get(key)  # type: ignore[arg-type]
        if r is None:
            r = oracle.round_ref_all(x, fmt)
            _ORACLE_CACHE[key] = r  # type: ignore[index]
        out[:, i] = r
    return {m: out[j].astype(_result_dtype(xs, fmt)) for j, m in enumerate(MODES)}


def _via_round_exact(x: np.ndarray, fmt: FloatFormat, mode: str) -> np.ndarray:
    """simfloat.round's generic path (every element through round_exact), which it takes for stochastic
    rounding and for the formats its bit kernel does not cover; here forced for any format."""
    dtype = _result_dtype(x, fmt)
    out = np.empty(x.shape, dtype)
    from simfloat.rounding._array import _round_flat
    from simfloat.rounding._bits import _placeholder

    _round_flat(x.astype(dtype), out, _placeholder(np.dtype(dtype)), fmt.params, int(mode_code(mode)), np.uint64(0))
    return out


def _check_against_oracle(fmt: FloatFormat, full: bool, per_binade: int = 128) -> None:
    x64, x32 = _points(fmt, full, per_binade)
    exp64 = _oracle_table(x64, fmt)
    exp32 = _oracle_table(x32, fmt)
    for mode in MODES:
        assert_same(x64, simfloat.round(x64, fmt, mode), exp64[mode], f"{fmt.name} {mode} float64")
        assert_same(x64, _via_round_exact(x64, fmt, mode), exp64[mode], f"{fmt.name} {mode} round_exact")
        got32 = simfloat.round(x32, fmt, mode)  # float64 for formats with values float32 cannot hold
        assert got32.dtype == _result_dtype(x32, fmt)
        assert_same(x32, got32, exp32[mode], f"{fmt.name} {mode} float32")
        assert_same(x32, _via_round_exact(x32, fmt, mode), exp32[mode], f"{fmt.name} {mode} round_exact f32")


@pytest.mark.parametrize("fmt", [f for f in VARIANTS if f.bits <= 10], ids=str)
def test_against_oracle_small_formats_every_value(fmt: FloatFormat) -> None:
    _check_against_oracle(fmt, full=True)


@pytest.mark.parametrize("fmt", [f for f in VARIANTS if f.bits > 10 and f.name != "float64"], ids=str)
def test_against_oracle_wide_formats_selected_binades(fmt: FloatFormat) -> None:
    _check_against_oracle(fmt, full=False)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", [f for f in VARIANTS if 10 < f.bits <= 16 and "_" not in f.name], ids=str)
def test_against_oracle_16bit_formats_every_value(fmt: FloatFormat) -> None:
    """bfloat16, float16, e6m9, e9m5: every value (their saturating and flush-to-zero variants get the
    selected binades of the fast test)."""
    _check_against_oracle(fmt, full=True)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", [f for f in VARIANTS if f.bits > 16 and f.name != "float64"], ids=str)
def test_against_oracle_wide_formats_more_values(fmt: FloatFormat) -> None:
    _check_against_oracle(fmt, full=False, per_binade=2048)


def test_float64_format_is_identity_on_float64() -> None:
    x = np.array([0.0, -0.0, 5e-324, -5e-324, 1.0, np.nextafter(1.0, 2), 1e308, -np.inf, np.inf, np.nan, 2.0**-1022])
    for mode in ALL_MODES:
        assert_same(x, simfloat.round(x, "fp64", mode, seed=0), x, f"float64 {mode}")
        with np.errstate(over="ignore"):
            x32 = x.astype(np.float32)
        assert_same(x32, simfloat.round(x32, "fp64", mode, seed=0), x32, f"float64 {mode} float32 input")


# -- every code point round-trips
# --------------------------------------------------------------------------------


def _code_values(fmt: FloatFormat) -> np.ndarray:
    """Every code of a named format <= 16 bits, decoded by ml_dtypes/numpy, as float64 (NaN codes
    included)."""
    t = ML_TYPES[fmt.name]
    width = np.dtype(t).itemsize
    codes = np.arange(1 << fmt.bits, dtype=np.uint32).astype(f"u{width}")
    with np.errstate(invalid="ignore"):
        return codes.view(t).astype(np.float64)


@pytest.mark.parametrize("fmt", SMALL, ids=str)
@pytest.mark.parametrize("mode", ALL_MODES)
def test_every_code_point_round_trips(fmt: FloatFormat, mode: str) -> None:
    v = _code_values(fmt)
    assert_same(v, simfloat.round(v, fmt, mode, seed=7), v, f"{fmt.name} {mode}")
    with np.errstate(invalid="ignore"):
        v32 = v.astype(np.float32)
    assert_same(v32, simfloat.round(v32, fmt, mode, seed=7), v32, f"{fmt.name} {mode} float32")
    # without subnormals: normal values stay, subnormal ones flush to zero of their sign (+0 without -0)
    ftz = fmt.replace(subnormals=False)
    sub = (np.abs(v) < fmt.tiny) & (v != 0)
    want = np.where(sub, np.copysign(0.0, v) if fmt.has_negative_zero else 0.0, v)
    assert_same(v, simfloat.round(v, ftz, mode, seed=7), want, f"{fmt.name}_ftz {mode}")


def test_tfloat32_every_code_point_round_trips() -> None:
    v = np.array(oracle.finite_values(simfloat.tfloat32))
    for mode in ALL_MODES:
        assert_same(v, simfloat.round(v, "tf32", mode, seed=1), v, f"tf32 {mode}")
        v32 = v.astype(np.float32)
        assert_same(v32, simfloat.round(v32, "tf32", mode, seed=1), v32, f"tf32 {mode} float32")


# -- exhaustive float32 sweep against ml_dtypes (slow)
# -----------------------------------------------------------


@numba.njit(parallel=True, cache=False)
def _count_mismatches(got, codes, table, table_nan):  # type: ignore[no-untyped-def]
    """Elements where got (float32 bits) differs from the reference code's float32 bits; NaN matches NaN."""
    bad = 0
    for i in numba.prange(got.size):
        g = got[i]
        c = codes[i]
        if table_nan[c]:
            if (g & np.uint32(0x7FFFFFFF)) <= np.uint32(0x7F800000):
                bad += 1
        elif g != table[c]:
            bad += 1
    return bad


def _code_table(t: type) -> tuple[np.ndarray, np.ndarray]:
    width = np.dtype(t).itemsize
    codes = np.arange(1 << (8 * width), dtype=np.uint32).astype(f"u{width}")
    with np.errstate(invalid="ignore"):
        vals = codes.view(t).astype(np.float32)
    return vals.view(np.uint32).copy(), np.isnan(vals)


@pytest.mark.slow
def test_every_float32_bit_pattern_matches_ml_dtypes() -> None:
    """All 2**32 float32 patterns to bfloat16, float8_e4m3fn, float8_e5m2 (ml_dtypes) and float16 (torch:
    ml_dtypes has no float16, and numpy's float16 cast takes seconds per 2**26 underflowing elements
    because it raises the underflow flag element by element), round to nearest even, bit for bit with NaN
    payloads aside."""
    torch = pytest.importorskip("torch")
    chunk = 1 << 26
    refs = {
        "bfloat16": ml_dtypes.bfloat16,
        "float8_e4m3fn": ml_dtypes.float8_e4m3fn,
        "float8_e5m2": ml_dtypes.float8_e5m2,
        "float16": np.float16,
    }
    tables = {n: _code_table(t) for n, t in refs.items()}
    base = np.arange(chunk, dtype=np.uint32)
    bits = np.empty(chunk, np.uint32)
    x = bits.view(np.float32)
    got = np.empty(chunk, np.float32)
    ref_codes = {n: np.empty(chunk, dtype=t) for n, t in refs.items()}
    half16 = torch.empty(chunk, dtype=torch.float16)
    t_sf = t_ref = 0.0
    mismatches = dict.fromkeys(refs, 0)
    pool = ThreadPoolExecutor(2)

    def ml_cast(dst: np.ndarray, lo: int, hi: int) -> None:
        with np.errstate(over="ignore", invalid="ignore", under="ignore"):  # errstate is per thread
            np.copyto(dst[lo:hi], x[lo:hi], casting="unsafe")

    t_all = time.perf_counter()
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        for start in range(0, 1 << 32, chunk):
            np.add(base, np.uint32(start), out=bits)
            for name in refs:
                t0 = time.perf_counter()
                simfloat.round(x, name, out=got)
                t1 = time.perf_counter()
                dst = ref_codes[name]
                if name == "float16":
                    half16.copy_(torch.from_numpy(x))
                    codes = half16.numpy().view(np.uint16)
                else:
                    list(pool.map(lambda lohi, d=dst: ml_cast(d, *lohi), [(0, chunk // 2), (chunk // 2, chunk)]))
                    codes = dst.view(f"u{dst.itemsize}")
                t2 = time.perf_counter()
                table, table_nan = tables[name]
                bad = _count_mismatches(got.view(np.uint32), codes, table, table_nan)
                if bad:
                    mismatches[name] += bad
                    if mismatches[name] == bad:  # report the first chunk with a difference
                        ref = table[codes]
                        g = got.view(np.uint32)
                        i = np.flatnonzero((g != ref) & ~(table_nan[codes] & np.isnan(got)))[:5]
                        print(
                            name,
                            [(hex(int(bits[j])), float(got[j]), float(ref[j].view(np.float32))) for j in i],
                        )
                t_sf += t1 - t0
                t_ref += t2 - t1
    pool.shutdown()
    print(
        f"\n2**32 float32 x 4 formats: simfloat {t_sf:.1f} s, references {t_ref:.1f} s, "
        f"total {time.perf_counter() - t_all:.1f} s"
    )
    assert mismatches == dict.fromkeys(refs, 0)


# -- float64 inputs are rounded once: the double-rounding trap
# --------------------------------------------------


def _double_rounding_traps(rng: np.random.Generator, n: int) -> np.ndarray:
    """float64 values within a float32 half-ulp of a bfloat16 midpoint, on the side that float32 rounding
    hides: just above the midpoint when the lower neighbour is even (float32 gives the midpoint, whose tie
    goes down to even: wrong), just below it when the lower neighbour is odd (the tie goes up to even:
    wrong)."""
    e = rng.integers(-120, 120, n)
    k = rng.integers(128, 256, n)  # bfloat16 significand, 8 bits
    ulp = np.ldexp(1.0, e - 7)
    mid = k * ulp + ulp / 2
    tail = ulp * 2.0**-20  # well inside float32's half-ulp (ulp * 2**-17) around the midpoint
    x = np.where(k % 2 == 0, mid + tail, mid - tail)
    sign = np.where(rng.random(n) < 0.5, -1.0, 1.0)
    return x * sign


def test_float64_input_is_not_double_rounded(rng: np.random.Generator) -> None:
    torch = pytest.importorskip("torch")
    x = _double_rounding_traps(rng, 2000)
    exp = np.array([oracle.round_ref(v, simfloat.bfloat16, "nearest_even") for v in x.tolist()])
    got = simfloat.round(x, "bf16")
    ml = x.astype(ml_dtypes.bfloat16).astype(np.float64)
    th = torch.from_numpy(x).to(torch.bfloat16).to(torch.float64).numpy()
    sf_err = int(np.count_nonzero(got != exp))
    ml_err = int(np.count_nonzero(ml != exp))
    th_err = int(np.count_nonzero(th != exp))
    assert sf_err == 0
    assert ml_err > 0, "ml_dtypes no longer double-rounds float64 -> bfloat16: update this test"
    assert th_err > 0, "torch no longer double-rounds float64 -> bfloat16: update this test"
    # float32 rounding of the traps lands exactly on the midpoints, which is where the error comes from
    x32 = x.astype(np.float32).astype(np.float64)
    assert np.all(np.abs(x32) > 0) and np.all(x32 != x)
    # the same values rounded in the other deterministic modes agree with the oracle too
    ref = np.array([oracle.round_ref_all(v, simfloat.bfloat16) for v in x.tolist()])
    for j, mode in enumerate(MODES):
        assert_same(x, simfloat.round(x, "bf16", mode), ref[:, j], f"traps {mode}")


@pytest.mark.parametrize(
    "fmt",
    [
        pytest.param("float16", marks=pytest.mark.slow),
        "float8_e4m3fn",
        "float8_e5m2",
        "float6_e3m2fn",
        "e3m4",
    ],
)
def test_float64_near_midpoints_other_formats(fmt: str, rng: np.random.Generator) -> None:
    f = simfloat.format(fmt)
    v = np.array(oracle.finite_values(f, nonnegative=True))
    mids = (v[:-1] + v[1:]) / 2
    tails = np.ldexp(mids, -rng.integers(20, 52, mids.size))
    x = np.concatenate([mids + tails, mids - tails])
    x = np.concatenate([x, -x])
    ref = np.array([oracle.round_ref_all(t, f) for t in x.tolist()])
    for j, mode in enumerate(MODES):
        assert_same(x, simfloat.round(x, f, mode), ref[:, j], f"{fmt} {mode}")


# -- stochastic rounding
# ------------------------------------------------------------------------------------------


def _off_grid(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Values that are not bfloat16 numbers (so stochastic rounding has a choice)."""
    return rng.standard_normal(shape) * (1 + 2.0**-12)


def test_stochastic_reproducible_and_seeded(rng: np.random.Generator) -> None:
    x = _off_grid(rng, (4096,))
    a = simfloat.round(x, "bf16", "stochastic", seed=123)
    b = simfloat.round(x, "bf16", "stochastic", seed=123)
    c = simfloat.round(x, "bf16", "stochastic", seed=124)
    assert_same(x, a, b, "same seed")
    assert np.count_nonzero(a != c) > 100
    big = np.uint64(2**64 - 1)
    assert_same(
        x,
        simfloat.round(x, "bf16", "sr", seed=-1),
        simfloat.round(x, "bf16", "sr", seed=int(big)),
        "seed mod 2**64",
    )
    # no seed: fresh entropy each call
    assert np.count_nonzero(simfloat.round(x, "bf16", "sr") != simfloat.round(x, "bf16", "sr")) > 100
    # results are one of the two neighbours
    lo = simfloat.round(x, "bf16", "toward_zero")
    hi = np.where(x > 0, simfloat.round(x, "bf16", "up"), simfloat.round(x, "bf16", "down"))
    assert np.all((a == lo) | (a == hi))
    # float32 inputs draw the same bits as float64 inputs of the same values
    x32 = x.astype(np.float32)
    s32 = simfloat.round(x32, "bf16", "stochastic", seed=5)
    s64 = simfloat.round(x32.astype(np.float64), "bf16", "stochastic", seed=5)
    assert s32.dtype == np.float32
    assert_same(x32, s32, s64.astype(np.float32), "float32 vs float64 input")


def test_stochastic_layout_independent(rng: np.random.Generator) -> None:
    xc = _off_grid(rng, (64, 33, 5))
    ref = simfloat.round(xc, "fp16", "stochastic", seed=9)
    xf = np.asfortranarray(xc)
    assert_same(xc, simfloat.round(xf, "fp16", "stochastic", seed=9), ref, "F order")
    holder = np.zeros((128, 99, 5))
    holder[::2, ::3] = xc
    view = holder[::2, ::3]
    assert not view.flags.c_contiguous
    assert_same(xc, simfloat.round(view, "fp16", "stochastic", seed=9), ref, "strided view")
    rev = np.ascontiguousarray(xc[::-1])[::-1]  # negative strides, same logical array
    assert_same(xc, simfloat.round(rev, "fp16", "stochastic", seed=9), ref, "negative strides")
    out = np.empty_like(xc, order="F")
    simfloat.round(xc, "fp16", "stochastic", seed=9, out=out)
    assert_same(xc, out, ref, "F-order out")
    y = xc.copy()
    simfloat.round(y, "fp16", "stochastic", seed=9, out=y)
    assert_same(xc, y, ref, "in place")


@pytest.mark.parametrize(
    ("fmt", "x"),
    [
        ("bfloat16", 1.0 + 2.0**-9),  # a quarter of the way
        ("bfloat16", -3.0 * (1 + 2.0**-8 * 0.3)),
        ("bfloat16", 2.0**-130 * 1.7),  # bfloat16 subnormal range
        ("float16", 1000.3),
        ("float16", 2.0**-20 * 1.1),  # float16 subnormal range
        ("float16", -(2.0**-25) * 1.5),  # below the smallest subnormal: 0 or the smallest
        ("float8_e4m3fn", 0.1),
        ("float8_e4m3fn", -(2.0**-8) * 1.25),  # subnormal range
        ("float8_e5m2", 3e-6),
        ("float4_e2m1fn", 2.4),
        ("e6m9", 1.0 / 3.0),
    ],
)
def test_stochastic_unbiased(fmt: str, x: float) -> None:
    f = simfloat.format(fmt)
    lo, hi, p = oracle.bracket(x, f)
    assert lo != hi and 0 < p < 1
    n = 1 << 18
    for dtype in (np.float64, np.float32):
        xs = np.full(n, x, dtype=dtype)
        if dtype == np.float32:
            x32 = float(np.float32(x))
            lo, hi, p = oracle.bracket(x32, f)
            if lo == hi:
                continue
        r = simfloat.round(xs, f, "stochastic", seed=2024).astype(np.float64)
        assert np.all((r == lo) | (r == hi)), np.unique(r)
        k = np.count_nonzero(r == hi)
        pf = float(p)
        se = math.sqrt(pf * (1 - pf) / n)
        assert abs(k / n - pf) < 5 * se + 1e-12, (k / n, pf, se)
        # the mean is the value itself, within a few standard errors
        target = float(Fraction(lo) + (Fraction(hi) - Fraction(lo)) * p)
        assert abs(r.mean() - target) < 5 * se * abs(hi - lo) + 1e-300


def test_stochastic_far_below_the_grid_never_rounds_up() -> None:
    """Values with a probability of rounding up below 2**-64 round to zero. (A regression: the threshold was
    shifted by a count >= 64, which x86 takes mod 64, so e.g. 2**-207 became bf16's smallest subnormal about
    once in a thousand.)"""
    ks = np.arange(-1074, -200)  # bfloat16's smallest subnormal is 2**-133: P(up) = 2**(k + 133) <= 2**-67
    x = np.repeat(np.ldexp(1.0, ks), 2048)
    r = simfloat.round(x, "bf16", "stochastic", seed=3)
    assert np.count_nonzero(r) == 0, np.unique(x[r != 0])
    r = simfloat.round(-x, "float8_e4m3fn", "stochastic", seed=4)
    assert np.count_nonzero(r) == 0
    assert np.all(np.signbit(r))


# -- dtypes, shapes, out= and argument checking
# --------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_dtype_and_shapes(dtype: type, rng: np.random.Generator) -> None:
    x3 = rng.standard_normal((5, 7, 3)).astype(dtype)
    want = simfloat.round(x3.reshape(-1), "bf16").reshape(x3.shape)
    for x in (x3, np.asfortranarray(x3), x3[::-1, :, ::-1], x3[:, ::2]):
        r = simfloat.round(x, "bf16")
        assert r.dtype == dtype and r.shape == x.shape
        ref = simfloat.round(np.ascontiguousarray(x).reshape(-1), "bf16").reshape(x.shape)
        assert_same(x, r, ref, "layout")
    assert_same(x3, simfloat.round(x3[::-1], "bf16")[::-1], want, "negative strides")
    zero_d = simfloat.round(np.array(1.0 + 2.0**-9, dtype=dtype), "bf16")
    assert zero_d.shape == () and zero_d.dtype == dtype and float(zero_d) == 1.0
    empty = simfloat.round(np.empty((0, 3), dtype=dtype), "bf16", "up")
    assert empty.shape == (0, 3) and empty.dtype == dtype
    assert simfloat.round(np.empty(0, dtype=dtype), "bf16", "stochastic", seed=1).size == 0


def test_python_scalars_and_lists() -> None:
    r = simfloat.round(1.0 + 2.0**-9, "bf16")
    assert isinstance(r, np.ndarray) and r.shape == () and r.dtype == np.float64 and float(r) == 1.0
    assert simfloat.round([1.0, 3.0], "fp4").tolist() == [1.0, 3.0]
    assert float(simfloat.round(np.float64(448.5), "e4m3")) == 448.0


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_out_argument(dtype: type, rng: np.random.Generator) -> None:
    x = rng.standard_normal((33, 17)).astype(dtype)
    want = simfloat.round(x, "fp16", "nearest_away")
    out = np.empty_like(x)
    assert simfloat.round(x, "fp16", "nearest_away", out=out) is out
    assert_same(x, out, want, "out")
    out_f = np.empty_like(x, order="F")
    assert simfloat.round(x, "fp16", "nearest_away", out=out_f) is out_f
    assert_same(x, out_f, want, "F-order out")
    holder = np.zeros((66, 34), dtype=dtype)
    view = holder[::2, ::2]
    assert simfloat.round(x, "fp16", "nearest_away", out=view) is view
    assert_same(x, view, want, "strided out")
    assert np.all(holder[1::2] == 0)
    y = x.copy()
    assert simfloat.round(y, "fp16", "nearest_away", out=y) is y
    assert_same(x, y, want, "in place")
    yf = np.asfortranarray(x)
    assert simfloat.round(yf, "fp16", "nearest_away", out=yf) is yf
    assert_same(x, yf, want, "in place, F order")
    # overlapping but not identical: input and output share memory shifted by one element
    buf = np.concatenate([x.reshape(-1), [0]]).astype(dtype)
    src, dst = buf[:-1], buf[1:]
    expect = simfloat.round(src.copy(), "fp16", "nearest_away")
    simfloat.round(src, "fp16", "nearest_away", out=dst)
    assert_same(src, dst, expect, "overlapping out")


@pytest.mark.parametrize(
    "x",
    [
        np.arange(4),
        np.ones(3, np.complex128),
        np.ones(3, ml_dtypes.int4),
        np.ones(3, np.int8),
        np.array([True]),
        np.array(["1.5"]),
        ["1.5"],
        [1.0, "2"],
        "1.0",
        1 + 2j,
        None,
    ],
    ids=lambda v: type(v).__name__ if not isinstance(v, np.ndarray) else str(v.dtype),
)
def test_bad_input_types(x: object) -> None:
    with pytest.raises(TypeError, match="float32 or float64"):
        simfloat.round(x, "bf16")  # type: ignore[arg-type]


def test_bad_out_and_seed_and_mode() -> None:
    x = np.ones(4)
    with pytest.raises(TypeError, match="out must be"):
        simfloat.round(x, "bf16", out=np.ones(4, np.float32))
    with pytest.raises(TypeError, match="out must be"):
        simfloat.round(x, "bf16", out=np.ones(5))
    with pytest.raises(TypeError, match="out must be"):
        simfloat.round(x, "bf16", out=[0.0] * 4)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="seed"):
        simfloat.round(x, "bf16", "stochastic", seed=1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="seed"):
        simfloat.round(x, "bf16", "stochastic", seed=True)
    with pytest.raises(ValueError, match="unknown rounding mode 'nearest_odd'"):
        simfloat.round(x, "bf16", "nearest_odd")
    with pytest.raises(TypeError, match="rounding mode must be a string, RoundingMode or its int value"):
        simfloat.round(x, "bf16", 3.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown format"):
        simfloat.round(x, "bf15")
    with pytest.raises(ValueError, match="outside float64's range"):
        simfloat.round(x, FloatFormat("e11m52fnuz", 11, 52, nan="fnuz", has_infinity=False, overflow="nan"))


def test_mode_names() -> None:
    for m in RoundingMode:
        assert mode_code(m.name.lower()) is m
        assert mode_code(m) is m
    for alias, m in {"rne": 0, "rna": 1, "rz": 2, "rtz": 2, "truncate": 2, "ru": 3, "rd": 4, "sr": 6}.items():
        assert mode_code(alias) == m
        assert mode_code(alias.upper()) == m
    assert mode_code("Nearest-Even") == RoundingMode.NEAREST_EVEN


# -- float32 input into formats float32 cannot hold
# --------------------------------------------------------------


WIDE_FOR_FLOAT32 = [
    simfloat.format("e11m7"),  # bfloat16's precision, float64's exponent range: 3.4028235e38 rounds to 2**128
    FloatFormat("e6m25_sat", 6, 25, nan="none", has_infinity=False, overflow="saturate"),  # max 2**33 - 2**7
    simfloat.format("e8m24"),  # float32's range, one bit more precision
    simfloat.format("e9m5"),
    simfloat.float64,
]


@pytest.mark.parametrize("fmt", WIDE_FOR_FLOAT32, ids=str)
@pytest.mark.parametrize("mode", ALL_MODES)
def test_float32_input_into_format_float32_cannot_hold_gives_float64(fmt: FloatFormat, mode: str) -> None:
    """The result holds values of ``fmt``: float64 whenever some value of ``fmt`` is not a float32 (as in ops)."""
    x = np.array(
        [3.4028235e38, -3.4028235e38, 1e30, 1.0 + 2.0**-23, 1.0 - 2.0**-24, 3 * 2.0**-149, 2.0**-149, -0.0, np.inf],
        dtype=np.float32,
    )
    got = simfloat.round(x, fmt, mode, seed=5)
    assert got.dtype == np.float64
    assert_same(x, got, simfloat.round(x.astype(np.float64), fmt, mode, seed=5), f"{fmt.name} {mode}")
    finite = np.isfinite(got)
    assert np.all(np.abs(got[finite]) <= fmt.max)
    out = np.empty(x.shape)
    assert simfloat.round(x, fmt, mode, seed=5, out=out) is out
    assert_same(x, out, got, "out")
    with pytest.raises(TypeError, match="out must .* dtype float64"):
        simfloat.round(x, fmt, mode, out=np.empty_like(x))
    scalar = simfloat.round(x[0], fmt, mode, seed=5)
    assert scalar.dtype == np.float64 and scalar.shape == ()


def test_float32_max_into_e11m7_is_2_to_128() -> None:
    assert simfloat.round(np.float32([3.4028235e38]), "e11m7").tolist() == [2.0**128]
    sat = WIDE_FOR_FLOAT32[1]
    assert simfloat.round(np.float32([3.4028235e38]), sat).tolist() == [sat.max]


# -- Python ints, longdouble and Fractions: rounded exactly, once
# ------------------------------------------------


BIG_INTS = [
    2**60 + 2**52 + 1,  # float64 first would give 2**60 + 2**52, a bfloat16 tie that goes to 2**60
    -(2**60 + 2**52 + 1),
    2**53 + 1,
    2**64 - 1,
    3**40,
    10**30 + 1,
    2**24 + 1,
    2**1024 - 2**970 - 1,  # just below float64's overflow threshold: float64 max with a negative tail
    2**1024 - 2**970,  # the threshold itself
    -(2**1024),
    2**2000 + 1,
    2**900 + 2**847,  # exactly half a float64 ulp above 2**900
    2**900 + 2**847 + 1,
    0,
    7,
]


@pytest.mark.parametrize(
    "fmt", ["float64", "float32", "bfloat16", "float16", "float8_e4m3fn", "float4_e2m1fn", "e11m7"], ids=str
)
def test_python_ints_are_rounded_exactly(fmt: str) -> None:
    f = simfloat.format(fmt)
    for mode in MODES:
        got = simfloat.round(BIG_INTS, f, mode)
        want = np.array([oracle.round_ref(n, f, mode) for n in BIG_INTS])
        assert got.dtype == np.float64
        assert_same(got, got, want, f"{fmt} {mode} list")
        for n, w in zip(BIG_INTS[:3], want[:3].tolist(), strict=True):
            r = simfloat.round(n, f, mode)
            assert r.shape == () and (float(r) == w or math.isnan(w)), (n, mode)
    assert float(simfloat.round(2**60 + 2**52 + 1, "bf16")) == 2.0**60 + 2.0**53
    assert float(simfloat.round(np.int64(2**60 + 2**52 + 1), "bf16")) == 2.0**60 + 2.0**53


def test_fractions_are_rounded_exactly() -> None:
    vals = [Fraction(1, 3), Fraction(-2, 3), Fraction(1, 2**1075), Fraction(3, 2**1076), Fraction(10**400, 3)]
    for fmt in ("float64", "bfloat16", "e4m3"):
        f = simfloat.format(fmt)
        for mode in MODES:
            want = np.array([oracle.round_ref(v, f, mode) for v in vals])
            assert_same(np.zeros(len(vals)), simfloat.round(vals, f, mode), want, f"{fmt} {mode}")


@pytest.mark.skipif(np.finfo(np.longdouble).nmant <= 52, reason="long double is float64 here")
def test_longdouble_scalars_are_rounded_exactly() -> None:
    one, two = np.longdouble(1), np.longdouble(2)
    vals = [
        one + two**-8 + two**-60,  # above a bfloat16 tie by less than float64 can hold
        -(one + two**-24 + two**-60),  # the same for float32
        one + two**-53 + two**-62,
        two**-1075 + two**-1100,
        np.longdouble("1e-4000"),
        np.longdouble("-1e4000"),
        np.longdouble("1e308") * 10,
        -np.longdouble(0),
    ]
    for fmt in ("float64", "float32", "bfloat16", "e4m3"):
        f = simfloat.format(fmt)
        for mode in MODES:
            want = [oracle.round_ref(Fraction(*v.as_integer_ratio()), f, mode) for v in vals[:-1]]
            want.append(-0.0 if f.has_negative_zero else 0.0)
            got = np.array([simfloat.round(v, f, mode) for v in vals])
            assert got.dtype == np.float64
            assert_same(np.zeros(len(vals)), got, np.array(want), f"{fmt} {mode}")
            assert_same(np.zeros(len(vals)), simfloat.round(vals, f, mode), np.array(want), f"{fmt} {mode} list")
    assert float(simfloat.round(vals[0], "bf16")) == 1 + 2.0**-7
    with pytest.raises(TypeError, match="dtype float32 or float64"):
        simfloat.round(np.array(vals), "bf16")


def test_exact_inputs_draw_the_stochastic_stream_of_their_position() -> None:
    """Stochastic rounding of exact inputs uses element i's random word, as every other input does."""
    n = 2**60 + 2**52 + 1
    xs = [1.5, n, 2.0**60 + 2.0**52, n]
    a = simfloat.round(xs, "bf16", "stochastic", seed=11)
    assert_same(np.zeros(4), simfloat.round(xs, "bf16", "stochastic", seed=11), a, "same seed")
    rb = [np.uint64(rounding.rand_bits(np.uint64(11), np.uint64(i))) for i in range(4)]
    p = simfloat.bfloat16.params
    for i in (1, 3):
        assert a[i] == round_exact(2.0**60 + 2.0**52, 1, p, 6, rb[i])
    ups = [float(simfloat.round(n, "bf16", "stochastic", seed=s)) for s in range(400)]
    assert set(ups) == {2.0**60, 2.0**60 + 2.0**53}
    assert 0.4 < np.mean(np.array(ups) > 2.0**60) < 0.6  # P(up) is just above 1/2


# -- read-only out=, int modes, bools, NumPy scalars, signalling NaNs
# --------------------------------------------


def test_read_only_out_is_a_value_error_and_read_only_input_works() -> None:
    x = np.linspace(-3, 3, 10)
    for out in (np.empty(10), np.empty(20)[::2]):
        out.flags.writeable = False
        with pytest.raises(ValueError, match="out is read-only"):
            simfloat.round(x, "bf16", out=out)
    x.flags.writeable = False
    assert_same(x, simfloat.round(x, "bf16"), simfloat.round(x.copy(), "bf16"), "read-only input")


def test_int_modes_like_ops() -> None:
    x = np.array([1.0 + 2.0**-9, -(1.0 + 2.0**-9)])
    for m in RoundingMode:
        if m != RoundingMode.STOCHASTIC:
            assert_same(x, simfloat.round(x, "bf16", int(m)), simfloat.round(x, "bf16", m.name.lower()), m.name)
            assert_same(x, simfloat.round(x, "bf16", np.int8(int(m))), simfloat.round(x, "bf16", m), m.name)
    assert mode_code(3) is RoundingMode.UP
    for bad in (7, -1):
        with pytest.raises(ValueError, match=f"unknown rounding mode {bad}"):
            simfloat.round(x, "bf16", bad)
        with pytest.raises(ValueError, match=f"unknown rounding mode {bad}"):
            simfloat.ops.add(x, x, "bf16", bad)
    for bad in (True, np.bool_(False), 2.0):
        with pytest.raises(TypeError, match="rounding mode must be"):
            simfloat.round(x, "bf16", bad)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="rounding mode must be"):
            simfloat.ops.add(x, x, "bf16", bad)  # type: ignore[arg-type]


SCALARS = [
    1.0 + 2.0**-9,
    np.float64(1.0 + 2.0**-9),
    np.float32(1.0 + 2.0**-9),
    np.float16(1.5),
    3,
    np.int32(-3),
    2**53,
    [1.5, np.float32(2.5), 3],
    (1.0, -0.0),
    np.array(2.5, dtype=np.float32),
    np.array([-0.0, 2.5]),
]


@pytest.mark.parametrize("x", SCALARS, ids=lambda v: type(v).__name__)
@pytest.mark.parametrize("fmt", ["bf16", "e11m7"])
def test_round_and_ops_agree_on_scalars_and_lists(x: object, fmt: str) -> None:
    """round(x) and the exact ops.mul(x, 1.0) give the same values with the same dtype."""
    r = simfloat.round(x, fmt, "up")  # type: ignore[arg-type]
    o = simfloat.ops.mul(x, 1.0, fmt, "up")
    assert r.dtype == o.dtype and r.shape == o.shape
    assert_same(r, r, o, "round vs ops")
    is32 = isinstance(x, np.float32) or (isinstance(x, np.ndarray) and x.dtype == np.float32)
    assert r.dtype == (np.float32 if is32 and fmt == "bf16" else np.float64)


@pytest.mark.parametrize(
    "x", [True, np.bool_(True), [1.0, True], "1.0", None, 1 + 2j, [1.0, None]], ids=lambda v: repr(v)
)
def test_round_and_ops_reject_the_same_inputs(x: object) -> None:
    with pytest.raises(TypeError):
        simfloat.round(x, "bf16")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        simfloat.ops.mul(x, 1.0, "bf16")


def _snan(dtype: type) -> np.ndarray:
    bits = [0x7F800001, 0xFFA00000] if dtype == np.float32 else [0x7FF0000000000001, 0xFFF4000000000000]
    return np.array(bits, dtype=_uint(dtype)).view(dtype)


def _quieted(x: np.ndarray, dtype: type) -> np.ndarray:
    """x's NaNs with the quiet bit set (sign and payload kept), in ``dtype``."""
    q = x.view(_uint(x.dtype)) | _uint(x.dtype)(1 << (np.finfo(x.dtype).nmant - 1))
    return q.view(x.dtype).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("fmt", ["bf16", "fp32", "fp64", "e4m3", "e5m22", "e11m7", "fp4"])
def test_signalling_nans_are_quieted_in_every_mode(dtype: type, fmt: str) -> None:
    """A NaN result is quiet, its sign and payload kept (IEEE convertFormat), in every mode and on every path."""
    x = np.concatenate([_snan(dtype), np.ones(3, dtype)])
    for mode in ALL_MODES:
        got = simfloat.round(x, fmt, mode, seed=3)
        want = _quieted(x[:2], got.dtype)
        assert np.array_equal(got[:2].view(_uint(got.dtype)), want.view(_uint(got.dtype))), (mode, fmt)
        one = simfloat.round(x[0], fmt, mode, seed=3)
        assert one.view(_uint(one.dtype)) == want[0].view(_uint(one.dtype))


# -- threads
# ------------------------------------------------------------------------------------------------------


def test_bitwise_identical_across_thread_counts(rng: np.random.Generator) -> None:
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("numba has a single thread here")
    n = 3 * 65536 + 1234  # several parallel chunks and a ragged tail
    x = rng.standard_normal(n) * np.ldexp(1.0, rng.integers(-30, 30, n))
    x[::97] = np.ldexp(1.0, rng.integers(-150, -120, x[::97].size))
    before = numba.get_num_threads()
    try:
        for dtype in (np.float64, np.float32):
            xd = x.astype(dtype)
            for fmt in ("bf16", "fp16", "e4m3", "e2m1"):
                for mode in ALL_MODES:
                    numba.set_num_threads(1)
                    one = simfloat.round(xd, fmt, mode, seed=77)
                    numba.set_num_threads(2)
                    two = simfloat.round(xd, fmt, mode, seed=77)
                    assert_same(xd, two, one, f"{fmt} {mode} {np.dtype(dtype).name}")
    finally:
        numba.set_num_threads(before)


# -- the njit scalar API: round_exact(s, sticky(s, e)) of TwoSum pairs
# ---------------------------------------------


@numba.njit(cache=False)
def _round_sum(a, b, p, mode):  # type: ignore[no-untyped-def]
    out = np.empty(a.size, np.float64)
    cls = np.empty(a.size, np.int64)
    for i in range(a.size):
        s = a[i] + b[i]  # TwoSum (Knuth): s + e == a + b exactly
        bb = s - a[i]
        e = (a[i] - (s - bb)) + (b[i] - bb)
        d = sticky(s, e)
        cls[i] = d
        out[i] = round_exact(s, d, p, mode, np.uint64(0))
    return out, cls


def _two_sum(a: float, b: float) -> tuple[float, float]:
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


def _sum_pairs(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    n = 1500
    a = rng.standard_normal(n) * np.ldexp(1.0, rng.integers(-20, 20, n))
    b = a * np.ldexp(1.0, -rng.integers(1, 70, n)) * np.where(rng.random(n) < 0.5, -1, 1) * (1 + rng.random(n))
    pa, pb = [], []
    for k in (-1022, -1000, -130, -126, -20, -1, 0, 1, 7, 15, 100, 1000, 1023):
        p2 = math.ldexp(1.0, k)
        for tail_exp in (53, 54, 55, 60, 80):
            for sign in (1, -1):
                t = math.ldexp(1.0, k - tail_exp)
                if t == 0 or not math.isfinite(p2):
                    continue
                pa += [p2, -p2, p2, -p2]
                pb += [-sign * t, sign * t, sign * 3 * t, -sign * 3 * t]
        # exact half-ulp tails of odd and even significands: TwoSum leaves e = +-ulp(s)/2
        for sig in (1.0, 1.0 + 2.0**-52, 1.5, 1.0 + 3 * 2.0**-52, 2 - 2.0**-52):
            v = math.ldexp(sig, k)
            if not math.isfinite(v) or v == 0:
                continue
            half = math.ulp(v) / 2
            if half == 0:
                continue
            pa += [v, v, -v, -v]
            pb += [half, -half, half, -half]
    # bf16 / fp16 / e4m3 midpoints with small tails: ties and near-ties in the small formats
    for v in (1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8, 65504.0 + 16, 448.0 + 16, 2.0**-133, 3 * 2.0**-134, 2.0**-25):
        for t in (0.0, 2.0**-70, -(2.0**-70), 2.0**-200, -(2.0**-200)):
            pa.append(v)
            pb.append(t * v)
    a = np.concatenate([a, pa, [0.0, 1.0, -1.0, 5e-324, 1e308, 1e308]])
    b = np.concatenate([b, pb, [0.0, -1.0, 1.0, 5e-324, 1e308, -1e308]])
    return a, b


@pytest.mark.parametrize(
    "fmt",
    [
        "float64",
        "float32",
        "bfloat16",
        "float16",
        "float8_e4m3fn",
        "float8_e5m2fnuz",
        "float4_e2m1fn",
        "e6m9",
    ],
)
def test_round_exact_of_two_sum(fmt: str, rng: np.random.Generator) -> None:
    f = simfloat.format(fmt)
    a, b = _sum_pairs(rng)
    with np.errstate(over="ignore"):
        exact = [Fraction(x) + Fraction(y) for x, y in zip(a.tolist(), b.tolist(), strict=True)]
    with np.errstate(over="ignore"):
        fin = np.isfinite(a + b)
    ref = {m: [] for m in MODES}
    for v, ok in zip(exact, fin.tolist(), strict=True):
        r = oracle.round_ref_all(v, f) if ok else [math.nan] * len(MODES)
        for m, rv in zip(MODES, r, strict=True):
            ref[m].append(rv)
    for mode in MODES:
        with np.errstate(over="ignore", invalid="ignore"):
            got, cls = _round_sum(a, b, f.params, int(mode_code(mode)))
        want = np.array(ref[mode])
        # a sum that is exactly zero is +0 in round-to-nearest (IEEE): the oracle's Fraction has no sign
        assert_same(a[fin], got[fin], want[fin], f"{fmt} {mode} round_exact(TwoSum)")
    # the tail classes the sums produced: exact, strictly inside half an ulp, exactly half an ulp
    assert {-2, -1, 0, 1, 2} <= set(cls.tolist())


def test_sticky_classes() -> None:
    """sticky(s, e) is 0 for e == 0, +-2 when |e| is exactly half an ulp of s, +-1 when strictly less."""
    n_two = 0
    for s in (
        1.0,
        1.5,
        2.0**-1000,
        2.0**-1021,
        2.0**-1022,
        3 * 2.0**-1074,
        1e300,
        -1.0,
        -(2.0**-1021),
        2.0**1023,
    ):
        u = math.ulp(s)
        for e in (0.0, u / 2, -u / 2, u / 4, -u / 4, u * 0.375, -u * 0.375, u / 2**40, 5e-324, -5e-324):
            if abs(Fraction(e)) > Fraction(u) / 2:
                continue  # not a tail TwoSum can give
            half = Fraction(u) / 2
            want = 0 if e == 0 else int(math.copysign(2 if Fraction(abs(e)) == half else 1, e))
            n_two += abs(want) == 2
            assert sticky(s, e) == want, (s, e, want)
    assert n_two >= 10
    # a power of two with a negative tail of a quarter ulp: strictly inside (the binade below is finer)
    assert sticky(1.0, -(2.0**-54)) == -1
    s, e = _two_sum(1.0, -(2.0**-54))
    assert (s, e) == (1.0, -(2.0**-54))


def test_power_of_two_with_negative_tail() -> None:
    """s = 2**k with a negative tail lies in the binade *below* s: directed and odd rounding must go below."""
    p64 = simfloat.float64.params
    p32 = simfloat.float32.params
    for k in (-1000, -1, 0, 3, 1000):
        s = math.ldexp(1.0, k)
        for t_exp in (54, 55, 80):
            e = -math.ldexp(1.0, k - t_exp)
            d = sticky(s, e)
            exact = Fraction(s) + Fraction(e)
            for f, p in (
                (simfloat.float64, p64),
                (simfloat.float32, p32),
                (simfloat.bfloat16, simfloat.bfloat16.params),
            ):
                for mode in MODES:
                    got = round_exact(s, d, p, int(mode_code(mode)), np.uint64(0))
                    want = oracle.round_ref(exact, f, mode)
                    assert got == want or (math.isnan(got) and math.isnan(want)), (
                        k,
                        t_exp,
                        f.name,
                        mode,
                        got,
                        want,
                    )
    # the tie one quarter-ulp below a power of two goes to the even neighbour (2**k) in float64
    assert round_exact(1.0, sticky(1.0, -(2.0**-54)), p64, 0, np.uint64(0)) == 1.0
    assert round_exact(1.0, sticky(1.0, -(2.0**-54)), p64, int(RoundingMode.DOWN), np.uint64(0)) == 1 - 2.0**-53
    assert round_exact(1.0, sticky(1.0, -(2.0**-54)), p64, int(RoundingMode.ODD), np.uint64(0)) == 1 - 2.0**-53


def test_round_scalar_matches_round() -> None:
    for fmt in ("bf16", "e4m3", "fp16"):
        p = simfloat.format(fmt).params
        for x in (1.0 + 2.0**-9, -(2.0**-20) * 1.3, 1e9, np.nan, -np.inf, -0.0):
            for mode in MODES:
                code = int(mode_code(mode))
                a = round_scalar(float(x), p, code, np.uint64(0))
                b = float(simfloat.round(np.array(x), fmt, mode))
                assert a == b or (math.isnan(a) and math.isnan(b))
                assert math.copysign(1, a) == math.copysign(1, b) or math.isnan(a)


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    """A generator seeded from the test's id: the same numbers on every run, different ones per test."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))
