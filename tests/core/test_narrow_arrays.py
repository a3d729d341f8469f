"""Arrays a numpy user has: float16 and ml_dtypes arrays (bfloat16, float8_*, float6_*, float4_*) in
simfloat.round and simfloat.ops, widened exactly to float32 (so the results are those of the float32 arrays,
bit for bit, and float32 where the format allows); strings rejected; ml_dtypes never imported by simfloat
itself; accumulation models that check their formats and modes when they are made."""

import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

import simfloat
from simfloat import ops
from simfloat.accumulate import BlockFMA, Chunked, Sequential, tensor_core

NARROW = [
    "float16",
    "bfloat16",
    "float8_e4m3fn",
    "float8_e5m2",
    "float8_e4m3fnuz",
    "float8_e5m2fnuz",
    "float8_e4m3b11fnuz",
    "float8_e8m0fnu",
    "float6_e2m3fn",
    "float6_e3m2fn",
    "float4_e2m1fn",
]


def _every_value(name):
    """Every bit pattern of the dtype (NaNs included) as an array of it."""
    dt = np.dtype(np.float16) if name == "float16" else np.dtype(getattr(ml_dtypes, name))
    bits = np.arange(2 ** (8 * dt.itemsize), dtype=np.uint16 if dt.itemsize == 2 else np.uint8)
    x = bits.view(dt)
    if name.startswith(("float6_", "float4_")):  # stored one per byte: keep the valid codes
        n = 2 ** int(name[5])
        x = bits[:n].view(dt)
    return x


def _bits_equal(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    width = {4: np.uint32, 8: np.uint64}[a.dtype.itemsize]
    np.testing.assert_array_equal(a.view(width), b.view(width))


@pytest.mark.parametrize("name", NARROW)
@pytest.mark.parametrize(
    "fmt, mode",
    [
        ("bf16", "nearest_even"),
        ("e4m3", "toward_zero"),
        ("fp16", "up"),
        ("e3m2", "stochastic"),
        ("e11m7", "nearest_away"),
    ],
)
def test_round_takes_narrow_arrays_as_float32(name, fmt, mode):
    x = _every_value(name)
    wide = x.astype(np.float32)
    got = simfloat.round(x, fmt, mode, seed=7)
    _bits_equal(got, simfloat.round(wide, fmt, mode, seed=7))
    # float32 back where every value of the format is a float32, float64 otherwise (e11m7)
    assert got.dtype == (np.float64 if fmt == "e11m7" else np.float32)


def test_round_of_ml_dtypes_2d_noncontiguous_and_out():
    x = np.random.default_rng(0).standard_normal((6, 9)).astype(ml_dtypes.bfloat16)[:, ::2]
    out = np.empty(x.shape, np.float32)
    assert simfloat.round(x, "e4m3", out=out) is out
    _bits_equal(out, simfloat.round(np.asarray(x, np.float32), "e4m3"))


def test_ml_dtypes_scalars_in_lists():
    got = simfloat.round([ml_dtypes.bfloat16(1.5), ml_dtypes.float8_e4m3fn(-3.0), 0.25], "e4m3")
    np.testing.assert_array_equal(got, [1.5, -3.0, 0.25])


@pytest.mark.parametrize("name", ["float16", "bfloat16", "float8_e5m2", "float4_e2m1fn"])
def test_ops_take_narrow_arrays_as_float32(name):
    x = _every_value(name)
    x = x[np.isfinite(x.astype(np.float32))]
    y = x[::-1].copy()
    xw, yw = x.astype(np.float32), y.astype(np.float32)
    for fn in (ops.add, ops.mul, ops.div):
        got = fn(x, y, "bf16")
        assert got.dtype == np.float32
        _bits_equal(got, fn(xw, yw, "bf16"))
    _bits_equal(ops.fma(x, y, xw, "fp16"), ops.fma(xw, yw, xw, "fp16"))
    _bits_equal(ops.sqrt(np.abs(x), "tf32"), ops.sqrt(np.abs(xw), "tf32"))
    _bits_equal(ops.sum(x, "fp32", axis=None), ops.sum(xw, "fp32", axis=None))
    _bits_equal(ops.max(x, axis=None), ops.max(xw, axis=None))
    assert ops.add(x, 1.0, "e11m7").dtype == np.float64


@pytest.mark.parametrize("x", [["1.5"], ("1.5",), [[1.0], ["2.0"]], np.array(["1.5"]), np.ones(2, ml_dtypes.int4)])
def test_strings_and_integer_ml_dtypes_are_rejected(x):
    with pytest.raises(TypeError, match="float32 or float64"):
        simfloat.round(x, "bf16")
    with pytest.raises(TypeError, match="float32 or float64"):
        ops.add(x, 1.0, "bf16")


def test_import_simfloat_does_not_import_ml_dtypes():
    code = (
        "import sys, numpy as np, simfloat; simfloat.round(np.ones(3, np.float16), 'bf16'); "
        "simfloat.ops.add(np.ones(2, np.float16), 1.0, 'fp16'); assert 'ml_dtypes' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize(
    "make, field, exc",
    [
        (lambda: Sequential("fp32", mode="nearst"), "Sequential.mode: unknown rounding mode 'nearst'", ValueError),
        (lambda: Sequential("fp33"), "Sequential.fmt: unknown format 'fp33'", ValueError),
        (lambda: Sequential(product_fmt="bf17"), "Sequential.product_fmt", ValueError),
        (lambda: Sequential(input_fmt="tf32", input_mode=1.5), "Sequential.input_mode", TypeError),
        (lambda: BlockFMA(16, 25, out_mode="rz_"), "BlockFMA.out_mode", ValueError),
        (lambda: BlockFMA(16, 25, out_fmt=3), "BlockFMA.out_fmt", TypeError),
        (lambda: BlockFMA(16, 25, input_fmt="tf32", input_mode="sideways"), "BlockFMA.input_mode", ValueError),
        (lambda: BlockFMA(16, 25, align="exponent_sum", operand_emin=-14.0), "BlockFMA.operand_emin", TypeError),
        (lambda: Chunked(chunk=4, outer_fmt="fp31"), "Chunked.outer_fmt", ValueError),
        (lambda: Chunked(chunk=4, outer_mode="nearst"), "Chunked.outer_mode", ValueError),
    ],
)
def test_models_check_formats_and_modes_when_made(make, field, exc):
    with pytest.raises(exc, match=field.replace(".", r"\.")):
        make()


def test_valid_models_still_construct():
    assert Sequential("fp32", mode="rz").mode == "rz"  # kept as given; resolved when used
    for arch, fmt in (("sm80", "bf16"), ("sm90", "fp16"), ("sm90", "tf32"), ("sm90", "e5m2")):
        tensor_core(arch, fmt)
    Chunked(splits=2, inner=BlockFMA(8, 24, out_fmt="e8m13"), outer_fmt="bfloat16", outer_mode="toward_zero")
