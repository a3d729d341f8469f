"""Masks on the plans with quantizers (INT8, FP8, SageAttention2/3): attn_mask (bool / additive, SDPA's
meaning), key padding, sliding window and bottom-right alignment, both engines bit for bit (out, m, l) at odd
lengths, the bits they must reproduce (an all-True mask, a dense causal mask, padding as a dense mask), the
float64 quantizers against a float64 numpy masked softmax, the empty-row rules, and a traced masked call whose
float64 shadow respects the mask."""

from __future__ import annotations

import numpy as np
import pytest

import simfloat as sf
from simfloat.attention import flash, fp8_flash, int8_flash, quant_flash
from tests.attention_reference import masked_attention, window_keep

LEAD = (1, 2)
D = 16
TILES = {"block_m": 16, "block_n": 32}
#: one preset per dataflow: scores dequantized + separate P.V (int8), consistent row sum, into_acc (half-int8,
#: fp8 per tensor, folded scales), scaled (fp8 per block), Q smoothing on the scores (sage2), block-scaled FP4
#: MMAs with a two-level P (sage3) and the released kernel's fixed P shift with delta_s in the MMA
PRESETS = [
    "int8-reference",
    "int8-consistent",
    "half-int8",
    "fp8-e4m3",
    "fp8-e4m3-block",
    "sage2-int8-fp8-qsmooth",
    "sage3-fp4",
    "sage3-fp4-released",
]


def _bits(x):
    return np.ascontiguousarray(x, dtype=np.float64).view(np.uint64)


def _same(a, b):
    """Bitwise equality (NaNs equal to NaNs)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    na, nb = np.isnan(a), np.isnan(b)
    if a.shape != b.shape or not np.array_equal(na, nb):
        return False
    return np.array_equal(_bits(np.where(na, 0, a)), _bits(np.where(nb, 0, b)))


def _qkv(sq, sk, seed=0):
    g = np.random.default_rng(seed)
    return tuple(sf.round(g.standard_normal(LEAD + (s, D)), "fp16") for s in (sq, sk, sk))


def _keep(sq, sk, seed=1):
    g = np.random.default_rng(seed)
    keep = g.random(LEAD + (sq, sk)) < 0.7
    keep[..., 3] |= ~keep.any(-1)  # every row keeps a key
    return keep


def _bias(sq, sk, seed=2):
    g = np.random.default_rng(seed)
    b = sf.round(g.standard_normal((sq, sk)) * 2.0, "bf16")
    b[g.random((sq, sk)) < 0.2] = -np.inf
    b[:, 1] = 0.5  # every row keeps a key
    return b


def _masks(sq, sk):
    """(name, mask keywords) of every mask kind, each on its own and one combined."""
    return [
        ("bool", {"attn_mask": _keep(sq, sk)}),
        ("additive", {"attn_mask": _bias(sq, sk)}),
        ("window", {"window": (20, 5)}),
        ("window-causal-br", {"window": (30, 0), "causal": True, "causal_align": "bottom-right"}),
        ("key_lengths", {"key_lengths": np.array([[sk, 40]])}),
        ("combined", {"attn_mask": _bias(sq, sk), "key_lengths": np.array([[sk - 3, 61]]), "window": (-1, 9)}),
    ]


def _both(q, k, v, **kw):
    """quant_flash on both engines: the same out, m and l, bit for bit; the reference's triple."""
    a = quant_flash(q, k, v, engine="vector", return_stats=True, **kw)
    r = quant_flash(q, k, v, engine="reference", return_stats=True, **kw)
    for x, y, what in zip(a, r, ("out", "m", "l"), strict=True):
        assert _same(x, y), (what, kw.get("plan"), float(np.nanmax(np.abs(x - y))))
    return r


@pytest.mark.parametrize("plan", PRESETS)
@pytest.mark.parametrize("sq, sk", [(97, 97), (70, 97)])
def test_masked_quantized_vector_equals_reference(plan, sq, sk):
    q, k, v = _qkv(sq, sk)
    for name, kw in _masks(sq, sk):
        out = _both(q, k, v, plan=plan, **TILES, **kw)[0]
        assert np.isfinite(out).all(), name


@pytest.mark.parametrize("plan", ["int8-reference", "fp8-e4m3", "fp8-e4m3-block", "sage3-fp4"])
def test_masks_reproduce_the_unmasked_and_causal_bits(plan):
    """An all-True mask is today's call; a dense causal mask walks tiles the causal flag skips (exact no-ops); a
    (-1, 0) window is the causal flag; key padding is the dense mask of the same keys."""
    sq, sk = 70, 97
    q, k, v = _qkv(sq, sk, seed=3)
    for causal in (False, True):
        ref = quant_flash(q, k, v, plan=plan, causal=causal, return_stats=True, **TILES)
        ones = _both(q, k, v, plan=plan, causal=causal, attn_mask=np.ones((sq, sk), dtype=bool), **TILES)
        assert all(np.array_equal(a, b) for a, b in zip(ones, ref, strict=True))
    ref = quant_flash(q, k, v, plan=plan, causal=True, **TILES)
    tril = np.tril(np.ones((sq, sk), dtype=bool))
    assert np.array_equal(_both(q, k, v, plan=plan, attn_mask=tril, **TILES)[0], ref)
    assert np.array_equal(_both(q, k, v, plan=plan, window=(-1, 0), **TILES)[0], ref)
    lens = np.array([[97, 40]])
    padded = _both(q, k, v, plan=plan, key_lengths=lens, **TILES)[0]
    dense = np.zeros(LEAD + (sq, sk), dtype=bool)
    dense[0, 0, :, :97] = True
    dense[0, 1, :, :40] = True
    assert np.array_equal(padded, _both(q, k, v, plan=plan, attn_mask=dense, **TILES)[0])
    assert not np.array_equal(padded, quant_flash(q, k, v, plan=plan, **TILES))  # the mask changed something


