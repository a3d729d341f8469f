"""The FlashAttention-3 / -4 forward presets: both engines bit for bit, FA4's exp2 mix by key position (against a
float32 numpy replica of the row sum), the fp8 max offset and its saturation, the tuning table's resolution."""

from __future__ import annotations

import numpy as np
import pytest

import simfloat as sf
from simfloat.attention import flash, plan
from simfloat.attention.fa4 import ex2_poly_mask, ex2_schedule
from simfloat.hardware import ex2_approx, ex2_poly

FMT = {"bf16": "bf16", "fp16": "fp16", "e4m3": "e4m3"}


def _inputs(shape: tuple[int, ...], fmt: str, seed: int, sd: float = 1.0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [np.asarray(sf.round(rng.standard_normal(shape) * sd, fmt)) for _ in range(3)]


@pytest.mark.parametrize("name", ["fa3-bf16", "fa3-fp16", "fa3-e4m3", "fa4-bf16", "fa4-fp16", "fa4-e4m3"])
def test_engines_agree(name: str) -> None:
    fmt = name.split("-")[1]
    q, k, v = _inputs((1, 2, 97, 32), fmt, 1, 3.0 if fmt == "e4m3" else 1.0)
    k2, v2 = (np.concatenate([a, a[:, :, :60] * 1.5], axis=2) for a in (k, v))  # 157 keys: two key tiles
    k2, v2 = (np.asarray(sf.round(a, fmt)) for a in (k2, v2))
    for causal in (False, True):
        bn = {} if name.startswith("fa4") else {"block_n": 64}
        a = flash(q, k2, v2, plan=name, causal=causal, engine="vector", return_stats=True, **bn)
        b = flash(q, k2, v2, plan=name, causal=causal, engine="reference", return_stats=True, **bn)
        for x, y in zip(a, b, strict=True):
            assert np.array_equal(x, y, equal_nan=True)
        ref = flash(q, k2, v2, plan="fp64", causal=causal)
        assert np.abs(a[0] - ref).max() < (0.25 if fmt == "e4m3" else 0.02)


def test_schedule_table() -> None:
    assert ex2_schedule(128, 128, False, 1024, False) == (10, 4, 1)  # 2-CTA, non-causal
    assert ex2_schedule(128, 128, True, 1024, False) == (16, 4, 1)
    assert ex2_schedule(128, 128, True, 1024, True) == (8, 4, 1)  # fp8 causal override
    assert ex2_schedule(64, 64, False, 1024, False) == (16, 4, 1)  # no table entry: the defaults
    assert ex2_schedule(192, 128, True, 1024, False) == (32, 4, 1)
    assert ex2_schedule(192, 192, False, 1024, False)[0] == 0  # hd 192 without 2-CTA (dv 192): hardware only
    m = ex2_poly_mask((10, 4, 1), 128, 128)
    # fragments 1 and 2 (positions 32..95), pairs at k = 6, 8, 16, 18, 26, 28
    want = [j * 32 + k + e for j in (1, 2) for k in (6, 8, 16, 18, 26, 28) for e in (0, 1)]
    assert sorted(np.flatnonzero(m).tolist()) == want
    with pytest.raises(ValueError, match="block_n=128"):
        ex2_poly_mask((10, 4, 1), 64, 64)
    assert ex2_poly_mask((0, 4, 1), 64, 64).size == 0


def test_mix_by_position_against_numpy_row_sum() -> None:
    """One key tile of 128 keys whose scores are exact in float32 (small integers): l from the emulator equals the
    float32 sequential sum of P with the polynomial exp2 exactly at the mask's positions, the H200 model elsewhere."""
    rng = np.random.default_rng(5)
    d = 16
    q = rng.integers(-2, 3, (1, 1, 4, d)).astype(np.float64)
    k = rng.integers(-2, 3, (1, 1, 128, d)).astype(np.float64)
    v = rng.standard_normal((1, 1, 128, d))
    v = np.asarray(sf.round(v, "bf16"))
    pl = plan("fa4-bf16").replace(exp2_emu=(10, 4, 1))
    scale = 0.3
    _, _, l_emu = flash(q, k, v, plan=pl, scale=scale, return_stats=True)
    mask = ex2_poly_mask((10, 4, 1), 128, 128).astype(bool)
    sc = np.float32(np.float32(scale) * np.float32(np.log2(np.e)))
    s = (q[0, 0] @ k[0, 0].T).astype(np.float32)  # exact
    for i in range(4):
        m = np.float32(s[i].max() * np.float64(sc))
        x = (s[i].astype(np.float64) * np.float64(sc) - np.float64(m)).astype(np.float32)  # one rounding (FMA)
        p = np.where(mask, ex2_poly(x), ex2_approx(x, ftz=True)).astype(np.float32)
        acc = np.float32(0.0)
        for pj in p:
            acc = np.float32(acc + pj)
        assert l_emu[0, 0, i] == acc
        assert not np.array_equal(ex2_poly(x)[mask], ex2_approx(x, ftz=True)[mask])  # the mix matters here


def test_fp8_offset_scales_l_and_saturation_shrinks_output() -> None:
    """fa4-e4m3: l carries 2**8 (P scaled before the cast); with lazy rescaling (threshold 4, #2577) a later key
    tile whose max grew by 3 gives P = 2**11 > 448: the e4m3 cast saturates while l counts 2**11, so with V = 1
    the output falls below 1; the preset (always rescaling) keeps it at 1."""
    d = 16
    q = np.zeros((1, 1, 1, d))
    q[..., 0] = 1.0
    k = np.zeros((1, 1, 256, d))
    k[..., 0] = -20.0  # P ~ 2**-12 before the offset
    # the preset walks the key tiles last first (kv_order="reverse"): keys 128..255, then 0..127
    k[0, 0, 200, 0] = 0.0  # the first walked tile's max
    k[0, 0, 0, 0] = 3.0  # the second walked tile: score 3 (log2 units with the scale below)
    v = np.ones((1, 1, 256, d))
    scale = float(np.log(2.0))  # qk_scale = scale * log2(e) ~ 1
    base = plan("fa4-e4m3")
    out, _, l_off = flash(q, k, v, plan=base, scale=scale, return_stats=True)
    assert np.abs(out - 1.0).max() < 1e-2
    _, _, l0 = flash(q, k, v, plan=base.replace(p_offset=0), scale=scale, return_stats=True)
    assert 250 < l_off[0, 0, 0] / l0[0, 0, 0] < 262
    lazy = base.replace(lazy_threshold=4.0)
    out4 = flash(q, k, v, plan=lazy, scale=scale)
    assert out4.max() < 0.5  # (256 + 448) / (256 + 2048)
    assert np.array_equal(out4, flash(q, k, v, plan=lazy, scale=scale, engine="reference"))


@pytest.mark.parametrize("engine", ["vector", "reference"])
def test_lazy_threshold_needs_a_second_key_tile(engine: str) -> None:
    """#2577's decode (6 q heads on 1 kv head, d 128, page 128 = FA4's key tile): at 128 keys the kernel walks
    one tile, its first (the max is set, nothing kept), so threshold 4 gives the preset's bits; at 129 the
    1-key tile is walked first and the full tile's larger max is kept out: the output moves (P saturates)."""
    from simfloat.attention import flash_decode

    q, k, v = _inputs((1, 1, 6, 128), "e4m3", 5)
    k, v = (np.asarray(sf.round(np.random.default_rng(s).standard_normal((1, 129, 1, 128)), "e4m3")) for s in (6, 7))
    lazy = plan("fa4-e4m3").replace(lazy_threshold=4.0)
    pool = [np.pad(a[0], ((0, 127), (0, 0), (0, 0))).reshape(2, 128, 1, 128) for a in (k, v)]
    table = np.array([[0, 1]])

    def run(pl: object, n: int) -> np.ndarray:
        out = flash_decode(q, *pool, [n], block_table=table, plan=pl, engine=engine)  # type: ignore[arg-type]
        assert isinstance(out, np.ndarray)
        return out

    assert np.array_equal(run(lazy, 128), run("fa4-e4m3", 128))
    assert not np.array_equal(run(lazy, 129), run("fa4-e4m3", 129))


def test_checks() -> None:
    with pytest.raises(ValueError, match="exp2=True"):
        plan("triton-bf16").replace(exp2=False, p_offset=8)
    with pytest.raises(ValueError, match="exp2_emu"):
        plan("triton-bf16").replace(exp2_emu=(4, 5, 0))
    with pytest.raises(TypeError, match="p_offset"):
        plan("triton-bf16").replace(p_offset=8.0)


@pytest.mark.parametrize("name", ["fa4-bf16", "fa4-e4m3", "fa3-e4m3"])
def test_traced_equals_untraced_and_drift_in_units(name: str) -> None:
    """Tracing changes no bit; the exp op's local error is recorded; the l drift is relative to the shadow's l
    (the offset's 2**8 taken out: small, not ~255)."""
    pd = pytest.importorskip("pandas")
    from simfloat.trace import Tracer

    fmt = name.split("-")[1]
    q, k, v = _inputs((1, 1, 40, 16), fmt, 3)
    k2, v2 = _inputs((1, 1, 150, 16), fmt, 4)[:2]
    tr = Tracer()
    a = flash(q, k2, v2, plan=name, return_stats=True)
    b = flash(q, k2, v2, plan=name, return_stats=True, trace=tr)
    for x, y in zip(a, b, strict=True):
        assert np.array_equal(x, y)
    assert tr.by_op().loc["flash"].loc["exp", "max_abs"] > 0
    drift = tr.state_by_block("rel_max")
    assert isinstance(drift, pd.DataFrame)
    assert drift["l_i"].max() < 0.1


def test_alpha_from_unscaled_maxima_against_numpy() -> None:
    """alpha_raw: two key tiles, scores exact in float32 (small integers); l equals the float32 replica
    ``fma(l_1, exp2(rn(rn(r_1 - r_2) * qk_scale)), l_ij)`` with the H200's exp2; the scaled form differs here."""
    rng = np.random.default_rng(11)
    d = 16
    q = rng.integers(-2, 3, (1, 1, 6, d)).astype(np.float64)
    k = rng.integers(-2, 3, (1, 1, 256, d)).astype(np.float64)
    k[0, 0, :128] += 1.0  # the second walked tile's maxima grow (the presets walk the key tiles last first)
    v = np.asarray(sf.round(rng.standard_normal((1, 1, 256, d)), "bf16"))
    pl = plan("fa3-bf16")
    assert pl.alpha_raw
    scale = 0.37
    _, _, l_emu = flash(q, k, v, plan=pl, scale=scale, block_n=128, return_stats=True)
    _, _, l_scaled = flash(q, k, v, plan=pl.replace(alpha_raw=False), scale=scale, block_n=128, return_stats=True)
    sc = np.float32(np.float32(scale) * np.float32(np.log2(np.e)))
    s = (q[0, 0] @ k[0, 0].T).astype(np.float32)
    f32 = np.float32

    def tile_sum(x: np.ndarray) -> np.float32:
        acc = f32(0.0)
        for pj in ex2_approx(x, ftz=True):
            acc = f32(acc + pj)
        return acc

    differs = 0
    for i in range(6):
        first, second = s[i, 128:], s[i, :128]  # kv_order="reverse"
        r1, r2 = first.max(), max(first.max(), second.max())
        m1, m2 = f32(r1 * np.float64(sc)), f32(r2 * np.float64(sc))
        x1 = (first.astype(np.float64) * np.float64(sc) - np.float64(m1)).astype(f32)
        x2 = (second.astype(np.float64) * np.float64(sc) - np.float64(m2)).astype(f32)
        l1 = tile_sum(x1)
        d_raw = f32(np.float64(f32(r1 - r2)) * np.float64(sc))
        alpha = ex2_approx(np.array([d_raw], dtype=f32), ftz=True)[0]
        l2 = f32(np.float64(l1) * np.float64(alpha) + np.float64(tile_sum(x2)))  # fma: exact product, one rounding
        assert l_emu[0, 0, i] == l2
        differs += int(l_scaled[0, 0, i] != l2)
    assert differs > 0
