"""simfloat.hardware: the H200's ex2.approx.ftz.f32 and tl.exp (against the recorded probe outputs) and the
measured tl.sum order (against the probe's reduction trees)."""

import json
from pathlib import Path

import numpy as np
import pytest

from simfloat import hardware as H

PROBES = Path(__file__).resolve().parent / "fixtures" / "gpu" / "h200" / "probes"


@pytest.fixture(scope="module")
def exp2z():
    path = PROBES / "exp2.npz"
    if not path.is_file():
        pytest.skip("no H200 exp2 probe")
    return np.load(path)


def _segment(z, name, step=1):
    from simfloat_gpu.campaign.fit import segment_values

    seg = next(s for s in json.loads(str(z["segments"])) if s["name"] == name)
    x, y = segment_values(z, seg)
    return x[::step], y[::step]


@pytest.mark.parametrize("name,step", [("exp2_sweep", 7), ("exp2_neg_binade", 5), ("exp2_pos_binade", 5)])
def test_ex2_approx_bitwise(exp2z, name, step):
    """The sweep of [-32, -2^-30] is held out (the tables come from the two binades)."""
    x, y = _segment(exp2z, name, step)
    assert np.array_equal(H.ex2_approx(x).view(np.uint32), y.view(np.uint32))


def test_tl_exp_bitwise(exp2z):
    x, y = _segment(exp2z, "exp_sweep", 3)
    assert np.array_equal(H.exp_approx(x).view(np.uint32), y.view(np.uint32))


def test_edges(exp2z):
    x = exp2z["edges_x"]
    for got, want in ((H.ex2_approx(x), exp2z["edges_exp2_y"]), (H.exp_approx(x), exp2z["edges_exp_y"])):
        want = want.view(np.float32)
        same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
        assert same.all(), x[~same]


def test_not_correctly_rounded():
    x = np.float32([-1.0000001, -0.3, 0.0, -126.5, -200.0, 1e-40])
    y = H.ex2_approx(x)
    assert y[2] == 1.0 and y[4] == 0.0 and y[5] == 1.0 and y[3] == 0.0  # ftz
    assert np.all(np.abs(y[:2] - np.exp2(x[:2].astype(np.float64))) < 3 * np.spacing(y[:2]))


def test_sum_order_matches_probe_trees():
    """tl.sum over a tensor-core tile with one warp along the row (64xN, 128xN probes): the FPRev trees."""
    path = PROBES / "probes.npz"
    if not path.is_file():
        pytest.skip("no H200 probes")
    from simfloat_gpu.campaign.fit import _variants, tree_from_lca
    from simfloat_gpu.campaign.probes import sum_design

    z = np.load(path)
    checked = 0
    for name, v in _variants(z, "sum").items():
        bm, bn = (int(s) for s in v["shape"][:2])
        if bm < 64:
            continue
        pairs, x = sum_design(bn)
        p = len(pairs)
        want = tree_from_lca(_lca(v["y_mma"].astype(np.float64)[:p], pairs, bn))
        got = tree_from_lca(_lca(bn - np.float64(bn) + _our_sums(x, bn), pairs, bn))
        assert got == want, name
        checked += 1
    assert checked >= 4


def _our_sums(x, n):
    return H.tl_sum_mma(x.astype(np.float32)).astype(np.float64)[: len(x)]


def _lca(y, pairs, n):
    m = np.zeros((n, n))
    p = len(pairs)
    m[pairs[:, 0], pairs[:, 1]] = n - y[:p]
    m[pairs[:, 1], pairs[:, 0]] = n - y[:p]
    return m


def test_h200_plan_flag():
    import simfloat.attention as A

    pl = A.plan("h200-bf16")
    assert pl.exp2_impl == "h200" and pl.sum_order == "h200-mma"
    assert A.plan("triton-bf16").replace(exp2_impl="h200").params(0.125).ex2_tab.size == 2**24
    with pytest.raises(ValueError):
        A.plan("triton-bf16").replace(sum_order="nope")
