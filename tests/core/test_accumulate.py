"""Accumulation models: hand-worked cases that expose each parameter, and API behaviour."""

from __future__ import annotations

from fractions import Fraction

import numba
import numpy as np
import pytest

import simfloat as sf
from simfloat.accumulate import BlockFMA, Chunked, Sequential, dot, matmul, split_k, tensor_core

ONE = np.ones


def test_fraction_bits_decide_what_survives_alignment():
    # c = 1, fifteen products 1.5 * 2**-25: with F = 25 the quantum is 2**-25 and each keeps 2**-25;
    # with F = 24 the quantum is 2**-24 and each is truncated to zero.
    b = np.full(15, 1.5 * 2.0**-25)
    a = ONE(15)
    f25 = dot(a, b, 1.0, acc=BlockFMA(16, 25))
    f24 = dot(a, b, 1.0, acc=BlockFMA(16, 24))
    assert f24 == 1.0
    # 1 + 15 * 2**-25 = 1 + 3.75 * 2**-23, rounded toward zero into fp32: 1 + 3 * 2**-23
    assert f25 == 1.0 + 3 * 2.0**-23


def test_block_size_decides_which_products_are_aligned_together():
    # fifteen tiny products, then a 1.0 in the 16th position
    b = np.full(16, 1.5 * 2.0**-26)
    b[15] = 1.0
    a = ONE(16)
    # one block of 16: the tiny ones are aligned to 1.0 and vanish (0.75 quantum each, truncated)
    assert dot(a, b, acc=BlockFMA(16, 25)) == 1.0
    # blocks of 8: the first 8 tiny ones add exactly (12 * 2**-26), enter the next block as the accumulator
    # (6 * 2**-25 at its quantum), its 7 tiny ones vanish: 1 + 1.5 * 2**-23 -> RZ -> 1 + 2**-23
    assert dot(a, b, acc=BlockFMA(8, 25)) == 1.0 + 2.0**-23


def test_output_rounding_mode():
    a = np.array([1.0])
    b = np.array([1.5 * 2.0**-24])
    assert dot(a, b, 1.0, acc=BlockFMA(16, 25, out_mode="toward_zero")) == 1.0
    assert dot(a, b, 1.0, acc=BlockFMA(16, 25, out_mode="nearest_even")) == 1.0 + 2.0**-23


def test_alignment_by_exponent_sum_keeps_a_bit_for_large_significand_products():
    # 1.5 * 1.5 = 2.25 has exponent 1 but its operands' exponents sum to 0. Fifteen products 1.5 * 2**-25 next
    # to it: aligned by the product's exponent (quantum 2**-24) each is 0.75 quantum and vanishes; aligned by the
    # exponent sum (quantum 2**-25) each keeps 2**-25, 15 * 2**-25 in all, and RZ into fp32 (ulp 2**-22 at 2.25)
    # leaves 2.25 + 2**-22.
    a = np.ones(16)
    a[0] = 1.5
    b = np.full(16, 1.5 * 2.0**-25)
    b[0] = 1.5
    assert dot(a, b, acc=BlockFMA(16, 25)) == 2.25
    assert dot(a, b, acc=BlockFMA(16, 25, align="exponent_sum")) == 2.25 + 2.0**-22
    # subnormal operands count with the format's emin (the exponent field), not their own exponent
    sub = 2.0**-16  # an fp16 subnormal (emin = -14)
    big = np.array([sub, 1.0])
    other = np.array([1.0, 1.0])
    plain = dot(big, other, acc=BlockFMA(2, 25, align="exponent_sum"))
    clamped = dot(big, other, acc=BlockFMA(2, 25, align="exponent_sum", operand_emin=-14))
    assert plain == clamped == 1.0 + 2.0**-16  # both keep it here: 2**-16 is far above the 2**-25 quantum


def test_truncation_is_sign_magnitude():
    # -1.5 * 2**-25 next to 1.0 with F = 24 truncates toward zero (to 0), not toward -inf (to -2**-24)
    assert dot(np.array([1.0, 1.0]), np.array([1.0, -1.5 * 2.0**-25]), acc=BlockFMA(2, 24)) == 1.0


def test_accumulator_takes_part_in_alignment():
    # a small accumulator next to a large product loses its low bits
    c = 1.0 + 2.0**-23  # fp32 value
    r = dot(np.array([1.0]), np.array([4.0]), c, acc=BlockFMA(16, 24))
    # aligned to 2**2, quantum 2**-22: c keeps 1.0 (2**-23 truncated); 4 + 1 = 5 exactly
    assert r == 5.0


def test_sequential_rounds_every_step_and_fuses_products():
    a = np.array([1.0, 1.0, 1.0])
    b = np.array([1.0, 2.0**-24, 2.0**-24])
    # fp32 RNE: 1 + 2**-24 is a tie -> 1 (even); again -> 1
    assert dot(a, b, acc=Sequential("fp32")) == 1.0
    # the two small ones first: 2**-23, then 1 + 2**-23 exact
    assert dot(a[::-1], b[::-1], acc=Sequential("fp32")) == 1.0 + 2.0**-23
    # fused step: x*x = 1 + 2**-5 + 2**-12 is rounded once into bf16 (within half an ulp of the exact product)
    x = 1.0 + 2.0**-6
    fused = dot(np.array([x]), np.array([x]), 0.0, acc=Sequential("bf16"))
    exact = Fraction(x) * Fraction(x)
    assert abs(Fraction(fused) - exact) <= Fraction(2.0**-7) / 2


