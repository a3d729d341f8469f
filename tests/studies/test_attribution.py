"""simfloat.attribution: isolation/ablation plans are what they claim, tables have the expected rows, errors
are clear. Tiny inputs (seq 64 x 97 keys, head dim 16)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

import simfloat as sf
from simfloat.attention import FLASH_OPS, baseline, flash, plan
from simfloat.attention.quant_plan import QUANT_FIELDS
from simfloat.attribution import (
    BASELINE_PAIRS,
    METRICS,
    Attribution,
    ablation_plan,
    attribute,
    baseline_plan_for,
    default_block_ns,
    default_tiles,
    deviation,
    isolation_plan,
    reference_plan,
    select_rows,
)
from simfloat.attribution._plans import FLAGS, cache_key

pd = pytest.importorskip("pandas")

BM, BN = 16, 16


def _inputs(seq_q=64, seq_k=97, d=16, lead=(2,), seed=0, fmt="bf16"):
    g = np.random.default_rng(seed)
    return tuple(sf.round(g.standard_normal(lead + (s, d)), fmt) for s in (seq_q, seq_k, seq_k))


@pytest.fixture(scope="module")
def qkv():
    return _inputs()


@pytest.fixture(scope="module")
def res(qkv):
    q, k, v = qkv
    return attribute(
        q, k, v, ["triton-bf16", "all-bf16"], block_m=BM, block_n=BN, tiles=[(8, 16), (16, 32)], block_ns=[8, 16, 97]
    )


def _golden(q, k, v, causal=False):
    return baseline(q, k, v, plan="fp64", causal=causal)


def test_isolation_plan_has_one_low_precision_op_and_the_plans_flags():
    p = plan("triton-bf16")
    fp64 = plan("fp64")
    iso = isolation_plan(p, "p")
    assert iso.p == p.p and str(iso.p) == "bfloat16"
    for op in FLASH_OPS:
        if op != "p":
            assert getattr(iso, op) == getattr(fp64, op), op
    for f in FLAGS:
        assert getattr(iso, f) == getattr(p, f)
    abl = ablation_plan(p, "pv")
    assert abl.pv == fp64.pv and abl.qk == p.qk and abl.exp2 and abl.contract


@pytest.mark.parametrize("name", ["triton-bf16", "all-bf16"])
@pytest.mark.parametrize("op", ["qk", "l_i", "p", "out"])
def test_isolation_row_equals_direct_flash_call(res, qkv, name, op):
    q, k, v = qkv
    out = flash(q, k, v, plan=isolation_plan(name, op), block_m=BM, block_n=BN)
    want = deviation(out, _golden(q, k, v))
    row = res.isolation.set_index(["plan", "op"]).loc[(name, op)]
    for m in METRICS:
        assert row[m] == want[m], m
    assert row["entry"] == ("bf16" if op in ("p", "out") or name == "all-bf16" and op == "l_i" else row["entry"])


def test_ablation_row_equals_direct_flash_call(res, qkv):
    q, k, v = qkv
    out = flash(q, k, v, plan=ablation_plan("all-bf16", "pv"), block_m=BM, block_n=BN)
    row = res.ablation.set_index(["plan", "op"]).loc[("all-bf16", "pv")]
    assert row["max_abs"] == deviation(out, _golden(q, k, v))["max_abs"]


@pytest.mark.parametrize("name", ["triton-bf16", "all-bf16", "triton-fp16"])
def test_ablating_every_op_gives_fp64(qkv, name):
    q, k, v = qkv
    p = plan(name)
    for op in FLASH_OPS:
        p = ablation_plan(p, op)
    ref = reference_plan(name)
    assert all(getattr(p, f) == getattr(ref, f) for f in FLASH_OPS + FLAGS)
    d = deviation(flash(q, k, v, plan=p, block_m=BM, block_n=BN), _golden(q, k, v))
    assert d["max_abs"] < 1e-14 and d["rel_rms"] < 1e-14


def test_all_rows_and_reference(res):
    for name in ("triton-bf16", "all-bf16"):
        abl = res.ablation.set_index(["plan", "op"])
        assert abl.loc[(name, "all"), "max_abs"] < 1e-14  # every op raised: the fp64 golden value
        iso = res.isolation.set_index(["plan", "op"])
        fvb = res.flash_vs_baseline.set_index(["plan", "kernel"])
        assert iso.loc[(name, "all"), "max_abs"] == fvb.loc[(name, "flash"), "max_abs"]
        assert iso.loc[(name, "all"), "frac_max"] == 1.0
    # m_i's rounding cancels out of the output (the same max is subtracted and added back)
    assert res.isolation.set_index(["plan", "op"]).loc[("all-bf16", "m_i"), "max_abs"] < 1e-14
    # the bf16 output cast alone is the biggest isolated error of the triton plan
    tri = res.isolation[(res.isolation["plan"] == "triton-bf16") & (res.isolation["op"] != "all")]
    assert tri.set_index("op")["max_abs"].idxmax() == "out"


def test_table_shapes(res):
    assert isinstance(res, Attribution)
    assert len(res.isolation) == len(res.ablation) == 2 * (len(FLASH_OPS) + 1)
    assert list(res.isolation["op"][: len(FLASH_OPS) + 1]) == list(FLASH_OPS) + ["all"]
    t = res.tiles
    assert list(zip(t["plan"], t["block_m"], t["block_n"], t["steps"], strict=True)) == [
        ("triton-bf16", 8, 16, 7),
        ("triton-bf16", 16, 32, 4),
        ("all-bf16", 8, 16, 7),
        ("all-bf16", 16, 32, 4),
    ]
    s = res.steps
    assert list(s["block_n"]) == [8, 16, 97] * 2 and list(s["steps"]) == [13, 7, 1] * 2
    assert set(s["block_m"]) == {BM}
    f = res.flash_vs_baseline
    assert list(f["kernel_plan"]) == ["triton-bf16", "pytorch-bf16", "all-bf16", "all-bf16"]
    assert list(f["ratio_max"][1::2]) == [1.0, 1.0]
    for df in (res.isolation, res.ablation, res.tiles, res.steps, f):
        assert set(METRICS) <= set(df.columns)
        assert np.isfinite(df[list(METRICS)].to_numpy(float)).all()
    # the steps row at block_n = BN is the main run
    main = s[(s["plan"] == "all-bf16") & (s["block_n"] == BN)]["max_abs"].item()
    assert main == f.set_index(["plan", "kernel"]).loc[("all-bf16", "flash"), "max_abs"]


def test_by_block(res):
    b = res.by_block
    n_kv = math.ceil(97 / BN)
    assert set(b["plan"]) == {"triton-bf16", "all-bf16"}
    assert set(b["kv_block"]) == set(range(n_kv)) | {-1}
    assert {"qk", "pv", "out"} <= set(b["op"])
    assert set(b[b["kv_block"] == -1]["op"]) == {"normalize", "out"}
    st = res.state_by_block
    assert {"m_i", "l_i", "acc", "out"} == set(st["state"])
    assert (st[st["plan"] == "all-bf16"]["rel_max"] > 0).any()


def test_outputs(res, tmp_path):
    text = res.table()
    for s in (
        "flash vs baseline",
        "triton-bf16",
        "pytorch-bf16",
        "rescaling steps",
        "tiles",
        "per op",
        "all-bf16 max_abs",
        "all-bf16 rms",
    ):
        assert s in text
    paths = res.to_csv(tmp_path / "csv")
    assert {p.name for p in paths} == {
        "isolation.csv",
        "ablation.csv",
        "tiles.csv",
        "steps.csv",
        "flash_vs_baseline.csv",
        "by_block.csv",
        "state_by_block.csv",
    }
    back = pd.read_csv(tmp_path / "csv" / "isolation.csv")
    assert list(back.columns) == list(res.isolation.columns)
    png = res.plot(tmp_path / "a.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "runs=" in repr(res)


def test_rows_subset_is_exact(qkv):
    q, k, v = qkv
    r = attribute(q, k, v, "triton-bf16", block_m=BM, block_n=BN, ops=["p"], tiles=(), block_ns=(), rows=5, trace=False)
    rows = select_rows(64, 5)
    assert list(rows) == [0, 16, 32, 47, 63] and r.meta["rows"] == 5
    full = flash(q, k, v, plan="triton-bf16", block_m=BM, block_n=BN)
    want = deviation(full[:, rows], _golden(q, k, v)[:, rows])
    assert r.flash_vs_baseline["max_abs"][0] == want["max_abs"]
    assert len(r.tiles) == len(r.steps) == len(r.by_block) == 0
    assert select_rows(64, None) is None and select_rows(64, 100) is None
    assert list(select_rows(64, [3, 1, 3])) == [1, 3]


def test_causal_and_baseline_override(qkv):
    q, k, v = qkv
    r = attribute(
        q[:, :40],
        k[:, :40],
        v[:, :40],
        "triton-bf16",
        baseline="all-bf16",
        block_m=BM,
        block_n=BN,
        causal=True,
        ops=["out"],
        tiles=[(8, 8)],
        block_ns=[8],
    )
    assert list(r.flash_vs_baseline["kernel_plan"]) == ["triton-bf16", "all-bf16"]
    out = flash(q[:, :40], k[:, :40], v[:, :40], plan="triton-bf16", block_m=8, block_n=8, causal=True)
    assert r.tiles["max_abs"][0] == deviation(out, _golden(q[:, :40], k[:, :40], v[:, :40], True))["max_abs"]


def test_pairs_and_defaults():
    assert BASELINE_PAIRS["triton-bf16"] == "pytorch-bf16" and BASELINE_PAIRS["all-fp16"] == "all-fp16"
    assert BASELINE_PAIRS["h200-fp16"] == "pytorch-fp16"
    assert baseline_plan_for("triton-fp32").name == "pytorch-fp32"
    assert baseline_plan_for("triton-bf16", {"triton-bf16": "all-bf16"}).name == "all-bf16"
    assert baseline_plan_for("all-bf16", {"triton-bf16": "all-bf16"}).name == "all-bf16"
    with pytest.raises(ValueError, match="baseline="):
        baseline_plan_for("triton-e4m3")
    with pytest.raises(ValueError, match="no baseline plan"):
        baseline_plan_for(plan("triton-bf16").replace(p="fp16"))
    assert default_tiles(64, 64) == [(32, 32), (32, 128), (64, 64), (128, 32), (128, 128)]
    assert default_block_ns(100) == [16, 32, 64, 128]


def test_deviation_metrics():
    d = deviation(np.array([1.0, 2.0, 3.0, 4.0]), np.array([1.0, 2.0, 3.0, 2.0]))
    assert d == {"max_abs": 2.0, "mean_abs": 0.5, "rms": 1.0, "rel_rms": 1.0 / math.sqrt(4.5)}


def test_bad_arguments(qkv):
    q, k, v = qkv
    kw = dict(tiles=(), block_ns=(), trace=False)
    with pytest.raises(ValueError, match="unknown op 'nope'"):
        attribute(q, k, v, ops=["nope"], **kw)
    with pytest.raises(ValueError, match="at least one plan"):
        attribute(q, k, v, [], **kw)
    with pytest.raises(ValueError, match="distinct"):
        attribute(q, k, v, ["all-bf16", "all-bf16"], **kw)
    with pytest.raises(ValueError, match="unknown plan"):
        attribute(q, k, v, "bogus", **kw)
    with pytest.raises(ValueError, match="block_m"):
        attribute(q, k, v, tiles=[(0, 16)], block_ns=())
    with pytest.raises(ValueError, match="pair"):
        attribute(q, k, v, tiles=[(16,)], block_ns=())
    with pytest.raises(ValueError, match="causal"):
        attribute(q, k, v, rows=4, causal=True, **kw)
    with pytest.raises(ValueError, match="within"):
        attribute(q, k, v, rows=[64], **kw)
    with pytest.raises(ValueError, match="no baseline plan"):
        attribute(q, k, v, "triton-e4m3", **kw)
    with pytest.raises(ValueError, match="baseline kernel.*baseline="):
        attribute(q, k, v, "pytorch-bf16", **kw)
    with pytest.raises(ValueError, match="'h200-bf16' .*flash kernel"):
        attribute(q, k, v, "triton-bf16", baseline="h200-bf16", **kw)
    with pytest.raises(TypeError, match="numpy array"):
        attribute(q.tolist(), k, v, **kw)
    with pytest.raises(ValueError, match="head_dim"):
        attribute(q, k[..., :8], v, **kw)
    with pytest.raises(ValueError, match="block_n"):
        attribute(q, k, v, block_n=0, **kw)


def test_plan_names_do_not_matter_for_dedup(qkv):
    q, k, v = qkv
    same = dataclasses.replace(plan("triton-bf16"), name="mine")
    r = attribute(
        q, k, v, [same], baseline="pytorch-bf16", block_m=BM, block_n=BN, ops=["p"], tiles=(), block_ns=(), trace=False
    )
    # golden, main, reference, baseline, isolation(p), ablation(p): six distinct runs
    assert r.meta["runs"] == 6 and r.flash_vs_baseline["plan"][0] == "mine"


def test_flags_are_every_plan_field_but_the_ops():
    ops = set(FLASH_OPS) | {"softmax", "name"}
    # which kernel; the quantizer ops (None in the float plans); a baseline plan's working precision (opmath)
    # which kernel, which hardware profile and the kernel's input format (gpu_kernel, profile, input_format: what
    # the plan models, not how it computes)
    # the accumulator's format (pv_acc: alpha's rounding into it is the acc op's, test_pv_acc_is_the_acc_ops)
    not_flags = {"kernel", "gpu_kernel", "profile", "input_format", "opmath", "pv_acc", *QUANT_FIELDS}
    assert set(FLAGS) == {f.name for f in dataclasses.fields(sf.attention.Plan)} - ops - not_flags
    alt = dict(
        exp2=False,
        contract=False,
        normalization="per_step",
        lazy_threshold=1.0,
        exp2_impl="correctly_rounded",
        sum_order="sequential",
        exp_impl="tl.exp",
        tie_shift=2.0,
        tie_tol=1e-3,
        state="lse",
        kv_order="reverse",
        contract_diagonal=False,
        exp2_emu="fa4",
        p_offset=4,
        alpha_raw=True,
    )
    assert set(alt) == set(FLAGS)  # a new flag needs a value here
    for f, value in alt.items():
        p = plan("h200-bf16")
        if f in ("exp_impl", "state"):  # tl.exp is what a kernel without exp2 calls; the lse form has no exp2
            p = dataclasses.replace(p, exp2=False)
        if f == "tie_tol":  # the tolerance of the tie_shift rule
            p = dataclasses.replace(p, tie_shift=2.0)
        q = dataclasses.replace(p, **{f: value})
        assert cache_key("flash", q) != cache_key("flash", p), f
        value = getattr(q, f)  # as the plan holds it (sum_order "sequential": a hardware.SumOrder value)
        assert getattr(reference_plan(q), f) == value and getattr(isolation_plan(q, "p"), f) == value, f
        assert getattr(ablation_plan(q, "p"), f) == value, f


def test_pv_acc_is_the_acc_ops():
    """Plan.pv_acc goes with the acc op: kept by its isolation plan, dropped by its ablation and the reference,
    and part of the cache key."""
    p = plan("triton-fp16").replace(acc="float16")
    q = p.replace(pv_acc="float16")
    assert cache_key("flash", q) != cache_key("flash", p)
    assert reference_plan(q).pv_acc is None
    assert isolation_plan(q, "acc").pv_acc == q.pv_acc and isolation_plan(q, "p").pv_acc is None
    assert ablation_plan(q, "acc").pv_acc is None and ablation_plan(q, "p").pv_acc == q.pv_acc


def test_h200_plan_is_not_taken_for_its_triton_twin():
    # triton-tf32 and h200-tf32 differ only in exp2_impl and sum_order (fp32 output: the difference shows)
    q, k, v = _inputs(seq_q=8, seq_k=24, lead=(1,), fmt="tf32")
    names = ("triton-tf32", "h200-tf32")
    gold = _golden(q, k, v)
    r = attribute(
        q,
        k,
        v,
        list(names),
        baseline="fp64",
        block_m=BM,
        block_n=BN,
        ops=["exp", "l_i"],
        tiles=(),
        block_ns=(),
        trace=False,
    )
    fvb = r.flash_vs_baseline.set_index(["plan", "kernel"])
    iso = r.isolation.set_index(["plan", "op"])
    got = {}
    for name in names:
        got[name] = deviation(flash(q, k, v, plan=name, block_m=BM, block_n=BN), gold)["max_abs"]
        assert fvb.loc[(name, "flash"), "max_abs"] == got[name], name
        want = deviation(flash(q, k, v, plan=isolation_plan(name, "l_i"), block_m=BM, block_n=BN), gold)
        assert iso.loc[(name, "l_i"), "max_abs"] == want["max_abs"], name
    assert got["triton-tf32"] != got["h200-tf32"]


@pytest.mark.parametrize("name,bad", [("q", np.nan), ("k", np.inf), ("v", -np.inf)])
def test_non_finite_inputs_are_named_with_their_first_index(qkv, name, bad):
    arrays = dict(zip("qkv", (x.copy() for x in qkv), strict=True))
    arrays[name][1, 50, 3] = bad
    arrays[name][1, 60, 0] = bad
    want = rf"{name} has a non-finite value \({bad}\) at index \(1, 50, 3\)"
    with pytest.raises(ValueError, match=want):  # row 50 is not among the evaluated rows: still reported
        attribute(*arrays.values(), "all-bf16", ops=["p"], tiles=(), block_ns=(), trace=False, rows=[0, 1])
    # the kernels emulate what the GPU does with them (NaN propagation), saying so
    with pytest.warns(RuntimeWarning, match=want), np.errstate(all="ignore"):
        flash(*arrays.values(), plan="all-bf16")
    with pytest.warns(RuntimeWarning, match=want), np.errstate(all="ignore"):
        baseline(*arrays.values(), plan="all-bf16")


def test_traced_run_covers_trace_rows_of_the_evaluated_rows(qkv):
    kw = dict(ops=["p"], tiles=(), block_ns=(), block_m=BM, block_n=BN)
    few = attribute(*qkv, "triton-bf16", trace_rows=3, **kw)
    every = attribute(*qkv, "triton-bf16", trace_rows=None, **kw)
    assert few.meta["trace_rows"] == 3 and every.meta["trace_rows"] == qkv[0].shape[-2]
    assert len(few.by_block) and len(every.by_block)
    counts = few.by_block.groupby("op")["max_abs"].max() <= every.by_block.groupby("op")["max_abs"].max()
    assert counts.all()  # a subset of the rows cannot have larger local errors
    assert few.flash_vs_baseline.equals(every.flash_vs_baseline)  # untraced tables: every row, either way
    with pytest.raises(ValueError, match="trace_rows"):
        attribute(*qkv, "triton-bf16", trace_rows=0, **kw)


def test_progress_callback_starts_before_the_first_run(qkv, monkeypatch):
    import simfloat.attribution._runner as core  # where the runs are made

    q, k, v = qkv
    calls, ran = [], []
    real = core._baseline_kernel

    def spy(*args, **kwargs):
        ran.append(list(calls))
        return real(*args, **kwargs)

    monkeypatch.setattr(core, "_baseline_kernel", spy)
    r = attribute(
        q,
        k,
        v,
        "all-bf16",
        block_m=BM,
        block_n=BN,
        ops=["p"],
        tiles=(),
        block_ns=(),
        trace=False,
        progress=lambda done, total: calls.append((done, total)),
    )
    n = r.meta["runs"]
    assert ran[0] == [(0, n)]  # told before the golden run started
    assert [c[0] for c in calls] == list(range(n + 1)) and {c[1] for c in calls} == {n}
    with pytest.raises(TypeError, match="progress"):
        attribute(q, k, v, "all-bf16", tiles=(), block_ns=(), progress="yes")
