"""simfloat.attention.Plan: presets, replace, validation, and the njit parameters."""

from __future__ import annotations

import math

import numpy as np
import pytest

import simfloat as sf
from simfloat.accumulate import BlockFMA, Chunked, Sequential, acc_params, tensor_core
from simfloat.attention import BASELINE_OPS, FLASH_OPS, OpSpec, Plan, plan, presets

FMTS = ("bf16", "fp16", "fp32", "tf32", "e4m3", "e5m2")


def test_preset_names():
    names = set(presets())
    assert "fp64" in names
    for f in FMTS:
        assert f"all-{f}" in names and f"triton-{f}" in names
    for f in ("bf16", "fp16", "fp32"):
        assert f"pytorch-{f}" in names
    for name, pl in presets().items():
        assert pl.name == name and plan(name) is plan(name)


@pytest.mark.parametrize("f", FMTS)
def test_all_fmt_rounds_everything_into_fmt(f):
    pl = plan(f"all-{f}")
    fmt = sf.format(f)
    for op in set(FLASH_OPS + BASELINE_OPS) - {"qk", "pv", "l_ij"}:
        assert getattr(pl, op) == OpSpec(fmt)
    assert acc_params(pl.l_ij) == acc_params(Sequential(fmt))
    assert acc_params(pl.qk) == acc_params(pl.pv) == acc_params(Sequential(fmt, product_fmt=fmt))
    assert not pl.exp2 and not pl.contract and pl.normalization == "deferred" and pl.lazy_threshold is None


@pytest.mark.parametrize("f", ["bf16", "fp16", "e4m3", "e5m2"])
def test_triton_plan_is_the_kernels(f):
    pl = plan(f"triton-{f}")
    fmt = sf.format(f)
    for op in ("scale", "exp", "m_i", "alpha", "l_i", "acc", "normalize"):
        assert getattr(pl, op) == OpSpec(sf.float32), op
    assert pl.p == pl.out == OpSpec(fmt)
    assert acc_params(pl.qk) == acc_params(pl.pv) == acc_params(tensor_core("sm90", fmt))
    assert pl.exp2 and pl.contract


def test_triton_fp32_and_tf32():
    assert acc_params(plan("triton-fp32").qk) == acc_params(Sequential("float32"))
    assert acc_params(plan("triton-tf32").qk) == acc_params(tensor_core("sm90", "tf32"))
    assert plan("triton-tf32").p == plan("triton-tf32").out == OpSpec(sf.float32)


def test_replace_forms():
    pl = plan("fp64").replace(
        exp="bf16",
        p=("fp16", "rz"),
        out=OpSpec(sf.float8_e4m3fn, "nearest_away"),
        qk=BlockFMA(16, 25),
        pv="bf16",
        lazy_threshold=3,
        exp2=True,
    )
    assert pl.exp == OpSpec(sf.bfloat16)
    assert pl.p == OpSpec(sf.float16, sf.RoundingMode.TOWARD_ZERO)
    assert pl.out.mode == sf.RoundingMode.NEAREST_AWAY
    assert pl.qk == BlockFMA(16, 25)
    assert acc_params(pl.pv) == acc_params(Sequential(sf.bfloat16, product_fmt=sf.bfloat16))
    assert pl.lazy_threshold == 3.0 and pl.exp2 and pl.name == "fp64*"
    assert pl.replace(out="fp32").name == "fp64*"
    assert plan("fp64").exp == OpSpec(sf.float64)  # presets unchanged
    assert "exp=bfloat16" in str(pl)


@pytest.mark.parametrize(
    "changes,err,match",
    [
        (dict(expp="bf16"), ValueError, "qk, scale, exp"),
        (dict(exp=BlockFMA(16, 25)), TypeError, "accumulation models"),
        (dict(exp=3), TypeError, "exp"),
        (dict(qk=1.0), TypeError, "qk"),
        (dict(exp="bogus"), ValueError, "unknown format"),
        (dict(exp=("bf16", "sideways")), ValueError, "rounding mode"),
        (dict(exp=("bf16", "stochastic")), ValueError, "stochastic"),
        (dict(qk=Sequential("bf16", mode="stochastic")), ValueError, "stochastic"),
        (dict(qk=Chunked(4, BlockFMA(16, 25, out_mode="sr"))), ValueError, "stochastic"),
        (dict(exp2=1), TypeError, "exp2"),
        (dict(normalization="lazy"), ValueError, "normalization"),
        (dict(lazy_threshold=-1.0), ValueError, "lazy_threshold"),
        (dict(lazy_threshold="1"), TypeError, "lazy_threshold"),
        (dict(name=5), TypeError, "name"),
    ],
)
def test_validation(changes, err, match):
    with pytest.raises(err, match=match):
        plan("fp64").replace(**changes)


