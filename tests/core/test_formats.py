"""FloatFormat: finfo-named properties against ml_dtypes/numpy, names and aliases, validation; and the test
oracle's model of each format's encoding against ml_dtypes' decoding of every code."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import oracle
import pytest

import simfloat
from simfloat.formats import FloatFormat, FormatParams

# every simfloat format that ml_dtypes (or numpy) implements, by the name of its finfo type
ML_TYPES = {
    "float64": np.float64,
    "float32": np.float32,
    "float16": np.float16,
    "bfloat16": ml_dtypes.bfloat16,
    "float8_e4m3fn": ml_dtypes.float8_e4m3fn,
    "float8_e5m2": ml_dtypes.float8_e5m2,
    "float8_e4m3": ml_dtypes.float8_e4m3,
    "float8_e3m4": ml_dtypes.float8_e3m4,
    "float8_e8m0fnu": ml_dtypes.float8_e8m0fnu,
    "float8_e4m3fnuz": ml_dtypes.float8_e4m3fnuz,
    "float8_e5m2fnuz": ml_dtypes.float8_e5m2fnuz,
    "float6_e2m3fn": ml_dtypes.float6_e2m3fn,
    "float6_e3m2fn": ml_dtypes.float6_e3m2fn,
    "float4_e2m1fn": ml_dtypes.float4_e2m1fn,
}
# ml_dtypes formats that are not named in simfloat but are expressible as a FloatFormat (IEEE-like)
CUSTOM_ML = {
    "e3m4": (simfloat.format("e3m4"), ml_dtypes.float8_e3m4),
}
# not expressible: float8_e4m3b11fnuz (bias 11 is not the fnuz bias 8)


def _finfo(t):  # type: ignore[no-untyped-def]
    return np.finfo(t) if t in (np.float16, np.float32, np.float64) else ml_dtypes.finfo(t)


def _all_pairs():  # type: ignore[no-untyped-def]
    pairs = [(simfloat.format(n), t) for n, t in ML_TYPES.items()]
    pairs += list(CUSTOM_ML.values())
    return pairs


PAIRS = _all_pairs()
PAIR_IDS = [f.name for f, _ in PAIRS]


def test_every_ml_dtypes_format_is_covered() -> None:
    named = {n for n in dir(ml_dtypes) if n.startswith("float") and isinstance(getattr(ml_dtypes, n), type)}
    skipped = {"float8_e4m3b11fnuz"}
    assert named - skipped <= set(ML_TYPES) | set(CUSTOM_ML), named - skipped - set(ML_TYPES) - set(CUSTOM_ML)
    assert set(simfloat.formats()) - set(ML_TYPES) == {"tfloat32", "ue4m3"}


@pytest.mark.parametrize(("fmt", "t"), PAIRS, ids=PAIR_IDS)
def test_properties_match_finfo(fmt: FloatFormat, t: type) -> None:
    fi = _finfo(t)
    assert fmt.bits == fi.bits
    assert fmt.exponent_bits == fi.nexp
    assert fmt.mantissa_bits == fi.nmant
    assert fmt.emin == fi.minexp
    assert fmt.emax == fi.maxexp - 1
    assert fmt.max == float(fi.max)
    assert fmt.tiny == float(fi.smallest_normal) == float(fi.tiny)
    assert fmt.smallest_normal == fmt.tiny
    assert fmt.smallest_subnormal == float(fi.smallest_subnormal)
    assert fmt.eps == float(fi.eps)
    assert fmt.epsneg == float(fi.epsneg)
    assert fmt.min == float(fi.min)
    assert fmt.precision == fi.nmant + 1
    # the bias is the exponent field of 1.0's code
    one = np.array(1.0, dtype=t).view(f"u{np.dtype(t).itemsize}")
    assert fmt.bias == (int(one) >> fmt.mantissa_bits) & ((1 << fmt.exponent_bits) - 1)
    # specials: infinities, NaN, negative zero as ml_dtypes encodes them
    with np.errstate(over="ignore", invalid="ignore"):
        assert fmt.has_infinity == bool(np.isinf(np.array(np.inf, dtype=t).astype(np.float64)))
        assert fmt.has_nan == bool(np.isnan(np.array(np.nan, dtype=t).astype(np.float64)))
    neg0 = np.array(-0.0, dtype=t).astype(np.float64)
    assert fmt.has_negative_zero == bool(np.signbit(neg0))


def test_tfloat32_by_hand() -> None:
    f = simfloat.tfloat32
    assert (f.exponent_bits, f.mantissa_bits, f.bits, f.bias, f.emin, f.emax) == (8, 10, 19, 127, -126, 127)
    assert f.max == (2 - 2.0**-10) * 2.0**127
    assert f.tiny == 2.0**-126
    assert f.smallest_subnormal == 2.0**-136
    assert f.eps == 2.0**-10
    assert f.has_infinity and f.has_nan and f.has_negative_zero and f.overflow == "inf"


def test_custom_e6m9_by_hand() -> None:
    f = simfloat.format("e6m9")
    assert f.name == "e6m9" and isinstance(f, FloatFormat)
    assert (f.exponent_bits, f.mantissa_bits, f.bits, f.bias, f.emin, f.emax) == (6, 9, 16, 31, -30, 31)
    assert f.max == (2 - 2.0**-9) * 2.0**31
    assert f.tiny == 2.0**-30
    assert f.smallest_subnormal == 2.0**-39
    assert f.eps == 2.0**-9
    assert f.nan == "ieee" and f.has_infinity and f.overflow == "inf"
    assert simfloat.format("E6M9 ") == f  # case and surrounding blanks do not matter


@pytest.mark.parametrize(
    ("alias", "name"),
    [
        ("bf16", "bfloat16"),
        ("fp16", "float16"),
        ("tf32", "tfloat32"),
        ("fp32", "float32"),
        ("fp64", "float64"),
        ("e4m3", "float8_e4m3fn"),
        ("e5m2", "float8_e5m2"),
        ("half", "float16"),
        ("fp4", "float4_e2m1fn"),
        ("BF16", "bfloat16"),
    ],
)
def test_aliases(alias: str, name: str) -> None:
    assert simfloat.format(alias) is simfloat.formats()[name]
    assert simfloat.format(name) is simfloat.formats()[name]


def test_named_formats_and_passthrough() -> None:
    fmts = simfloat.formats()
    assert len(fmts) == 16
    for name, f in fmts.items():
        assert f.name == name == str(f)
        assert simfloat.format(f) is f
        assert getattr(simfloat, name) is f
    fmts.clear()  # a copy: the registry is untouched
    assert "bfloat16" in simfloat.formats()


def test_params_tuple() -> None:
    f = simfloat.float8_e4m3fnuz
    p = f.params
    assert isinstance(p, FormatParams)
    assert p == (3, -7, 240.0, 1, False, True, False, True, True, True)


def test_replace_variants() -> None:
    f = simfloat.float16.replace(subnormals=False)
    assert f.name == "float16*" and not f.subnormals
    assert f.smallest_subnormal == f.tiny == 2.0**-14
    s = simfloat.float8_e4m3fn.replace(overflow="saturate", name="e4m3_sat")
    assert s.name == "e4m3_sat" and s.overflow == "saturate" and s.max == 448.0
    assert simfloat.float8_e4m3fn.overflow == "nan"  # frozen original unchanged


@pytest.mark.parametrize(
    ("name", "exc", "text"),
    [
        ("float7", ValueError, "unknown format 'float7'"),
        ("e4m", ValueError, "unknown format"),
        ("em3", ValueError, "unknown format"),
        ("", ValueError, "unknown format"),
        ("e12m3", ValueError, "exponent_bits must be an int in 1..11"),
        ("e5m60", ValueError, "mantissa_bits must be an int in 0..52"),
        (3, TypeError, "format must be a FloatFormat or a name, got int"),
        (None, TypeError, "got NoneType"),
        (np.float16, TypeError, "got type"),
    ],
)
def test_bad_names(name: object, exc: type, text: str) -> None:
    with pytest.raises(exc, match=text):
        simfloat.format(name)  # type: ignore[arg-type]


def test_unknown_name_lists_known_ones() -> None:
    with pytest.raises(ValueError) as ei:
        simfloat.format("bf17")
    msg = str(ei.value)
    assert "bfloat16" in msg and "bf16" in msg and "e<E>m<M>" in msg


@pytest.mark.parametrize(
    ("kwargs", "text"),
    [
        ({"exponent_bits": 0, "mantissa_bits": 3}, "exponent_bits must be an int in 1..11"),
        ({"exponent_bits": 12, "mantissa_bits": 3}, "exponent_bits must be an int in 1..11"),
        ({"exponent_bits": 4.0, "mantissa_bits": 3}, "exponent_bits must be an int"),
        ({"exponent_bits": 4, "mantissa_bits": -1}, "mantissa_bits must be an int in 0..52"),
        ({"exponent_bits": 4, "mantissa_bits": 53}, "mantissa_bits must be an int in 0..52"),
        ({"exponent_bits": 4, "mantissa_bits": "3"}, "mantissa_bits must be an int"),
        ({"exponent_bits": 4, "mantissa_bits": 3, "nan": "quiet"}, "nan must be"),
        ({"exponent_bits": 4, "mantissa_bits": 3, "overflow": "clip"}, "overflow must be"),
        ({"exponent_bits": 4, "mantissa_bits": 3, "nan": "fn"}, "infinities exist only with nan='ieee'"),
        (
            {"exponent_bits": 4, "mantissa_bits": 3, "nan": "fn", "has_infinity": False},
            "overflow='inf' needs a format with infinities",
        ),
        (
            {"exponent_bits": 2, "mantissa_bits": 1, "nan": "none", "has_infinity": False, "overflow": "nan"},
            "overflow='nan' needs a format with a NaN",
        ),
        ({"exponent_bits": 1, "mantissa_bits": 0}, "IEEE-like format needs at least 2 exponent bits"),
        ({"exponent_bits": 1, "mantissa_bits": 2}, "IEEE-like format needs at least 2 exponent bits"),
        (
            {"exponent_bits": 1, "mantissa_bits": 0, "nan": "fn", "has_infinity": False, "overflow": "nan"},
            "no nonzero finite value",
        ),
        (
            {"exponent_bits": 11, "mantissa_bits": 52, "nan": "none", "has_infinity": False, "overflow": "saturate"},
            "outside float64's range",
        ),
        (
            {"exponent_bits": 11, "mantissa_bits": 3, "nan": "fn", "has_infinity": False, "overflow": "nan"},
            "outside float64's range",
        ),
        (
            {"exponent_bits": 11, "mantissa_bits": 52, "nan": "fnuz", "has_infinity": False, "overflow": "nan"},
            "outside float64's range",
        ),
    ],
)
def test_bad_fields(kwargs: dict, text: str) -> None:
    with pytest.raises(ValueError, match=text):
        FloatFormat("bad", **kwargs)


def test_one_exponent_bit_ieee_is_rejected_by_name() -> None:
    """e1m2 as IEEE would have only subnormals (exponent code 1 is inf/NaN): no such format exists."""
    with pytest.raises(ValueError, match="e1m2: an IEEE-like format needs at least 2 exponent bits"):
        simfloat.format("e1m2")


@pytest.mark.parametrize(
    ("nan", "values"),
    [
        ("fn", [0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0]),  # S.1.11 is the NaN
        ("fnuz", [0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75]),
        ("none", [0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5]),
    ],
)
def test_one_exponent_bit_formats_without_infinities(nan: str, values: list[float]) -> None:
    """With one exponent bit, the fn/fnuz/none encodings keep a normal binade: max is its top value."""
    f = FloatFormat(f"e1m2{nan}", 1, 2, nan=nan, has_infinity=False, overflow="saturate")  # type: ignore[arg-type]
    assert f.max == values[-1]
    assert [float(v) for v in oracle.finite_values(f, nonnegative=True)] == values
    assert f.max == float(oracle.spec(f).max)


def test_bad_replace() -> None:
    with pytest.raises(ValueError, match="overflow must be"):
        simfloat.bfloat16.replace(overflow="wrap")
    with pytest.raises(TypeError):
        simfloat.bfloat16.replace(colour="red")


# -- the oracle's encoding model (tests/oracle.py) agrees with ml_dtypes and with FloatFormat
# --------------------


# the oracle models signed formats with a zero code; the scale formats (unsigned / zero-less) are checked code
# by code in tests/core/test_blockfmt_formats.py
ORACLE_PAIRS = [p for p in PAIRS if p[0].bits <= 16 and p[0].signed and p[0].zero]


@pytest.mark.parametrize(("fmt", "t"), ORACLE_PAIRS, ids=[f.name for f, _ in ORACLE_PAIRS])
def test_oracle_decodes_every_code_like_ml_dtypes(fmt: FloatFormat, t: type) -> None:
    nbits = fmt.bits
    width = np.dtype(t).itemsize * 8
    codes = np.arange(1 << nbits, dtype=np.uint64).astype(f"u{width // 8}")
    with np.errstate(invalid="ignore"):
        ml = codes.view(t).astype(np.float64)
    ref = np.array([oracle.decode(int(c), fmt) for c in codes])
    nan = np.isnan(ref)
    assert np.array_equal(nan, np.isnan(ml))
    assert np.array_equal(ref[~nan].view(np.uint64), ml[~nan].view(np.uint64))  # signed zeros too


@pytest.mark.parametrize(
    "fmt", [f for f in simfloat.formats().values() if f.signed and f.zero] + [simfloat.format("e6m9")], ids=str
)
def test_oracle_spec_matches_properties(fmt: FloatFormat) -> None:
    s = oracle.spec(fmt)
    assert s.bias == fmt.bias
    assert s.emin == fmt.emin
    assert float(s.max) == fmt.max
    assert s.bits == fmt.bits
    # the largest finite code decodes to max, the next code up (if any) is not finite
    assert oracle.decode(s.max_code, fmt) == fmt.max
    if s.max_code + 1 < 1 << (fmt.bits - 1):
        assert not math.isfinite(oracle.decode(s.max_code + 1, fmt))


def test_oracle_finite_values_count() -> None:
    # IEEE half: 2 * (31 * 1024) finite codes, minus the duplicate zero
    assert len(oracle.finite_values(simfloat.float16)) == 2 * 31 * 1024 - 1
    # e4m3fn: 256 codes - 2 NaN - 1 duplicate zero; fnuz: 256 - 1 NaN (no -0)
    assert len(oracle.finite_values(simfloat.float8_e4m3fn)) == 253
    assert len(oracle.finite_values(simfloat.float8_e4m3fnuz)) == 255
    # without subnormals: 2 * 7 subnormals fewer
    assert len(oracle.finite_values(simfloat.float8_e4m3fn.replace(subnormals=False))) == 253 - 14


# every named format, and the variants whose rules differ: no subnormals, saturating, unsigned, zero-less
HOLDS_FORMATS = list(simfloat.formats().values()) + [
    simfloat.format("bf16").replace(subnormals=False),
    simfloat.format("e4m3").replace(overflow="saturate"),
    simfloat.format("e5m2").replace(subnormals=False, has_infinity=False, nan="fn", overflow="saturate"),
    FloatFormat("u3m2", 3, 2, nan="fn", has_infinity=False, overflow="nan", signed=False),
]


def _probe(fmt: FloatFormat, rng: np.random.Generator) -> np.ndarray:
    """Values of the format (and those of its neighbours in float64 and float32), midpoints, other scales and
    the special values."""
    top = min(fmt.max, 2.0**1000)
    bottom = fmt.smallest_subnormal
    exps = rng.uniform(np.log2(bottom) - 3, np.log2(top) + 3, 3000)
    sig = np.round(rng.uniform(1, 2, 3000) * 2.0**fmt.mantissa_bits)
    grid = np.ldexp(sig, (np.floor(exps) - fmt.mantissa_bits).astype(int))
    vals = np.concatenate([grid, grid * 1.5, [fmt.max, fmt.tiny, bottom, bottom / 2, 2 * fmt.max, fmt.max + fmt.eps]])
    vals = vals[np.isfinite(vals)]
    with np.errstate(over="ignore"):
        near = [np.nextafter(vals, np.inf), np.nextafter(vals, -np.inf)]
        as32 = np.concatenate([vals, *near]).astype(np.float32).astype(np.float64)
    special = [0.0, -0.0, np.inf, -np.inf, np.nan, 5e-324, 1e308, -1e308]
    x = np.concatenate([vals, *near, as32, special, rng.standard_normal(2000) * 2.0 ** rng.integers(-30, 30, 2000)])
    return np.concatenate([x, -x])


@pytest.mark.parametrize("fmt", HOLDS_FORMATS, ids=lambda f: f.name)
def test_holds_is_rounding_leaves_unchanged(fmt: FloatFormat) -> None:
    """holds (plain numpy) against the rounding kernels: an element is held exactly when rounding it into the
    format gives it back (NaN for NaN)."""
    x = _probe(fmt, np.random.default_rng(fmt.bits))
    with np.errstate(all="ignore"):
        r = simfloat.round(x, fmt)
    want = (r == x) | (np.isnan(r) & np.isnan(x))
    got = fmt.holds(x)
    assert got.shape == x.shape and got.dtype == np.bool_
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, f"{fmt.name}: {x[bad[:5]]!r} held {got[bad[:5]]}, rounding says {want[bad[:5]]}"
    assert want.sum() > 1000 and ((~want).sum() > 1000 or fmt.bits == 64)  # both kinds probed (float64 holds all)
    with np.errstate(over="ignore"):
        x32 = x.astype(np.float32)
    with np.errstate(all="ignore"):
        r32 = simfloat.round(x32, fmt)
    assert np.array_equal(fmt.holds(x32), (r32 == x32) | (np.isnan(r32) & np.isnan(x32)))
