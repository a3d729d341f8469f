"""baseline_backward under pytorch-<fmt> against torch's CPU eager autograd of softmax(q k^T * scale) v when the
scale is not a power of two (head dim 96, 80): torch multiplies a bf16 tensor by a Python float in float32
(the scale rounded to float32, the product to float32, then to bf16), which the plans' ``opmath`` models."""

from __future__ import annotations

import math

import numpy as np
import pytest

import simfloat as sf
from simfloat.attention import backward_plan, baseline_backward

torch = pytest.importorskip("torch")


def _torch_grads(q, k, v, do, scale):
    tq, tk, tv = (torch.from_numpy(x).to(torch.bfloat16).requires_grad_() for x in (q, k, v))
    o = torch.softmax((tq @ tk.transpose(-1, -2)) * scale, dim=-1) @ tv
    o.backward(torch.from_numpy(do).to(torch.bfloat16))
    return tuple(x.grad.double().numpy() for x in (tq, tk, tv))


@pytest.mark.parametrize("fmt", ["bf16", "fp16"])
def test_tensor_times_python_float_is_the_opmath_model(fmt):
    """The op itself, bit for bit: torch's ``x * scale`` is fmt(float32(x * float32(scale)))."""
    g = np.random.default_rng(1)
    x = sf.round(g.standard_normal(20000) * 4, fmt)
    dt = torch.bfloat16 if fmt == "bf16" else torch.float16
    for d in (96, 80, 48):
        sc = 1 / math.sqrt(d)
        got = (torch.from_numpy(x).to(dt) * sc).double().numpy()
        model = sf.round(sf.ops.mul(x, float(sf.round(sc, "float32")), "float32"), fmt)
        once = sf.round(sf.ops.mul(x, float(sf.round(sc, fmt)), fmt), fmt)  # the scale rounded into fmt
        np.testing.assert_array_equal(got, model)
        assert not np.array_equal(got, once)


@pytest.mark.parametrize("d", [96, 80])
def test_pytorch_bf16_backward_matches_torch_eager_with_a_non_power_of_two_scale(d):
    g = np.random.default_rng(0)
    q, k, v, do = (sf.round(g.standard_normal((2, 33, d)) * (2.0 if i == 0 else 1.0), "bf16") for i in range(4))
    sc = 1 / math.sqrt(d)
    want = _torch_grads(q, k, v, do, sc)
    got = baseline_backward(q, k, v, do, plan="pytorch-bf16")
    old = baseline_backward(q, k, v, do, plan=backward_plan("pytorch-bf16").replace(opmath=None))
    for name, a, b, w in zip(("dq", "dk", "dv"), got, old, want, strict=True):
        # as the forward's test: the same dataflow, so nearly all gradients agree to the bit (torch's blocked
        # matmuls and vectorized exp differ from the modelled ones in a few roundings)
        assert np.mean(a == w) >= 0.97, name
        assert np.abs(a - w).max() <= 0.01 * np.abs(w).max(), name
        assert np.mean(a == w) > np.mean(b == w), name  # the scale rounded into bf16 (before): fewer
