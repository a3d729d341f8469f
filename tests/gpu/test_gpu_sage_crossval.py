"""Cross-validation: the SageAttention2-style Triton kernel (simfloat_gpu/kernels/sage_attention.py) under
simfloat_gpu.interpreter.faithful() equals the emulator's ``sage2-int8-fp8`` plan (simfloat.attention.quant_flash)
bit for bit: output, running max m and row sum l, with odd lengths, causal masks, seq_q != seq_k, grouped-query
heads, with and without K smoothing."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from simfloat.attention import mean_key, quant_flash, quant_plan  # noqa: E402
from simfloat_gpu.interpreter import faithful  # noqa: E402
from simfloat_gpu.kernels.sage_attention import sage_attention  # noqa: E402

pytestmark = pytest.mark.triton

_SLOW = pytest.mark.slow  # the faithful interpreter runs fp8 dots through the tensor-core model in Python
CASES = [
    # (seq_q, seq_k, head_dim, block_m, block_n, causal, kv_heads, smooth)
    (40, 40, 32, 32, 32, True, 1, True),  # odd length, causal, grouped-query heads, smoothing: the cheap one
    pytest.param((97, 97, 32, 16, 32, True, 2, True), marks=_SLOW),
    pytest.param((40, 70, 64, 32, 64, False, 1, True), marks=_SLOW),
    pytest.param((33, 33, 32, 64, 32, False, 2, False), marks=_SLOW),
]


@pytest.mark.parametrize("case", CASES)
def test_sage_kernel_equals_emulator_bitwise(case):
    sq, sk, d, bm, bn, causal, hkv, smooth = case
    g = torch.Generator().manual_seed(sq + sk)
    q = torch.randn(1, 2, sq, d, generator=g).to(torch.float16)
    k = (torch.randn(1, hkv, sk, d, generator=g) + 2.0).to(torch.float16)  # a mean key worth removing
    v = torch.randn(1, hkv, sk, d, generator=g).to(torch.float16)
    qn, kn, vn = (x.float().numpy() for x in (q, k, v))
    plan = quant_plan("sage2-int8-fp8")
    km = None
    if smooth:
        km = torch.from_numpy(mean_key(kn, plan.k_smooth).astype(np.float32))
    else:
        plan = plan.replace(k_smooth=None)
    with faithful():
        got = sage_attention(q, k, v, km=km, block_m=bm, block_n=bn, causal=causal, return_stats=True)
    want = quant_flash(qn, kn, vn, plan=plan, block_m=bm, block_n=bn, causal=causal, return_stats=True)
    for name, a, b in zip(("out", "m", "l"), got, want, strict=True):
        a = a.float().numpy().astype(np.float64)
        same = a == b
        assert same.all(), f"{name}: {same.mean():.4%} equal; first mismatch at {tuple(np.argwhere(~same)[0])}"


def test_sage_kernel_rejects_bad_km():
    q = torch.zeros(1, 1, 4, 32, dtype=torch.float16)
    with pytest.raises(ValueError, match="km must have shape"):
        sage_attention(q, q, q, km=torch.zeros(1, 1, 4, 32))
    with pytest.raises(TypeError, match="km must be a float32"):
        sage_attention(q, q, q, km=torch.zeros(1, 1, 1, 32, dtype=torch.float16))