def test_plan_lookup_errors():
    with pytest.raises(ValueError, match="triton-bf16"):
        plan("triton-bf17")
    with pytest.raises(TypeError):
        plan(None)
    assert plan(plan("fp64")) is plan("fp64")
    assert isinstance(plan("fp64"), Plan)


def test_qk_scale_is_the_kernels_host_computation():
    # simfloat_gpu/kernels/flash_attention.py H1: fp32(fp32(scale) * fp32(1.44269504))
    for d in (16, 64, 96, 128):
        scale = 1.0 / math.sqrt(d)
        want = float(np.float32(scale) * np.float32(1.44269504))
        assert plan("triton-bf16").params(scale).qk_scale == want
    pp = plan("fp64").params(0.125)
    assert pp.qk_scale == pp.sm_scale == pp.qk_scale64 == 0.125
    assert plan("all-bf16").params(0.3).sm_scale == float(sf.round(np.float64(0.3), "bf16"))
    with pytest.raises(ValueError, match="finite and > 0"):
        plan("all-e4m3").params(1e-6)


@pytest.mark.parametrize(
    "name,changes,kernel",
    [
        ("triton-bf16", dict(softmax="bf16"), "flash"),
        ("h200-fp16", dict(softmax="fp16", out="fp32"), "flash"),
        ("triton-bf16*", dict(softmax="bf16"), "flash"),
        ("pytorch-bf16", dict(exp="bf16"), "baseline"),
        ("pytorch-bf16", dict(l_i="bf16", out="fp32"), "baseline"),
        ("pytorch-fp16", dict(p="bf16"), "baseline"),
        ("pytorch-fp16", dict(exp2=True), "baseline"),
    ],
)
def test_replace_rejects_what_the_plans_kernel_never_uses(name, changes, kernel):
    pl = plan(name.rstrip("*"))
    if name.endswith("*"):
        pl = pl.replace(out="fp32")  # a derived plan keeps its preset's kernel
        assert pl.name == name
    ops = FLASH_OPS if kernel == "flash" else BASELINE_OPS
    unused = sorted(set(changes) - set(ops))
    with pytest.raises(ValueError) as exc:
        pl.replace(**changes)
    msg = str(exc.value)
    assert f"{kernel} kernel" in msg and ", ".join(ops) in msg and all(repr(u) in msg for u in unused), msg


def test_replace_keeps_every_op_of_plans_for_both_kernels():
    for name in ("fp64", "all-bf16"):
        pl = plan(name).replace(softmax="fp16", exp="fp16", l_i="fp16", exp2=True)
        assert pl.softmax == pl.exp == pl.l_i == OpSpec(sf.float16) and pl.exp2
    assert plan("triton-bf16").replace(out="fp32", p="fp16").p == OpSpec(sf.float16)
    assert plan("pytorch-bf16").replace(softmax="bf16", qk="fp32", pv="fp32").softmax == OpSpec(sf.bfloat16)


def test_the_kernel_a_plan_is_for_is_a_field_not_its_name():
    assert [plan(n).kernel for n in ("triton-bf16", "h200-bf16", "pytorch-bf16", "fp64", "all-bf16")] == [
        "flash",
        "flash",
        "baseline",
        "any",
        "any",
    ]
    renamed = plan("fp64").replace(name="triton-mine")  # the name no longer decides
    assert renamed.kernels() == ("flash", "baseline")
    torch_like = plan("fp64").replace(name="mine", kernel="baseline")
    assert torch_like.kernels() == ("baseline",)
    with pytest.raises(ValueError, match="never uses"):
        torch_like.replace(exp="bf16")
    assert plan("triton-bf16").replace(name="x").kernel == "flash"  # derived plans keep it


def test_one_preset_table_holds_the_float_and_the_quantized_plans():
    table = presets()
    quantized = {n for n, p in table.items() if p.quantized}
    assert {"int8-reference", "fp8-e4m3", "sage2-int8-fp8", "sage3-fp4", "quant-fp64"} <= quantized
    assert {"fp64", "triton-bf16", "h200-bf16", "pytorch-bf16"}.isdisjoint(quantized)
    for name in quantized:
        assert plan(name).kernels() == ("flash",) and plan(name).ops()[0] == "rotate"
