"""The block-FMA row kernels' float32 form (``_rows.operand32``, ``_shift32``): the same bits as the
scalar reference, and taken or left exactly where its conditions say (the tests check which form a row took, so
a form that never applies cannot pass them vacuously)."""

from __future__ import annotations

import numpy as np
import pytest

import simfloat as sf
from simfloat.accumulate import BlockFMA, acc_params, dot_acc, matmul, tensor_core
from simfloat.accumulate._rows import (
    _shift32,
    for_operands,
    mma,
    operand32,
    operand_powers,
    round_operands,
    row_mma,
    work,
)

MODELS = {
    "sm90-bf16": (tensor_core("sm90", "bf16"), "bf16"),
    "sm90-fp16": (tensor_core("sm90", "fp16"), "fp16"),
    "sm90-tf32": (tensor_core("sm90", "tf32"), "fp32"),
    "sm90-e4m3": (tensor_core("sm90", "e4m3"), "e4m3"),
    "sm90-e5m2": (tensor_core("sm90", "e5m2"), "e5m2"),
    "sm80-bf16": (tensor_core("sm80", "bf16"), "bf16"),
    "sm80-mmasim-bf16": (tensor_core("sm80", "bf16", variant="mmasim"), "bf16"),
    "block-F8-rn": (BlockFMA(5, 8, out_fmt="bf16", out_mode="nearest_even", align="exponent_sum"), "bf16"),
}


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    na, nb = np.isnan(a), np.isnan(b)
    return bool(
        np.array_equal(na, nb)
        and np.array_equal(np.where(na, 0.0, a).view(np.uint64), np.where(nb, 0.0, b).view(np.uint64))
    )


def _forms(a: np.ndarray, b: np.ndarray, model) -> tuple[float, list[bool]]:  # type: ignore[no-untyped-def]
    """B's shift in the float32 form (0: not prepared) and, per row of a, whether the row takes it."""
    mp = mma(model)
    ai, bi = round_operands(a[None], mp), round_operands(b[None], mp)
    mp = for_operands(mp, ai, bi)
    ea, eb = np.empty(ai.shape), np.empty(bi.shape)
    operand_powers(ai.reshape(-1), ea.reshape(-1), mp.opnd_emin)
    operand_powers(bi.reshape(-1), eb.reshape(-1), mp.opnd_emin)
    mp, b32, _ = operand32(mp, bi, eb)
    if b32.shape[1] == 0:
        return 0.0, [False] * a.shape[0]
    return mp.b_shift, [_shift32(ai[0, i], ea[0, i], a.shape[1], mp) > 0.0 for i in range(a.shape[0])]