@pytest.mark.parametrize("sq, sk", [(97, 97), (70, 97)])
def test_float64_quantizers_are_sdpa_masked_softmax(sq, sk):
    """The quantizers and ops in float64 (``quant-fp64``): SDPA's masked softmax to float64 precision."""
    q, k, v = _qkv(sq, sk, seed=4)
    keep_w = window_keep(sq, sk, 20, 5)
    lens = np.zeros(LEAD + (sq, sk), dtype=bool)
    lens[0, 0, :, :sk], lens[0, 1, :, :40] = True, True
    bias = _bias(sq, sk)
    cases = [
        ({"attn_mask": _keep(sq, sk)}, {"keep": _keep(sq, sk)}),
        ({"attn_mask": bias}, {"bias": bias}),
        ({"window": (20, 5)}, {"keep": keep_w}),
        ({"key_lengths": np.array([[sk, 40]])}, {"keep": lens}),
    ]
    for kw, ex_kw in cases:
        got = _both(q, k, v, plan="quant-fp64", **TILES, **kw)[0]
        np.testing.assert_allclose(got, masked_attention(q, k, v, **ex_kw), rtol=0, atol=1e-12, err_msg=str(kw))


def test_flash_and_the_presets_take_masks():
    """flash() routes a masked call with a quantized plan (it refused before), in either layout; int8_flash and
    fp8_flash pass the mask on."""
    sq, sk = 70, 97
    q, k, v = _qkv(sq, sk, seed=5)
    keep = _keep(sq, sk)
    ref = quant_flash(q, k, v, plan="int8-reference", attn_mask=keep, block_m=64, block_n=64)
    assert np.array_equal(flash(q, k, v, plan="int8-reference", attn_mask=keep), ref)
    t = np.swapaxes
    got = flash(t(q, -2, -3), t(k, -2, -3), t(v, -2, -3), plan="int8-reference", attn_mask=keep, layout="bshd")
    assert np.array_equal(t(got, -2, -3), ref)
    assert np.array_equal(int8_flash(q, k, v, attn_mask=keep), ref)
    ref8 = quant_flash(q, k, v, plan="fp8-e4m3", window=(8, 8), block_m=64, block_n=64)
    assert np.array_equal(fp8_flash(q, k, v, window=(8, 8)), ref8)
    assert not np.array_equal(ref8, fp8_flash(q, k, v))


def test_quantized_empty_rows():
    """Bottom-right causal with seq_q > seq_k: the first seq_q - seq_k rows see no key (out 0, m -inf, l 0;
    'nan': NaN, as SDPA's math; 'raise')."""
    sq, sk = 40, 25
    q, k, v = _qkv(sq, sk, seed=6)
    for plan in ("int8-reference", "fp8-e4m3-block", "sage3-fp4"):
        kw = {"causal": True, "causal_align": "bottom-right", **TILES}
        out, m, l = _both(q, k, v, plan=plan, **kw)  # noqa: E741
        assert np.all(out[..., : sq - sk, :] == 0) and np.all(m[..., : sq - sk] == -np.inf)
        assert np.all(l[..., : sq - sk] == 0) and np.isfinite(out).all()
        nan = _both(q, k, v, plan=plan, empty_rows="nan", **kw)[0]
        assert np.isnan(nan[..., : sq - sk, :]).all() and np.array_equal(nan[..., sq - sk :, :], out[..., sq - sk :, :])
        with pytest.raises(ValueError, match="see no key"):
            quant_flash(q, k, v, plan=plan, empty_rows="raise", **kw)


def test_masked_quantized_trace_shadow_follows_the_mask():
    """A traced masked call: with float64 quantizers the emulated state is the float64 shadow's (drift at
    rounding level), which holds only if the shadow drops the masked keys and adds the bias as the loop does."""
    sq, sk = 33, 57
    q, k, v = _qkv(sq, sk, seed=7)
    for kw in ({"attn_mask": _keep(sq, sk)}, {"attn_mask": _bias(sq, sk)}, {"window": (5, 3)}):
        tr = sf.Tracer()
        quant_flash(q, k, v, plan="quant-fp64", trace=tr, **TILES, **kw)
        run = tr.runs[0]
        assert np.isfinite(run["local"]).all() and np.isfinite(run["state"]).all()
        drift = run["state"][..., 0].max()
        assert drift < 1e-9, (kw.keys(), drift)
        tq = sf.Tracer()
        quant_flash(q, k, v, plan="int8-reference", trace=tq, **TILES, **kw)
        assert np.isfinite(tq.runs[0]["state"]).all()
