"""The split row sum (``l_ij``, in-tile; ``l_i``, the running update) and FlashAttention-1's tile rule.

Both engines agree bit for bit on every l_ij model (odd lengths, 1 and 2 threads, adversarial magnitudes); the
presets' l_ij is today's sequential sum in l_i's format; a one-key-tile fp64 plan with ``sum_once`` gives the
float32 sum of P rounded once. Tiny shapes (head dim 8-16)."""

from __future__ import annotations

import numba
import numpy as np
import pytest

import simfloat as sf
from simfloat.accumulate import Chunked, Sequential
from simfloat.attention import FLASH_OPS, fa1_tiles, flash, plan, sum_once
from simfloat.attention.tiling import resolve_tiles
from simfloat.attribution import ablation_plan, isolation_plan


@pytest.mark.parametrize(
    ("m", "d", "tiles"),
    [
        (49152, 64, (64, 192)),
        (98304, 64, (64, 384)),
        (100000, 64, (64, 391)),
        (49152, 128, (96, 96)),
        (98304, 128, (128, 192)),
        (100000, 128, (128, 196)),
        (1, 1, (1, 1)),
    ],
)
def test_fa1_tiles_issue_numbers(m, d, tiles):
    assert fa1_tiles(m, d) == tiles
    assert resolve_tiles(f"fa1:M={m}", d) == tiles


def test_fa1_tiles_errors():
    with pytest.raises(ValueError, match="M must be >= 1"):
        fa1_tiles(0, 64)
    with pytest.raises(TypeError, match="d must be an int"):
        fa1_tiles(49152, 64.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown tile rule"):
        resolve_tiles("fa2:M=10", 64)
    q = np.zeros((4, 8))
    with pytest.raises(ValueError, match="either tiles or block_m"):
        flash(q, q, q, plan="triton-bf16", tiles="fa1:M=256", block_n=16)


def test_flash_tiles_rule_is_the_explicit_tiles():
    rng = np.random.default_rng(3)
    q, k, v = (sf.round(rng.standard_normal((1, 97, 8)), "bf16") for _ in range(3))
    bm, bn = fa1_tiles(300, 8)  # (8, 10)
    a = flash(q, k, v, plan="all-bf16", tiles="fa1:M=300")
    assert np.array_equal(a, flash(q, k, v, plan="all-bf16", block_m=bm, block_n=bn))
    assert not np.array_equal(a, flash(q, k, v, plan="all-bf16"))  # 64 x 64: one tile, another sum


def test_presets_keep_the_sequential_sum_in_l_i():
    for name in ("fp64", "all-bf16", "triton-bf16", "h200-fp16", "pytorch-bf16"):
        pl = plan(name)
        assert pl.l_ij == Sequential(pl.l_i.fmt, pl.l_i.mode), name
    assert FLASH_OPS.index("l_ij") == FLASH_OPS.index("l_i") - 1


def test_l_ij_spec_and_errors():
    pl = plan("all-bf16")
    once = pl.replace(l_ij=sum_once("bf16"))
    assert isinstance(once.l_ij, Chunked) and sf.format(once.l_ij.inner.fmt).name == "float32"
    assert pl.replace(l_ij="fp16").l_ij == Sequential(sf.float16, sf.RoundingMode.NEAREST_EVEN)
    assert pl.replace(l_i="fp16").l_ij == pl.l_ij  # the running update no longer drags the in-tile sum along
    with pytest.raises(ValueError, match="product_fmt"):
        pl.replace(l_ij=Sequential("bf16", product_fmt="bf16"))
    with pytest.raises(ValueError, match="splits"):
        pl.replace(l_ij=Chunked(splits=2, inner=Sequential("float32"), outer_fmt="bf16"))
    with pytest.raises(ValueError, match="sequential l_ij"):
        plan("h200-bf16").replace(l_ij=sum_once("float32"))
    with pytest.raises(TypeError, match="l_ij"):
        pl.replace(l_ij=3)
    # attribution: l_ij is an op of its own
    assert isolation_plan(once, "l_ij").l_ij == once.l_ij
    assert ablation_plan(once, "l_ij").l_ij == plan("fp64").l_ij


_MODELS = {
    "seq-bf16": "bf16",
    "seq-bf16-rz": ("bf16", "toward_zero"),
    "once-bf16": sum_once("bf16"),
    "once-fp16-rz": sum_once("fp16", "toward_zero"),
    "chunk8": Chunked(8, Sequential("bf16"), outer_fmt="float32"),
}


@pytest.mark.parametrize("name", list(_MODELS))
def test_engines_agree_on_every_l_ij_model(name):
    base = plan("all-bf16").replace(l_ij=_MODELS[name])
    fa1 = base.replace(normalization="per_step", l_i="float32")
    rng = np.random.default_rng(7)
    before = numba.get_num_threads()
    try:
        for n in (1, 97, 257):
            q = sf.round(rng.standard_normal((1, n, 16)) * 3.0, "bf16")
            k = sf.round(rng.standard_normal((1, n, 16)), "bf16")
            v = sf.round(rng.standard_normal((1, n, 16)), "bf16")
            for pl in (base, fa1):
                ref = flash(q, k, v, plan=pl, block_m=16, block_n=32, engine="reference")
                for threads in (1, 2):
                    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
                    vec = flash(q, k, v, plan=pl, block_m=16, block_n=32, engine="vector")
                    assert np.array_equal(ref, vec, equal_nan=True), (name, n, pl.name, threads)
    finally:
        numba.set_num_threads(before)


def test_sum_once_is_the_float32_sum_rounded_once():
    rng = np.random.default_rng(11)
    n, d = 97, 8
    q = sf.round(rng.standard_normal((n, d)) * 4.0, "bf16")
    k = sf.round(rng.standard_normal((n, d)), "bf16")
    v = rng.standard_normal((n, d))
    scale = 1 / np.sqrt(d)
    # every op float64 but the in-tile sum; one key tile, so l = l_ij
    pl = plan("fp64").replace(l_ij=sum_once("bf16"))
    _, _, l_once = flash(q, k, v, plan=pl, block_m=n, block_n=n, scale=scale, return_stats=True)
    _, _, l_seq = flash(
        q, k, v, plan=plan("fp64").replace(l_ij="bf16"), block_m=n, block_n=n, scale=scale, return_stats=True
    )
    s = np.zeros((n, n))
    for j in range(d):  # the fp64 plan's sequential dot, products rounded
        s = s + q[:, None, j] * k[None, :, j]
    x = s * scale
    p = np.exp(x - x.max(axis=1, keepdims=True))
    acc32 = np.zeros(n, dtype=np.float32)
    for j in range(n):
        acc32 = acc32 + p[:, j].astype(np.float32)
    assert np.array_equal(l_once, sf.round(acc32.astype(np.float64), "bf16"))
    assert not np.array_equal(l_once, l_seq)  # 97 bf16 additions lose what one rounding keeps


def test_tile_rule_in_attribute_and_cli():
    import argparse

    from simfloat.attribution._core import _tiles
    from simfloat.cli import _tile

    assert _tiles(["fa1:M=300", (8, 16), (8, 10)], 8) == [(8, 10), (8, 16)]
    assert _tile("fa1:M=98304") == "fa1:M=98304" and _tile("64x32") == (64, 32)
    with pytest.raises(argparse.ArgumentTypeError, match="unknown tile rule"):
        _tile("fa1:K=3")
    with pytest.raises(ValueError, match="rule such as"):
        _tiles([(1, 2, 3)], 8)
