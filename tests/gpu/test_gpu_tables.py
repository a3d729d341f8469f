"""The campaign's own numpy format helpers agree with simfloat's format table and rounding.

``simfloat_gpu.campaign.probes`` and the GPU half of ``simfloat_gpu.campaign.validate`` round into formats with
numpy alone, on purpose: the GPU job runs where simfloat's numerics need not be installed. These tests keep
their numbers (significand bits, exponent ranges, largest values, ulps) equal to ``simfloat.formats``' table
and their roundings equal to ``simfloat.round`` (round to nearest even), and the interpreter's format table
made of simfloat's own format objects. Numpy only, no triton."""

import numpy as np
import pytest

import simfloat
from simfloat.formats import format as sf_format
from simfloat_gpu.campaign import probes, validate
from simfloat_gpu.interpreter import _formats

#: probes' format names -> simfloat's (probes' tf32 operands are fp32 values in memory)
PROBE_FORMATS = {"bf16": "bfloat16", "fp16": "float16", "e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}


def _values(fmt: str, n: int = 4000) -> np.ndarray:
    """float64 values across fmt's whole finite range: normals, subnormals, exact ties, values of fmt."""
    f = sf_format(fmt)
    rng = np.random.default_rng(11)
    e = rng.integers(f.emin - f.mantissa_bits - 1, f.emax + 1, n)
    x = rng.uniform(1.0, 2.0, n) * np.exp2(e.astype(np.float64))
    q = np.exp2(np.maximum(e, f.emin).astype(np.float64) - f.mantissa_bits)
    ties = (np.floor(x[: n // 4] / q[: n // 4]) + 0.5) * q[: n // 4]  # halfway between two values
    x = np.concatenate([x, ties, [0.0, f.smallest_subnormal, f.tiny, f.max]])
    x = x[np.abs(x) <= f.max]
    return np.concatenate([x, -x])


@pytest.mark.parametrize("name", sorted(PROBE_FORMATS))
def test_probes_rounding_is_simfloats(name):
    x = _values(PROBE_FORMATS[name])
    want = np.asarray(simfloat.round(x, PROBE_FORMATS[name]), dtype=np.float64)
    got = probes.to_format(x, name)
    assert np.array_equal(got.view(np.uint64), want.view(np.uint64)), name


@pytest.mark.parametrize("name", sorted(PROBE_FORMATS))
def test_probes_exponent_table_is_simfloats(name):
    """DOT_PARAMS' last entry is the exponent of the format's smallest subnormal."""
    f = sf_format(PROBE_FORMATS[name])
    assert 2.0 ** probes.DOT_PARAMS[name][-1] == f.smallest_subnormal


@pytest.mark.parametrize("name", ["bf16", "fp16"])
def test_validate_rounding_is_simfloats(name):
    x = _values(name).astype(np.float32)
    x = x[np.isfinite(x)]
    want = np.asarray(simfloat.round(x, name), dtype=np.float32)
    got = validate.round_to_format(x, name)
    assert got.dtype == np.float32 and np.array_equal(got.view(np.uint32), want.view(np.uint32)), name


def test_interpreter_formats_are_simfloats_objects():
    for triton_name, fmt in _formats.FORMATS.items():
        assert fmt is sf_format(fmt.name), triton_name
    for short in ("fp64", "fp32", "fp16", "bf16"):  # the names triton shares with simfloat's aliases
        assert _formats.FORMATS[short] is sf_format(short)


def _odd53(n: int) -> float:
    """Reference: n to 53 bits, round to odd, by integer arithmetic."""
    a, s = abs(n), abs(n).bit_length() - 53
    if s <= 0:
        return float(n)
    m = (a >> s) | (1 if a & ((1 << s) - 1) else 0)
    return float(np.copysign(np.ldexp(float(m), s), n))


def _nearest_f32(q):
    """Reference: the fp32 nearest to a rational of normal fp32 magnitude (ties to even), by Fractions."""
    from fractions import Fraction

    a = abs(q)
    e = a.numerator.bit_length() - a.denominator.bit_length()
    e += (Fraction(2) ** (e + 1) <= a) - (Fraction(2) ** e > a)
    scaled = a / Fraction(2) ** (e - 23)
    n = scaled.numerator // scaled.denominator
    rem = scaled - n
    n += rem > Fraction(1, 2) or (rem == Fraction(1, 2) and n % 2 == 1)
    return float(np.copysign(np.ldexp(float(n), e - 23), float(q)))


def test_interpreter_exact_roundings_are_simfloats():
    """The interpreter's two roundings of exact values (int64 beyond 2**53; double-double logs as Fractions)
    are simfloat.round of the exact value: equal to the integer / Fraction references, ties included."""
    from fractions import Fraction

    rng = np.random.default_rng(5)
    ints = [int(x) for x in rng.integers(-(2**63), 2**63 - 1, 300, dtype=np.int64)]
    ints += [2**53 + 1, 2**53 + 2, -(2**60) - 3, 2**62 + 2**9, 2**63 - 1, -(2**63), 5]
    for n in ints:
        assert _formats._round_to_odd_53(n) == _odd53(n), n
    fracs = [Fraction(int(a), int(b)) for a, b in rng.integers(1, 2**40, (300, 2))]
    fracs += [Fraction(2**24 + 1, 2), Fraction(2**24 + 3, 2), Fraction(-(2**24 + 1), 2**30), Fraction(1, 3)]
    for q in fracs:
        assert _formats.fraction_to_f32(q) == _nearest_f32(q), q