def test_product_format_rounds_products_first():
    x = 1.0 + 2.0**-4
    # x*x = 1 + 2**-3 + 2**-8 is first rounded into e5m2 (2 fraction bits), then added exactly into fp32
    r_prod = dot(np.array([x]), np.array([x]), acc=Sequential("fp32", product_fmt="e5m2"))
    assert r_prod == float(sf.round(np.array(x * x), "e5m2")[()])
    assert dot(np.array([x]), np.array([x]), acc=Sequential("fp32")) == x * x


def test_chunked_and_split_k():
    rng = np.random.default_rng(3)
    a = sf.round(rng.standard_normal(100), "bf16")
    b = sf.round(rng.standard_normal(100), "bf16")
    seq = Sequential("bf16")
    ch = dot(a, b, acc=Chunked(chunk=25, inner=seq, outer_fmt="bf16"))
    manual = 0.0
    for lo in range(0, 100, 25):
        part = dot(a[lo : lo + 25], b[lo : lo + 25], acc=seq)
        manual = float(sf.round(np.array(manual + part), "bf16")[()])
    assert ch == manual
    assert dot(a, b, acc=split_k(4, seq, "bf16")) == ch


def test_tensor_core_presets():
    assert tensor_core("sm80", "bf16", variant="fasi2021") == BlockFMA(8, 24)
    assert tensor_core("sm80", "bf16") == BlockFMA(
        8, 24, align="exponent_sum", operand_emin=-126, acc_emin=-126, zero_exp=-132
    )
    assert tensor_core("sm90", "fp16") == BlockFMA(16, 25, align="exponent_sum", operand_emin=-14)
    assert tensor_core("sm90", "bf16") == BlockFMA(16, 25, align="exponent_sum", operand_emin=-126)
    tf = tensor_core("sm90", "tf32")
    assert (tf.block, tf.fraction_bits, sf.format(tf.input_fmt).name) == (8, 25, "tfloat32")
    f8 = tensor_core("sm90", "e4m3")
    assert (f8.block, f8.fraction_bits, sf.format(f8.out_fmt).mantissa_bits) == (32, 13, 13)
    assert (f8.align, f8.operand_emin) == ("exponent_sum", -6)
    with pytest.raises(ValueError, match="arch"):
        tensor_core("sm60", "bf16")
    with pytest.raises(ValueError, match="fp16 operands only"):
        tensor_core("sm70", "bf16")
    with pytest.raises(ValueError, match="sm80"):
        tensor_core("sm80", "e4m3")


def test_tf32_operands_are_truncated():
    x = 1.0 + 2.0**-11 + 2.0**-12  # fp32 value; tf32 keeps 10 fraction bits
    r = dot(np.array([x]), np.array([1.0]), acc=tensor_core("sm90", "fp32"))
    assert r == 1.0  # toward zero: 2**-11 and 2**-12 are below tf32's last bit (2**-10)


def test_fp8_block_output_is_e8m13():
    # 1 + 2**-14 survives F = 13? no: quantum 2**-13 -> truncated
    r = dot(np.array([1.0, 1.0]), np.array([1.0, 2.0**-13 + 2.0**-14]), acc=tensor_core("sm90", "e4m3"))
    assert r == 1.0 + 2.0**-13


@pytest.mark.parametrize(
    "model", [Sequential("fp32"), BlockFMA(16, 25), Chunked(chunk=7, inner=BlockFMA(8, 24))], ids=str
)
def test_matmul_matches_dot_and_broadcasts(model):
    rng = np.random.default_rng(0)
    a = sf.round(rng.standard_normal((2, 3, 5, 37)), "bf16")
    b = sf.round(rng.standard_normal((37, 4)), "bf16")
    c = sf.round(rng.standard_normal((5, 4)), "fp32")
    r = matmul(a, b, c, acc=model)
    assert r.shape == (2, 3, 5, 4)
    for idx in [(0, 0, 0, 0), (1, 2, 4, 3), (0, 1, 2, 1)]:
        assert r[idx] == dot(a[idx[:3]], b[:, idx[3]], c[idx[2], idx[3]], acc=model)
    assert np.abs(r - (a @ b + c)).max() < 1e-4


def test_matmul_deterministic_across_thread_counts():
    rng = np.random.default_rng(1)
    a = sf.round(rng.standard_normal((97, 64)), "bf16")
    b = sf.round(rng.standard_normal((64, 33)), "bf16")
    model = tensor_core("sm90", "bf16")
    prev = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        r1 = matmul(a, b, acc=model)
        numba.set_num_threads(max(2, prev))
        r2 = matmul(a, b, acc=model)
    finally:
        numba.set_num_threads(prev)
    assert np.array_equal(r1.view(np.uint64), r2.view(np.uint64))


def test_special_values_propagate():
    r = dot(np.array([np.inf, 1.0]), np.array([1.0, 1.0]), acc=BlockFMA(16, 25))
    assert r == np.inf
    r = dot(np.array([np.inf, 1.0]), np.array([0.0, 1.0]), acc=Sequential("fp32"))
    assert np.isnan(r)


def test_bad_inputs():
    with pytest.raises(ValueError, match="inner dimensions"):
        matmul(np.zeros((2, 3)), np.zeros((4, 2)), acc=Sequential())
    with pytest.raises(TypeError, match="dtype"):
        matmul(np.zeros((2, 3), dtype=np.int32), np.zeros((3, 2)), acc=Sequential())
    with pytest.raises(TypeError, match="model"):
        matmul(np.zeros((2, 3)), np.zeros((3, 2)), acc="fp32")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="block"):
        BlockFMA(0, 24)
    with pytest.raises(ValueError, match="exactly one"):
        Chunked(chunk=4, splits=2)
    with pytest.raises(ValueError, match="unknown format"):
        matmul(np.zeros((2, 3)), np.zeros((3, 2)), acc=Sequential("fp13"))
