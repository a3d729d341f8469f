"""Cross-validation: the Triton INT8 / FP8 attention kernels (simfloat_gpu/kernels/int8_attention.py,
simfloat_gpu/kernels/fp8_attention.py) run
under simfloat_gpu.interpreter.faithful() equal the emulator (simfloat.attention.int8_flash / fp8_flash) BIT FOR BIT.

Under faithful() the integer dots are exact, every cast, division and fma is correctly rounded, tl.sum is
sequential and fp8/fp16 dots use the sm90 tensor-core models: exactly the emulator's plans. So every output
element, every running max m and every row sum l must agree, with odd lengths (masking), causal masks,
seq_q != seq_k, both row sums, the half-INT8 variant, several tile sizes, fp16/bf16/fp32 inputs, and FP8 in
both formats and both scalings.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from simfloat.attention import Quant, fp8_flash, int8_flash, quantize  # noqa: E402
from simfloat_gpu.interpreter import faithful  # noqa: E402
from simfloat_gpu.kernels.fp8_attention import fp8_attention, quantize_fp8  # noqa: E402
from simfloat_gpu.kernels.int8_attention import int8_attention, quantize_per_tensor, quantize_per_token  # noqa: E402

pytestmark = pytest.mark.triton


def _inputs(sq, sk, d, dtype, seed, spread=1.0):
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(1, 2, sq, d, generator=g) * spread).to(dtype)
    k = torch.randn(1, 2, sk, d, generator=g).to(dtype)
    v = torch.randn(1, 2, sk, d, generator=g).to(dtype)
    return q, k, v


def _np(x):
    return x.float().numpy()


def _assert_bitwise(kernel, emulated):
    """Every element equal (100% required); on failure report the fraction and the first mismatch."""
    for name, a, b in zip(("out", "m", "l"), kernel, emulated, strict=True):
        a = a.float().numpy().astype(np.float64)
        assert a.shape == b.shape, name
        same = (a == b) | (np.isnan(a) & np.isnan(b))
        if not same.all():
            idx = np.argwhere(~same)[0]
            pytest.fail(
                f"{name}: {same.mean():.4%} bitwise equal; first mismatch at {tuple(idx)}: kernel "
                f"{a[tuple(idx)]!r}, emulator {b[tuple(idx)]!r}"
            )


INT8_CASES = [
    # (seq_q, seq_k, head_dim, block_m, block_n, causal, variant, row_sum, dtype)
    (97, 97, 64, 64, 64, False, "int8", "reference", torch.float16),
    (97, 97, 64, 16, 32, True, "int8", "reference", torch.float16),
    (257, 257, 32, 32, 32, True, "int8", "consistent", torch.float16),
    (97, 257, 64, 16, 64, False, "int8", "consistent", torch.bfloat16),
    (257, 97, 64, 64, 32, True, "int8", "reference", torch.float32),
    (97, 97, 64, 32, 64, True, "half-int8", "reference", torch.float16),
    (97, 257, 32, 16, 32, False, "half-int8", "consistent", torch.float16),
]


@pytest.mark.parametrize("case", INT8_CASES, ids=lambda c: "-".join(str(x).replace("torch.", "") for x in c))
def test_int8_kernel_equals_emulator_bitwise(case):
    sq, sk, d, bm, bn, causal, variant, row_sum, dtype = case
    q, k, v = _inputs(sq, sk, d, dtype, seed=sq + sk + d + bm + bn)
    with faithful():
        kernel = int8_attention(
            q, k, v, block_m=bm, block_n=bn, causal=causal, variant=variant, row_sum=row_sum, return_stats=True
        )
    plan = {
        ("int8", "reference"): "int8-reference",
        ("int8", "consistent"): "int8-consistent",
        ("half-int8", "reference"): "half-int8",
        ("half-int8", "consistent"): "half-int8-consistent",
    }
    emulated = int8_flash(
        _np(q), _np(k), _np(v), plan=plan[variant, row_sum], block_m=bm, block_n=bn, causal=causal, return_stats=True
    )
    _assert_bitwise(kernel, emulated)


def test_int8_kernel_equals_emulator_with_outliers_and_scale():
    """Wide dynamic range (per-token scales over 2**-6..2**6, a few large outliers) and a custom scale."""
    g = torch.Generator().manual_seed(5)
    q = torch.randn(1, 1, 97, 64, generator=g) * torch.exp2(torch.randint(-6, 7, (1, 1, 97, 1), generator=g))
    k = torch.randn(1, 1, 97, 64, generator=g)
    k[0, 0, 3, 7] = 60.0
    v = torch.randn(1, 1, 97, 64, generator=g)
    v[0, 0, 11, 2] = -40.0
    q, k, v = q.half(), k.half(), v.half()
    with faithful():
        kernel = int8_attention(q, k, v, block_m=32, block_n=32, sm_scale=0.3, return_stats=True)
    emulated = int8_flash(_np(q), _np(k), _np(v), block_m=32, block_n=32, scale=0.3, return_stats=True)
    _assert_bitwise(kernel, emulated)


FP8_CASES = [
    # (seq_q, seq_k, head_dim, block_m, block_n, causal, fmt, scaling)
    (97, 97, 64, 64, 64, False, "e4m3", "per-tensor"),
    (97, 257, 64, 16, 32, True, "e4m3", "per-block"),
    (97, 97, 32, 32, 32, True, "e5m2", "per-tensor"),
    (257, 97, 64, 64, 32, False, "e5m2", "per-block"),
]


@pytest.mark.parametrize("case", FP8_CASES, ids=lambda c: "-".join(map(str, c)))
def test_fp8_kernel_equals_emulator_bitwise(case):
    sq, sk, d, bm, bn, causal, fmt, scaling = case
    q, k, v = _inputs(sq, sk, d, torch.float16, seed=sq * 3 + sk + d + bm + bn, spread=2.0)
    with faithful():
        kernel = fp8_attention(
            q, k, v, fmt=fmt, scaling=scaling, block_m=bm, block_n=bn, causal=causal, return_stats=True
        )
    emulated = fp8_flash(
        _np(q), _np(k), _np(v), fmt=fmt, scaling=scaling, block_m=bm, block_n=bn, causal=causal, return_stats=True
    )
    _assert_bitwise(kernel, emulated)


def test_quantizers_equal_the_kernels_bitwise():
    """Q1..Q6 / F1..F4: the Triton quantization kernels (faithful) and simfloat.attention.quantize."""
    g = torch.Generator().manual_seed(11)
    x = (torch.randn(1, 2, 97, 64, generator=g) * torch.exp2(torch.randint(-8, 8, (1, 2, 97, 1), generator=g))).half()
    x[0, 0, 5] = 0.0  # an all-zero token: scale 1.0
    xn = _np(x)
    with faithful():
        q8, qs = quantize_per_token(x)
        v8, vs = quantize_per_tensor(x)
        f8, fs = quantize_fp8(x, fmt="e4m3", group=32)
    codes, scale = quantize(xn, Quant("int", "per-token", pre="float32"))
    assert np.array_equal(q8.numpy().astype(np.float64), codes)
    assert np.array_equal(qs.numpy().astype(np.float64), scale[..., 0])
    codes, scale = quantize(xn, Quant("int", "per-tensor", pre="float32"))
    assert np.array_equal(v8.numpy().astype(np.float64), codes)
    assert np.array_equal(vs.numpy().astype(np.float64), scale[..., 0, 0])
    codes, scale = quantize(xn, Quant("float", "per-block", fmt="float8_e4m3fn", pre="float32"), group=32)
    assert np.array_equal(f8.float().numpy().astype(np.float64), codes)
    assert np.array_equal(fs.numpy().astype(np.float64), scale[..., ::32, 0])
