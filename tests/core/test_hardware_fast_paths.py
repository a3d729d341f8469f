"""The vector engine's fast forms of the H200 models, bit for bit against the scalar functions they replace:
ex2.approx.ftz.f32 by its value table (:func:`simfloat.hardware.ex2_ftz_neg`) and the tl.sum tree over many rows
at once (:func:`simfloat.hardware.tl_sum_mma_rows_f32`)."""

import numpy as np
import pytest

from simfloat import hardware as H


def _slow_ex2(x, tab):
    return np.array([H.ex2_approx_f32(float(v), tab, True) for v in x])


def _fast_ex2(x, tab):
    y = np.array(x, dtype=np.float64)
    H.ex2_ftz_neg(y, y.size, H.ex2_values(tab), tab)
    return y


def _same(a, b):
    return np.array_equal(a.view(np.uint64), b.view(np.uint64))


def _nonpositive_inputs():
    g = np.random.default_rng(3)
    f = np.concatenate([np.arange(64), H.TWO23 - 1 - np.arange(64), g.integers(0, H.TWO23, 4000)])
    i = g.integers(0, 8, f.size)
    lattice = -(i + f * 2.0**-23)  # float32 values: every fraction f of the table, integer parts 0..7
    wide = -np.abs(g.standard_normal(4000) * 40).astype(np.float32)  # scores minus their maximum
    edges = np.array(
        [0.0, -0.0, -1e-45, -1.1754942e-38, -1.1754944e-38, -2e-38, -1.0, -2.0, -125.5, -126.0, -126.0000076,
         -127.0, -149.0, -149.99998, -150.0, -159.99998, -160.0, -160.00002, -199.0, -200.0, -1e30, -np.inf],
        dtype=np.float32,
    )  # fmt: skip
    ftz_edge = -(2.0 ** -np.arange(120, 135, 0.125)).astype(np.float32)
    below = -np.arange(120.0, 165.0, 2.0**-7).astype(np.float32)  # the results that flush to zero and those that do not
    return np.concatenate([lattice.astype(np.float32), wide, edges, ftz_edge, below]).astype(np.float64)


def test_ex2_value_table_equals_ex2_approx():
    tab = H.ex2_table("h200")
    x = _nonpositive_inputs()
    assert _same(_fast_ex2(x, tab), _slow_ex2(x, tab))


def test_ex2_value_table_other_table_and_fallback():
    """A table of other offsets gets its own values; a positive or NaN input sends the call to the scalar form."""
    g = np.random.default_rng(4)
    tab = g.integers(-2, 2, 2 * H.TWO23).astype(np.int8)
    x = _nonpositive_inputs()[:3000]
    assert _same(_fast_ex2(x, tab), _slow_ex2(x, tab))
    assert not np.array_equal(H.ex2_values(tab), H.ex2_values(H.ex2_table("h200")))
    for odd in (0.75, 1.5, 3.0, np.nan, np.inf, 1e-40):
        y = x[:50].copy()
        y[17] = odd
        assert _same(_fast_ex2(y, tab), _slow_ex2(y, tab)), odd


def test_ex2_values_cached_per_table():
    tab = H.ex2_table("h200")
    assert H.ex2_values(tab) is H.ex2_values(tab)
    assert H.ex2_values(tab[:0]).size == 0
    with pytest.raises(ValueError, match="ex2_values"):
        H.ex2_values(np.zeros(10, dtype=np.int8))


@pytest.mark.parametrize("warps_n", [1, 2, 4])
def test_tl_sum_rows_equals_the_tree_per_row(warps_n):
    g = np.random.default_rng(warps_n)
    for n in (*range(1, 40), 63, 64, 65, 96, 127, 128, 200):
        rows = 1 + (n * 7) % 37
        p = g.standard_normal((rows, n)).astype(np.float32) * np.float32(2.0) ** g.integers(-30, 30, (rows, n))
        p[0, 0] = -0.0
        p[:, n // 2] = np.abs(p[:, n // 2])
        pt = np.ascontiguousarray(p.T)
        work = np.full((16, rows), np.nan, dtype=np.float32)
        out = np.full(rows, np.nan)
        H.tl_sum_mma_rows_f32(pt, rows, n, warps_n, work, out)
        want = np.array([H.tl_sum_mma_f32(p[r].astype(np.float64), n, warps_n) for r in range(rows)])
        assert _same(out, want), (n, warps_n)
