"""Grouped-query and multi-query attention in the emulator: k and v with fewer heads than q give the bits of k
and v repeated per query head (query head h reads kv head h // (q_heads // kv_heads)) in every entry point,
and head counts that do not divide are an error naming them. The Triton kernels' GQA mapping is checked
against the emulator in tests/gpu/test_gpu_gqa.py."""

import numpy as np
import pytest

from simfloat.attention import baseline, flash, fp8_flash, int8_flash, quant_flash
from simfloat.attention._inputs import group_kv, kv_group, kv_repeats


def _inputs(batch, hq, hkv, sq, sk, d, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((batch, hq, sq, d)).astype(np.float16).astype(np.float32)
    k = rng.standard_normal((batch, hkv, sk, d)).astype(np.float16).astype(np.float32)
    v = rng.standard_normal((batch, hkv, sk, d)).astype(np.float16).astype(np.float32)
    return q, k, v


def _repeated(x, hq):
    return np.repeat(x, hq // x.shape[1], axis=1)


def _same(a, b):
    for x, y in zip(a if isinstance(a, tuple) else (a,), b if isinstance(b, tuple) else (b,), strict=True):
        assert x.shape == y.shape
        np.testing.assert_array_equal(x, y)  # NaN-free here; bit equality of finite values


KERNELS = {
    "flash-vector": lambda q, k, v, **kw: flash(
        q, k, v, plan="triton-bf16", block_m=16, block_n=16, return_stats=True, engine="vector", **kw
    ),
    "flash-reference": lambda q, k, v, **kw: flash(
        q, k, v, plan="triton-fp16", block_m=16, block_n=32, return_stats=True, engine="reference", **kw
    ),
    "baseline": lambda q, k, v, **kw: baseline(q, k, v, plan="pytorch-bf16", **kw),
    "int8_flash": lambda q, k, v, **kw: int8_flash(q, k, v, block_m=16, block_n=32, return_stats=True, **kw),
    "fp8_flash-block": lambda q, k, v, **kw: fp8_flash(
        q, k, v, scaling="per-block", block_m=16, block_n=32, return_stats=True, **kw
    ),
    "quant_flash-half-int8": lambda q, k, v, **kw: quant_flash(q, k, v, plan="half-int8", block_m=32, block_n=16, **kw),
}


@pytest.mark.parametrize("hq,hkv", [(4, 2), (4, 1), (6, 3)], ids=["gqa-4-2", "mqa-4-1", "gqa-6-3"])
@pytest.mark.parametrize("name", list(KERNELS))
def test_grouped_kv_heads_are_kv_repeated_per_head(name, hq, hkv):
    q, k, v = _inputs(2, hq, hkv, 37, 97, 16, seed=hq * 10 + hkv)
    fn = KERNELS[name]
    causal = name.startswith("flash")
    got = fn(q, k, v, causal=causal)
    want = fn(q, _repeated(k, hq), _repeated(v, hq), causal=causal)
    _same(got, want)
    out = got[0] if isinstance(got, tuple) else got
    assert out.shape == (2, hq, 37, 16)
    # each query head really reads its own group's kv head: a different group gives other numbers
    if hkv > 1:
        assert not np.array_equal(out[:, 0], out[:, hq - 1])


@pytest.mark.parametrize("sq,sk", [(1, 1), (97, 257)])
def test_gqa_odd_lengths_flash(sq, sk):
    q, k, v = _inputs(1, 4, 2, sq, sk, 8, seed=sq)
    got = flash(q, k, v, plan="h200-bf16", block_m=64, block_n=64, return_stats=True)
    want = flash(q, _repeated(k, 4), _repeated(v, 4), plan="h200-bf16", block_m=64, block_n=64, return_stats=True)
    _same(got, want)


def test_kv_heads_only_in_k_or_only_in_v():
    q, k, v = _inputs(1, 4, 2, 9, 11, 8)
    v4 = _repeated(v, 4)
    _same(flash(q, k, v4, plan="triton-bf16"), flash(q, _repeated(k, 4), v4, plan="triton-bf16"))


@pytest.mark.parametrize("name", ["flash-vector", "baseline", "int8_flash"])
def test_head_counts_that_do_not_divide_are_rejected(name):
    q, k, v = _inputs(1, 4, 3, 8, 8, 16)
    with pytest.raises(ValueError, match="q has 4 heads and k has 3: grouped-query attention needs"):
        KERNELS[name](q, k, v)
    q, k, v = _inputs(1, 2, 4, 8, 8, 16)
    with pytest.raises(ValueError, match="q has 2 heads and k has 4"):
        KERNELS[name](q, k, v)
    q, k, _ = _inputs(1, 4, 2, 8, 8, 16)
    v3 = _inputs(1, 4, 3, 8, 8, 16)[2]
    with pytest.raises(ValueError, match="q has 4 heads and v has 3"):
        KERNELS[name](q, k, v3)


def test_kv_group_rule():
    assert kv_group(8, 2) == 4 and kv_group(8, 8) == 1 and kv_group(8, 1) == 8
    for hq, hk in ((8, 3), (2, 4), (0, 1), (4, 0)):
        with pytest.raises(ValueError, match="multiple of the number of k heads"):
            kv_group(hq, hk)
    q = np.zeros((2, 8, 3, 4))
    k = np.arange(2 * 2 * 5 * 4, dtype=np.float64).reshape(2, 2, 5, 4)
    g = group_kv(q, k, "k")
    assert g.shape == (2, 8, 5, 4)
    for h in range(8):
        np.testing.assert_array_equal(g[:, h], k[:, h // 4])
    assert group_kv(q, k[:, :1], "k").shape == (2, 1, 5, 4)  # one kv head: left to broadcasting
    assert kv_repeats(q.shape, k.shape, "k") == 4 and kv_repeats(q.shape, (2, 1, 5, 4), "k") == 1
    assert kv_repeats(q.shape, (5, 4), "k") == 1 and kv_repeats((3, 4), k.shape, "k") == 1


def test_attribute_accepts_grouped_kv_heads():
    pytest.importorskip("pandas")
    from simfloat.attribution import attribute

    q, k, v = _inputs(1, 4, 2, 24, 24, 16)
    kw = dict(block_m=16, block_n=16, ops=["qk", "pv"], tiles=(), block_ns=(), trace=False, workers=1)
    got = attribute(q, k, v, "triton-bf16", **kw)
    want = attribute(q, _repeated(k, 4), _repeated(v, 4), "triton-bf16", **kw)
    for name in ("isolation", "ablation", "flash_vs_baseline"):
        a, b = getattr(got, name), getattr(want, name)
        assert a.equals(b), name
    with pytest.raises(ValueError, match="q has 4 heads and k has 3"):
        attribute(q, _inputs(1, 4, 3, 24, 24, 16)[1], _inputs(1, 4, 3, 24, 24, 16)[2], "triton-bf16", **kw)
