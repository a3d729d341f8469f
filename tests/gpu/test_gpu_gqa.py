"""Grouped-query / multi-query attention in the Triton kernels (simfloat_gpu/kernels/flash_attention.py,
simfloat_gpu/kernels/int8_attention.py,
simfloat_gpu/kernels/fp8_attention.py): k and v with fewer heads than q, read through the kv-head stride mapping
off_hkv = off_h // GROUP, under simfloat_gpu.interpreter.faithful() equal the emulator (which maps the heads in
simfloat.attention._inputs) BIT FOR BIT: every output element, every m_i and every l_i, on a GQA config
(4 query heads, 2 kv heads) and an MQA config (1 kv head), including a non-contiguous kv view."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from simfloat.attention import flash, fp8_flash, int8_flash, plan  # noqa: E402
from simfloat_gpu.interpreter import faithful  # noqa: E402
from simfloat_gpu.kernels.flash_attention import flash_attention  # noqa: E402
from simfloat_gpu.kernels.fp8_attention import fp8_attention  # noqa: E402
from simfloat_gpu.kernels.int8_attention import int8_attention  # noqa: E402

pytestmark = pytest.mark.triton

HEADS = [(4, 2), (4, 1)]
IDS = ["gqa-4-2", "mqa-4-1"]


def _inputs(hq, hkv, sq, sk, d, dtype, seed, spread=1.0):
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(2, hq, sq, d, generator=g) * spread).to(dtype)
    k = torch.randn(2, hkv, sk, d, generator=g).to(dtype)
    v = torch.randn(2, hkv, sk, d, generator=g).to(dtype)
    return q, k, v


def _np(x):
    return x.float().numpy()


def _assert_bitwise(kernel, emulated):
    for name, a, b in zip(("out", "m", "l"), kernel, emulated, strict=True):
        a = a.float().numpy().astype(np.float64)
        assert a.shape == b.shape, name
        same = a == b
        if not same.all():
            idx = tuple(np.argwhere(~same)[0])
            pytest.fail(
                f"{name}: {same.mean():.4%} bitwise equal; first mismatch at {idx}: kernel {a[idx]!r}, "
                f"emulator {b[idx]!r}"
            )


def _groups_differ(out, hq):
    """Query heads of different groups read different kv heads, so their outputs differ."""
    return not torch.equal(out[:, 0], out[:, hq - 1])


@pytest.mark.parametrize("hq,hkv", HEADS, ids=IDS)
def test_flash_kernel_gqa_equals_emulator_bitwise(hq, hkv):
    q, k, v = _inputs(hq, hkv, 37, 70, 16, torch.bfloat16, seed=hq + hkv, spread=2.0)
    with faithful():
        kernel = flash_attention(
            q, k, v, causal=True, block_m=16, block_n=32, out_dtype=torch.float32, return_stats=True
        )
    emulated = flash(
        _np(q),
        _np(k),
        _np(v),
        plan=plan("triton-bf16").replace(out="float32"),
        block_m=16,
        block_n=32,
        causal=True,
        return_stats=True,
    )
    _assert_bitwise(kernel, emulated)
    assert kernel[0].shape == (2, hq, 37, 16)
    if hkv > 1:
        assert _groups_differ(kernel[0], hq)


def test_flash_kernel_gqa_on_a_strided_kv_view():
    """k and v as a non-contiguous view (every other head of a larger tensor): the strides carry the mapping."""
    q, k, v = _inputs(4, 4, 20, 33, 16, torch.float16, seed=9)
    ks, vs = k[:, ::2], v[:, ::2]  # 2 kv heads, head stride twice the contiguous one
    with faithful():
        kernel = flash_attention(q, ks, vs, block_m=16, block_n=16, return_stats=True)
        dense = flash_attention(
            q, ks.repeat_interleave(2, dim=1), vs.repeat_interleave(2, dim=1), block_m=16, block_n=16, return_stats=True
        )
    for a, b in zip(kernel, dense, strict=True):
        assert torch.equal(a, b)
    emulated = flash(_np(q), _np(ks), _np(vs), plan="triton-fp16", block_m=16, block_n=16, return_stats=True)
    _assert_bitwise(kernel, emulated)


@pytest.mark.parametrize("hq,hkv", HEADS, ids=IDS)
@pytest.mark.parametrize("variant", ["int8", "half-int8"])
def test_int8_kernel_gqa_equals_emulator_bitwise(variant, hq, hkv):
    q, k, v = _inputs(hq, hkv, 33, 47, 32, torch.float16, seed=3 * hq + hkv)
    with faithful():
        kernel = int8_attention(q, k, v, block_m=16, block_n=32, causal=False, variant=variant, return_stats=True)
    emulated = int8_flash(
        _np(q),
        _np(k),
        _np(v),
        plan="int8-reference" if variant == "int8" else "half-int8",
        block_m=16,
        block_n=32,
        return_stats=True,
    )
    _assert_bitwise(kernel, emulated)
    if hkv > 1:
        assert _groups_differ(kernel[0], hq)


@pytest.mark.parametrize("hq,hkv", HEADS, ids=IDS)
@pytest.mark.parametrize("scaling", ["per-tensor", "per-block"])
def test_fp8_kernel_gqa_equals_emulator_bitwise(scaling, hq, hkv):
    q, k, v = _inputs(hq, hkv, 33, 47, 32, torch.float16, seed=5 * hq + hkv, spread=2.0)
    with faithful():
        kernel = fp8_attention(
            q, k, v, fmt="e4m3", scaling=scaling, block_m=16, block_n=32, causal=True, return_stats=True
        )
    emulated = fp8_flash(
        _np(q), _np(k), _np(v), fmt="e4m3", scaling=scaling, block_m=16, block_n=32, causal=True, return_stats=True
    )
    _assert_bitwise(kernel, emulated)
    if hkv > 1:
        assert _groups_differ(kernel[0], hq)
