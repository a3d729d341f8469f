"""attribute() with masks (issue 30 item 4): every run takes the call's mask; the tables are the masked
kernels' deviations from the masked float64 golden output."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("pandas")

import simfloat as sf  # noqa: E402
from simfloat.attention import baseline, flash  # noqa: E402
from simfloat.attribution import attribute, deviation  # noqa: E402


def _qkv(sq=40, sk=57):
    g = np.random.default_rng(11)
    return tuple(sf.round(g.standard_normal((1, 2, n, 16)), "bf16") for n in (sq, sk, sk))


@pytest.mark.parametrize("kind", ["bool", "window"])
def test_masked_attribution_is_the_masked_kernels_deviation(kind):
    q, k, v = _qkv()
    if kind == "bool":
        keep = np.random.default_rng(2).random((40, 57)) < 0.6
        keep[:, 0] = True
        kw = {"attn_mask": keep}
    else:
        kw = {"window": (9, 2), "key_lengths": np.array([50])}
    r = attribute(q, k, v, "triton-bf16", block_m=16, block_n=16, ops=["p"], tiles=(), block_ns=(), trace_rows=8, **kw)
    golden = baseline(q, k, v, plan="fp64", **kw)
    out = flash(q, k, v, plan="triton-bf16", block_m=16, block_n=16, **kw)
    assert r.flash_vs_baseline["max_abs"][0] == deviation(out, golden)["max_abs"]
    plain = attribute(q, k, v, "triton-bf16", block_m=16, block_n=16, ops=["p"], tiles=(), block_ns=(), trace=False)
    assert plain.flash_vs_baseline["max_abs"][0] != r.flash_vs_baseline["max_abs"][0]
    rows = attribute(q, k, v, "triton-bf16", block_m=16, block_n=16, ops=["p"], tiles=(), block_ns=(), rows=5, **kw)
    sel = rows.meta["row_indices"]
    assert rows.flash_vs_baseline["max_abs"][0] == deviation(out[..., sel, :], golden[..., sel, :])["max_abs"]
    with pytest.raises(ValueError, match="bounds"):
        attribute(q, k, v, "triton-bf16", ops=["p"], tiles=(), block_ns=(), trace=False, bounds=True, **kw)
