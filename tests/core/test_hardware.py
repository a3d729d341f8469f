"""simfloat.hardware: the H200's ex2.approx.ftz.f32 and tl.exp (against the recorded probe outputs) and the
measured tl.sum order (against the probe's reduction trees)."""

import json
import math
from pathlib import Path

import numpy as np
import pytest

from simfloat import hardware as H

PROBES = Path(__file__).resolve().parents[1] / "fixtures" / "gpu" / "h200" / "probes"


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
    from simfloat_gpu.campaign.fit import probe_variants, tree_from_lca
    from simfloat_gpu.campaign.probes import sum_design

    z = np.load(path)
    checked = 0
    for name, v in probe_variants(z, "sum").items():
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
    assert pl.exp2_impl == H.h200_ex2() and pl.sum_order == H.SumOrder("h200-mma")
    assert A.plan("triton-bf16").replace(exp2_impl="h200").params(0.125).ex2_tab.size == 2**24
    with pytest.raises(ValueError):
        A.plan("triton-bf16").replace(sum_order="nope")


def test_plans_carry_the_hardware_models_as_values():
    """exp2_impl and sum_order are values (an ex2 table, a tl.sum order with its layout rule), however given: the
    name "h200" and the profile give the same value, which pickles as a reference to the shipped table."""
    import pickle

    import simfloat.attention as A

    by_name = A.plan("triton-bf16").replace(exp2_impl="h200", sum_order="h200-mma")
    by_profile = A.plan("triton-bf16", hardware="h200")
    assert by_name.exp2_impl is by_profile.exp2_impl is H.h200_ex2()
    assert by_name.sum_order == by_profile.sum_order == H.SumOrder("h200-mma")
    assert by_name.exp2_impl.table is H.ex2_table("h200")  # the very array the kernels read (one compile)
    assert A.plan("triton-bf16").sum_order == H.SumOrder() and A.plan("triton-bf16").exp2_impl == "correctly_rounded"
    assert len(pickle.dumps(by_profile)) < 100_000 and pickle.loads(pickle.dumps(by_profile)) == by_profile
    # the warp-layout rule of the order is the order's: the mma layout's rule for h200-mma, none for sequential
    for bm, dv in ((16, 64), (64, 64), (32, 16), (128, 128)):
        assert by_profile.sum_order.warps_n(bm, dv) == H.mma_sum_warps(bm, dv)
        assert H.SumOrder().warps_n(bm, dv) == 1
    assert H.SumOrder("h200-mma").code == 1 and H.SumOrder().code == 0
    with pytest.raises(ValueError, match="sum order must be one of"):
        H.SumOrder("tree")


def test_which_kernel_a_plan_models_is_a_field():
    """Plan.gpu_kernel and Plan.profile say what the name prefixes said: a hardware profile applies to the
    Triton kernel's plans without one, whatever their name."""
    import dataclasses

    import simfloat.attention as A
    from simfloat.attribution.cli import _triton_plan

    assert (A.plan("triton-bf16").gpu_kernel, A.plan("triton-bf16").profile) == ("triton", None)
    assert (A.plan("h200-bf16").gpu_kernel, A.plan("h200-bf16").profile) == ("triton", "h200")
    assert A.plan("fa3-bf16").gpu_kernel == "fa3" and A.plan("pytorch-bf16").gpu_kernel == "pytorch"
    assert A.plan("fp64").gpu_kernel is None and A.plan("int8-reference").gpu_kernel is None
    assert [_triton_plan(n) for n in ("triton-e4m3", "h200-e4m3", "triton-e4m3@h200", "fa3-e4m3", "nope")] == [
        True,
        True,
        True,
        False,
        False,
    ]
    assert [_triton_plan(n, unprofiled=True) for n in ("triton-bf16", "h200-bf16", "triton-bf16@h200")] == [
        True,
        False,
        False,
    ]
    with pytest.raises(ValueError, match="gpu_kernel must be None or one of"):
        dataclasses.replace(A.plan("triton-bf16"), gpu_kernel="cuda")
    with pytest.raises(ValueError, match="applies to the triton-<fmt> presets"):
        A.plan("h200-bf16", hardware="h200")


# -- the tl.sum order: the one model against a plain re-statement -------------------------------------------------


def _oracle_mma_sum(p, warps_n, add):
    """The measured order restated column by column: column c of the row lives in warp (c // 8) % warps_n, lane
    (c % 8) // 2; a lane folds its columns left to right from the first as it is (no column: 0); a warp sums its
    lanes (s0 + s2) + (s1 + s3); the warps that hold columns sum (w0 + w1), or (w0 + w2) + (w1 + w3) with an
    absent w3 as 0."""
    n = len(p)
    nw = min(warps_n, (n + 7) // 8)
    warp_sums = []
    for w in range(nw):
        lanes = []
        for t in range(4):
            cols = [c for c in range(n) if (c // 8) % warps_n == w and (c % 8) // 2 == t]
            s = p[cols[0]] if cols else 0.0
            for c in cols[1:]:
                s = add(s, p[c])
            lanes.append(s)
        warp_sums.append(add(add(lanes[0], lanes[2]), add(lanes[1], lanes[3])))
    if nw == 1:
        return warp_sums[0]
    if nw == 2:
        return add(warp_sums[0], warp_sums[1])
    w3 = warp_sums[3] if nw == 4 else 0.0
    return add(add(warp_sums[0], warp_sums[2]), add(warp_sums[1], w3))


def _f32_add(a, b):
    return float(np.float32(a + b))  # a float32 sum rounded from its exact float64 value: one rounding


def _bf16_add(a, b):
    """Round-to-nearest-even into bfloat16 (8 significand bits) of a + b, exact in float64 for the values below
    (all within 2^-18 .. 2^23), by Python's round() (ties to even) on the scaled significand."""
    x = a + b
    if x == 0.0:
        return 0.0
    _, e = math.frexp(x)
    return round(math.ldexp(x, 8 - e)) * 2.0 ** (e - 8)


def test_mma_tree_sum_matches_a_restatement_of_the_order():
    """Every length 1..300 and 1, 2, 4 warps along the row: the fp32 model (as tl.sum and the engine's native path
    run it) and the rounded-op model (as the reference kernel's row_sum runs it, bf16) against the oracle."""
    from simfloat.attention._kernels import row_sum
    from simfloat.attention.plan import OpParams
    from simfloat.formats import format as fmt

    bf16 = OpParams(fmt("bfloat16").params, 0)
    rng = np.random.default_rng(11)
    x = rng.standard_normal((2, 300)) * rng.choice([1e-3, 1.0, 1e4], size=(2, 300))
    x32 = x.astype(np.float32)
    xb = np.array([[_bf16_add(v, 0.0) for v in row] for row in x])
    for n in range(1, 301):
        for w in (1, 2, 4):
            got = H.tl_sum_mma(x32[:, :n], w)
            for r in range(2):
                want = _oracle_mma_sum([float(v) for v in x32[r, :n]], w, _f32_add)
                assert got[r].tobytes() == np.float32(want).tobytes(), (n, w, r)
                got_b = row_sum(xb[r], n, bf16, 1, w)
                want_b = _oracle_mma_sum(list(xb[r, :n]), w, _bf16_add)
                assert np.float64(got_b).tobytes() == np.float64(want_b).tobytes(), (n, w, r)
    assert H.tl_sum_mma_f32(x32[0].astype(np.float64), 300) == H.tl_sum_mma(x32[:1])[0]
    with pytest.raises(ValueError, match="warps_n"):
        H.tl_sum_mma(x32, 3)
