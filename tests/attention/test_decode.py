"""Decode over a paged KV cache and split-KV (flash_decode, combine_splits): paging never changes the bits (the
key tiles are logical positions, for any page size); one split is flash() on the cached keys; the combine is
checked op for op against an independent scalar oracle (exact Fractions, mpmath exp2/log2, the kernel's lane
order written as xor shuffles); splits against a float64 oracle; flash-attn's split rule and heuristic; errors."""

import math
from fractions import Fraction

import mpmath
import numpy as np
import pytest

import simfloat as sf
from simfloat.attention import combine_splits, flash, flash_decode, kv_splits, num_splits_heuristic
from simfloat.formats import format as sformat
from simfloat.hardware import ex2_approx_f32, ex2_table
from tests.oracle import round_ref

D = 16


def _cache(batch, hq, hkv, lens, page, seqlen_q=1, seed=0, dv=D):
    """q, a paged pool with shuffled pages, its block table, and the same keys contiguous."""
    g = np.random.default_rng(seed)
    max_pages = max(-(-n // page) for n in lens)
    num_pages = batch * max_pages + 3
    kc = sf.round(g.standard_normal((num_pages, page, hkv, D)), "bf16")
    vc = sf.round(g.standard_normal((num_pages, page, hkv, dv)), "bf16")
    table = g.permutation(num_pages)[: batch * max_pages].reshape(batch, max_pages).astype(np.int32)
    cap = max_pages * page
    kcont = np.stack([kc[table[b]].reshape(cap, hkv, D) for b in range(batch)])
    vcont = np.stack([vc[table[b]].reshape(cap, hkv, dv) for b in range(batch)])
    q = sf.round(g.standard_normal((batch, seqlen_q, hq, D)), "bf16")
    return q, kc, vc, table, kcont, vcont


def _oracle(q, k, v):
    """float64 attention of (seq_q, hq, d) over (n, hkv, d), GQA by repetition."""
    g = q.shape[1] // k.shape[1]
    kk, vv = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    s = np.einsum("qhd,khd->hqk", q, kk) / math.sqrt(q.shape[-1])
    p = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("hqk,khd->qhd", p / p.sum(-1, keepdims=True), vv)


@pytest.mark.parametrize("page", [1, 16, 48, 64, 128])
def test_paging_never_changes_the_bits(page):
    lens = [97, 257]
    q, kc, vc, table, kcont, vcont = _cache(2, 6, 1, lens, page)  # 6 query heads on one KV head
    for splits in (1, 3):
        paged = flash_decode(q, kc, vc, lens, block_table=table, block_n=64, num_splits=splits, return_lse=True)
        cont = flash_decode(q, kcont, vcont, lens, block_n=64, num_splits=splits, return_lse=True)
        np.testing.assert_array_equal(paged[0], cont[0])
        np.testing.assert_array_equal(paged[1], cont[1])


@pytest.mark.parametrize("engine", ["vector", "reference"])
def test_one_split_is_flash_on_the_cached_keys(engine):
    lens = [97, 40]
    q, kc, vc, table, kcont, _ = _cache(2, 4, 2, lens, 16, seqlen_q=3, seed=1)
    out = flash_decode(q, kc, vc, np.array(lens, np.int32), block_table=table, block_n=32, engine=engine)
    for b, n in enumerate(lens):
        kb = kc[table[b]].reshape(-1, 2, D)[:n]
        vb = vc[table[b]].reshape(-1, 2, D)[:n]
        np.testing.assert_array_equal(out[b], flash(q[b], kb, vb, block_n=32, layout="bshd"))
        assert np.max(np.abs(out[b] - _oracle(q[b], kb, vb))) < 2e-2


def test_splits_engines_agree_and_stay_close():
    lens = [97, 257, 0]
    q, kc, vc, table, _, _ = _cache(3, 4, 2, lens, 32, seed=2)
    runs = [
        flash_decode(q, kc, vc, lens, block_table=table, block_n=32, num_splits=4, return_lse=True, engine=e)
        for e in ("vector", "reference")
    ]
    np.testing.assert_array_equal(runs[0][0], runs[1][0])
    np.testing.assert_array_equal(runs[0][1], runs[1][1])
    out, lse = runs[0]
    assert np.all(out[2] == 0) and np.all(lse[2] == np.inf)  # no key: out 0, lse +inf (as the kernel's guards)
    for b in (0, 1):
        kb = kc[table[b]].reshape(-1, 2, D)[: lens[b]]
        vb = vc[table[b]].reshape(-1, 2, D)[: lens[b]]
        assert np.max(np.abs(out[b] - _oracle(q[b], kb, vb))) < 2e-2
        # the lse (log2 units: triton plans use exp2) against float64
        s = np.einsum("qhd,khd->hqk", q[b], np.repeat(kb, 2, axis=1)) / math.sqrt(D) * math.log2(math.e)
        ref = np.log2(np.exp2(s - s.max(-1, keepdims=True)).sum(-1)) + s.max(-1)
        assert np.max(np.abs(lse[b] - ref)) < 1e-3


def test_explicit_bounds_equal_the_tile_rule():
    lens = [257]
    q, kc, vc, table, _, _ = _cache(1, 2, 1, lens, 64, seed=3)
    # capacity 320 keys, block_n 64: 5 tiles, 3 splits of 2 tiles -> [0,128), [128,256), [256,257)
    assert kv_splits(257, 320, 64, 3) == [(0, 128), (128, 256), (256, 257)]
    assert kv_splits(100, 320, 64, 3) == [(0, 100), (100, 100), (100, 100)]
    rule = flash_decode(q, kc, vc, lens, block_table=table, block_n=64, num_splits=3)
    bounds = flash_decode(q, kc, vc, lens, block_table=table, block_n=64, split_bounds=[128, 256])
    np.testing.assert_array_equal(rule, bounds)
    odd = flash_decode(q, kc, vc, lens, block_table=table, block_n=64, split_bounds=[50, 131, 900])
    kb, vb = kc[table[0]].reshape(-1, 1, D)[:257], vc[table[0]].reshape(-1, 1, D)[:257]
    assert np.max(np.abs(odd[0] - _oracle(q[0], kb, vb))) < 2e-2


def test_heuristic():
    # flash-attn's own example: 48 blocks on 108 SMs -> 2 splits (efficiency 0.89 vs 0.67 for 3)
    assert num_splits_heuristic(48, 108, 64, 128) == 2
    assert num_splits_heuristic(100, 108, 64, 128) == 1  # >= 80% of the SMs
    assert num_splits_heuristic(1, 264, 3, 128) == 3  # capped by the key tiles
    q, kc, vc, table, _, _ = _cache(1, 2, 1, [257], 64, seed=4)
    auto = flash_decode(q, kc, vc, [257], block_table=table, block_n=64, num_splits=0)
    # 1 batch x 2 heads x 1 query tile; head dim 16: flash-attn's block_n is 256 -> 2 tiles of the 320 keys
    n = num_splits_heuristic(2, 264, 2, 128)
    assert n == 2
    np.testing.assert_array_equal(auto, flash_decode(q, kc, vc, [257], block_table=table, block_n=64, num_splits=n))


# --- the combine against an independent scalar oracle ---

mpmath.mp.prec = 200
F32, BF16 = sformat("fp32"), sformat("bf16")


def _f32(x):
    return round_ref(Fraction(x) if not isinstance(x, Fraction) else x, F32, "nearest_even")


def _frac(x):
    """An mpmath number as its exact Fraction."""
    man, exp = mpmath.mpf(x).man_exp
    return Fraction(int(man)) * Fraction(2) ** int(exp)


def _exp2(x):
    if x == -math.inf:
        return 0.0
    if EX2["table"] is not None:  # the H200's ex2.approx.ftz.f32 model (h200-* plans)
        return ex2_approx_f32(x, EX2["table"], True)
    return _f32(_frac(mpmath.mpf(2) ** mpmath.mpf(x)))


EX2 = {"table": None}


def _log2(x):
    return _f32(_frac(mpmath.log(mpmath.mpf(x), 2)))


def _fa_row(lse, o, dv, out_fmt):
    """flash-attn's combine for one row, written from the kernel's thread picture: 128 threads, kBlockM rows;
    thread t of a row holds splits t % W + l * W; sums then xor-shuffle allreduce."""
    n = len(lse)
    hd = -(-dv // 32) * 32
    bm = 4 if hd % 128 == 0 else (8 if hd % 64 == 0 else 16)
    mx_splits = 2
    while mx_splits < n:
        mx_splits *= 2
    w = min(128 // bm, mx_splits)
    per = -(-mx_splits * bm // 128)
    mx = max(lse)
    mx = 0.0 if mx == -math.inf else mx
    vals = []
    for t in range(w):
        acc = None
        for j in range(per):
            s = j * w + t
            e = _exp2(_f32(Fraction(lse[s]) - Fraction(mx))) if s < n and lse[s] != -math.inf else 0.0
            acc = e if acc is None else _f32(Fraction(acc) + Fraction(e))
        vals.append(acc)
    off = w // 2
    while off >= 1:
        vals = [_f32(Fraction(vals[t]) + Fraction(vals[t ^ off])) for t in range(w)]
        off //= 2
    total = vals[0]
    lse_out = math.inf if total == 0 else _f32(Fraction(_log2(total)) + Fraction(mx))
    out = []
    for d in range(len(o[0])):
        acc = 0.0
        for s in range(n):
            sc = 0.0 if lse[s] == -math.inf else _exp2(_f32(Fraction(lse[s]) - Fraction(lse_out)))
            acc = _f32(Fraction(sc) * Fraction(o[s][d]) + Fraction(acc))
        out.append(round_ref(Fraction(acc), out_fmt, "nearest_even"))
    return out, lse_out


def _divide_row(lse, o, out_fmt):
    mx = max(lse)
    w = [0.0 if x == -math.inf else _exp2(_f32(Fraction(x) - Fraction(mx))) for x in lse]
    den = 0.0
    for x in w:
        den = _f32(Fraction(den) + Fraction(x))
    out = []
    for d in range(len(o[0])):
        num = 0.0
        for s in range(len(lse)):
            num = _f32(Fraction(w[s]) * Fraction(o[s][d]) + Fraction(num))
        out.append(round_ref(Fraction(_f32(Fraction(num) / Fraction(den))), out_fmt, "nearest_even"))
    return out, _f32(Fraction(_log2(den)) + Fraction(mx))


@pytest.mark.parametrize(
    ("splits", "dv", "plan"),
    [
        (2, 16, "triton-bf16"),
        (3, 64, "triton-bf16"),
        (5, 96, "triton-bf16"),
        (17, 128, "triton-bf16"),
        (40, 128, "triton-bf16"),
        (7, 200, "triton-bf16"),
        (6, 64, "h200-bf16"),  # the H200's ex2 model; output in fp32 so that its differences show (they do)
        (33, 32, "h200-bf16"),
    ],
)
def test_combine_matches_the_scalar_oracle(splits, dv, plan, monkeypatch):
    monkeypatch.setitem(EX2, "table", ex2_table("h200") if plan.startswith("h200") else None)
    g = np.random.default_rng(splits * 1000 + dv)
    rows = 3
    o = g.standard_normal((splits, rows, dv)).astype(np.float32).astype(np.float64)
    lse = (g.standard_normal((splits, rows)) * 4).astype(np.float32).astype(np.float64)
    lse[1, 0] = -np.inf  # an empty split
    pl, fmt = (sf.attention.plan(plan).replace(out="fp32"), F32) if plan.startswith("h200") else (plan, BF16)
    for combine, row in (("flash-attn", lambda s, x, r: _fa_row(s, x, dv, fmt)), ("divide", None)):
        out, lse_out = combine_splits(o, lse, plan=pl, combine=combine)
        for r in range(rows):
            ls, os_ = list(lse[:, r]), [list(o[s, r]) for s in range(splits)]
            want, want_lse = row(ls, os_, r) if row else _divide_row(ls, os_, fmt)
            np.testing.assert_array_equal(out[r], want, err_msg=f"{combine} row {r}")
            assert lse_out[r] == want_lse


def test_combine_errors():
    o = np.zeros((2, 3, 4))
    with pytest.raises(ValueError, match="combine must be one of"):
        combine_splits(o, np.zeros((2, 3)), combine="tree")
    with pytest.raises(ValueError, match="num_splits"):
        combine_splits(o, np.zeros((2, 4)))
    with pytest.raises(ValueError, match="float32"):
        combine_splits(o + 0.1, np.zeros((2, 3)))
    with pytest.raises(TypeError, match="numpy"):
        combine_splits([[0.0]], np.zeros(1))  # type: ignore[arg-type]


def test_decode_errors():
    q, kc, vc, table, kcont, vcont = _cache(2, 4, 2, [97, 40], 16)
    bad = table.copy()
    bad[0, 0] = 999
    with pytest.raises(ValueError, match="outside the pool"):
        flash_decode(q, kc, vc, [97, 40], block_table=bad)
    with pytest.raises(ValueError, match="capacity"):
        flash_decode(q, kc, vc, [97, 10_000], block_table=table)
    with pytest.raises(TypeError, match="integers"):
        flash_decode(q, kc, vc, [97, 40], block_table=table.astype(float))
    with pytest.raises(ValueError, match=r"\(batch,\)"):
        flash_decode(q, kc, vc, [97], block_table=table)
    with pytest.raises(ValueError, match="a row would see no key"):
        flash_decode(np.concatenate([q, q, q], axis=1), kc, vc, [97, 2], block_table=table, causal=True)
    with pytest.raises(ValueError, match="combine"):
        flash_decode(q, kc, vc, [97, 40], block_table=table, num_splits=2, combine="tree")
    with pytest.raises(ValueError, match="split_bounds"):
        flash_decode(q, kc, vc, [97, 40], block_table=table, split_bounds=[64, 32])
    with pytest.raises(ValueError, match="num_splits"):
        flash_decode(q, kc, vc, [97, 40], block_table=table, num_splits=-1)
    with pytest.raises(ValueError, match="batch"):
        flash_decode(q, kcont[:1], vcont[:1], [97, 40])
    # one query row: causal changes nothing
    np.testing.assert_array_equal(
        flash_decode(q, kc, vc, [97, 40], block_table=table, causal=True),
        flash_decode(q, kc, vc, [97, 40], block_table=table),
    )


@pytest.mark.parametrize("engine", ["vector", "reference"])
def test_causal_decode_aligns_bottom_right(engine):
    """Speculative decode (3 query rows): row i of a sequence with n keys sees keys j <= n - 3 + i. One pass: the
    bits of flash() with the bottom-right mask; the fp64 plan against a float64 oracle with that mask, with and
    without splits (a split past a row's last key gives that row 0 and lse -inf)."""
    lens = [97, 40]
    q, kc, vc, table, kcont, vcont = _cache(2, 4, 2, lens, 16, seqlen_q=3, seed=7)
    for b, n in enumerate(lens):
        one = flash_decode(q[b : b + 1], kc, vc, [n], block_table=table[b : b + 1], causal=True, engine=engine)
        ref = flash(
            q[b], kcont[b, :n], vcont[b, :n], causal=True, causal_align="bottom-right", block_n=64, layout="bshd"
        )
        np.testing.assert_array_equal(one[0], ref)
        keep = np.arange(n)[None, :] <= (n - 3 + np.arange(3))[:, None]
        g = q.shape[2] // kc.shape[2]
        kk, vv = np.repeat(kcont[b, :n], g, axis=1), np.repeat(vcont[b, :n], g, axis=1)
        s = np.where(keep, np.einsum("qhd,khd->hqk", q[b], kk) / math.sqrt(D), -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        want = np.einsum("hqk,khd->qhd", p / p.sum(-1, keepdims=True), vv)
        for bounds in (None, [n - 2], [32, n - 1]):
            got = flash_decode(
                q[b : b + 1],
                kc,
                vc,
                [n],
                block_table=table[b : b + 1],
                plan="fp64",
                causal=True,
                split_bounds=bounds,
                engine=engine,
            )
            np.testing.assert_allclose(got[0], want, rtol=0, atol=1e-6 if bounds else 1e-12)  # float32 partials


@pytest.mark.parametrize("combine", ["flash-attn", "divide"])
def test_one_nonempty_split_gives_the_one_pass_bits(combine):
    # 40 keys in a 64-key cache, block_n 64: one tile, so splits 2 and 3 are empty (lse -inf); the combine's
    # scale of the one split is exp(0) = 1 and its fp32 partial cast to bf16 is the one-pass output
    q, kc, vc, table, _, _ = _cache(1, 4, 2, [40], 64, seed=5)
    one = flash_decode(q, kc, vc, [40], block_table=table, block_n=64, return_lse=True)
    three = flash_decode(q, kc, vc, [40], block_table=table, block_n=64, num_splits=3, combine=combine, return_lse=True)
    np.testing.assert_array_equal(one[0], three[0])
    np.testing.assert_array_equal(one[1], three[1])