def _check(a: np.ndarray, b: np.ndarray, c: np.ndarray, model) -> None:  # type: ignore[no-untyped-def]
    with np.errstate(all="ignore"):
        vec = matmul(a, b, c, acc=model)
        ref = matmul(a, b, c, acc=model, engine="reference")
    assert _same(vec, ref)


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("kk", [1, 16, 97, 257])
def test_float32_form_equals_reference_on_random_rows(name, kk):
    model, fmt = MODELS[name]
    g = np.random.default_rng(kk * 31 + len(name))
    ea = min(30, sf.format(fmt).emax // 2)  # row scales within the format's range
    a = sf.round(g.standard_normal((21, kk)) * np.exp2(g.integers(-ea, ea, (21, 1))), fmt)
    b = sf.round(g.standard_normal((kk, 37)) * np.exp2(g.integers(-3, 3, (kk, 37))), fmt)
    a[3, : kk // 2] = 0.0
    a[4] = 0.0  # an all-zero row
    a[5] = a[6]
    b[:, 7] = -b[:, 6]
    c = np.zeros((21, 37))
    c[1] = sf.round(g.standard_normal(37), "fp32")
    c[2] = sf.round(g.standard_normal(37), "fp32") * 2.0**200  # accumulators that dwarf every product
    c[8] = sf.round(g.standard_normal(37), "fp32") * 2.0**-120
    c[9, :5] = -np.inf
    shift, rows = _forms(a, b, model)
    if model.align == "exponent_sum" and model.block * (2 ** (model.fraction_bits + 2) - 1) < 2**31:
        assert shift > 0.0 and all(rows), name
    _check(a, b, c, model)


def test_float32_form_at_the_edge_of_its_range():
    """sm90 bf16 (F = 25): a row's nonzero values span at most 2**126, and a nonzero product, shifted, may be as
    small as 2**(F - 126) = 2**-101, so that the term scale stays at most 2**126. At the edge the float32 form is
    taken, one step beyond it the float64 form; both give the reference's bits, including a block whose only
    product is the smallest one (its scale is exactly the largest allowed)."""
    model = tensor_core("sm90", "bf16")
    g = np.random.default_rng(5)
    for span_b, takes in ((75, True), (76, False)):
        b = sf.round(1.0 + 0.5 * g.random((48, 19)), "bf16")
        b[0, :] = 2.0**-span_b  # B's values span 2**span_b
        a = sf.round(1.0 + 0.5 * g.random((6, 48)), "bf16")
        a[:, 0] = 2.0**-126  # each row spans 2**126
        a[1, 1:16] = 0.0  # block 0 of row 1: only the smallest product
        a[2, 1:] = 0.0  # a row of one value spans nothing: always the float32 form
        a[3] *= -1.0
        shift, rows = _forms(a, b, model)
        assert shift > 0.0
        assert rows == [takes, takes, True, takes, takes, takes], span_b
        c = np.zeros((6, 19))
        c[4] = 2.0**-140
        _check(a, b, c, model)
    a = sf.round(1.0 + 0.5 * g.random((2, 48)), "bf16")
    a[0, 0] = 2.0**-127  # a row spanning 2**127: its smallest value leaves float32's normal range
    _, rows = _forms(a, b, model)
    assert rows == [False, True]
    _check(a, b, np.zeros((2, 19)), model)


def test_float32_form_left_for_wide_significands_and_wide_operands():
    """Operands with over 12 significant bits (a bf16 model given float64 values) and a B whose values span
    beyond float32's normal range after the shift take the float64 form, with the reference's bits."""
    model = tensor_core("sm90", "bf16")
    g = np.random.default_rng(9)
    a = sf.round(g.standard_normal((5, 33)), "bf16")
    b = g.standard_normal((33, 11))  # 53-bit values
    assert _forms(a, b, model)[0] == 0.0
    _check(a, b, np.zeros((5, 11)), model)
    a = g.standard_normal((5, 33))
    b = sf.round(g.standard_normal((33, 11)), "bf16")
    shift, rows = _forms(a, b, model)
    assert shift > 0.0 and not any(rows)
    _check(a, b, np.zeros((5, 11)), model)
    a = sf.round(a, "bf16")
    b[0, 0] = 2.0**-200  # shifted, still a normal float32, but no row's products all stay within range
    shift, rows = _forms(a, b, model)
    assert shift > 0.0 and not any(rows)
    _check(a, b, np.zeros((5, 11)), model)
    b[0, 0] = 2.0**-240  # shifted, below float32's normal range
    assert _forms(a, b, model)[0] == 0.0
    _check(a, b, np.zeros((5, 11)), model)


def test_float32_form_subnormal_operands_and_mixed_groups():
    """Format subnormals (their alignment weights clamped to the format's least normal one), rows of both forms
    interleaved in one group of the driver, an odd count of each."""
    for name in ("sm90-bf16", "sm90-fp16", "sm90-e4m3"):
        model, fmt = MODELS[name]
        f = sf.format(fmt)
        g = np.random.default_rng(len(name))
        a = sf.round(g.standard_normal((23, 40)), fmt)
        b = sf.round(g.standard_normal((40, 29)), fmt)
        b[3] = f.smallest_subnormal * g.integers(1, 4, 29)
        a[::3, 5] = f.smallest_subnormal * 3
        a[1::4, 7] = f.smallest_subnormal
        a[2::5, 0] = f.max / 8
        c = sf.round(g.standard_normal((23, 29)), "fp32")
        _, rows = _forms(a, b, model)
        assert any(rows), name
        _check(a, b, c, model)


@pytest.mark.parametrize("name", ["sm90-bf16", "sm90-e4m3", "sm80-mmasim-bf16"])
def test_row_mma_float32_form_equals_the_float64_form_and_dot_acc(name):
    """row_mma (the baseline's and the backward's dots) in its float32 block form, in the float64 form (no
    float32 operands, or scratch narrower than the row), and dot_acc give the same bits."""
    model, fmt = MODELS[name]
    g = np.random.default_rng(11)
    a = sf.round(g.standard_normal((7, 45)) * np.exp2(g.integers(-3, 3, (7, 45))), fmt)
    b = sf.round(g.standard_normal((45, 13)), fmt)
    a[2, :20] = 0.0
    a[4, 3] = -a[4, 3] * 0.0
    mp = for_operands(mma(model), a, b)
    ea, eb = np.empty(a.shape), np.empty(b.shape)
    operand_powers(a.reshape(-1), ea.reshape(-1), mp.opnd_emin)
    operand_powers(b.reshape(-1), eb.reshape(-1), mp.opnd_emin)
    mp32, b32, eb32 = operand32(mp, b[None], eb[None])
    assert mp32.b_shift > 0.0
    none = np.zeros((0, 0), dtype=np.float32)
    ap = acc_params(model)
    for i in range(a.shape[0]):
        c0 = sf.round(g.standard_normal(13), "fp32")
        assert _shift32(a[i], ea[i], 45, mp32) > 0.0
        outs = []
        for m, x32, w32, width in ((mp32, b32[0], eb32[0], 45), (mp, none, none, 45), (mp32, b32[0], eb32[0], 13)):
            c = c0.copy()
            row_mma(a[i], ea[i], b, eb, x32, w32, c, 13, m, work(width))
            outs.append(c)
        ref = np.array([dot_acc(a[i], b[:, j], c0[j], ap) for j in range(13)])
        for c in outs:
            assert _same(c, ref), (name, i)
