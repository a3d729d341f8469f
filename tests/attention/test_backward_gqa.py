"""Grouped-query and multi-query attention in the backward pass (step G1 of simfloat.attention.backward): the
vector engine against the scalar reference bit for bit, the fp64 plan against torch's float64 autograd of k and
v repeated per query head, the one-accumulator order against an equal-heads run on concatenated queries (bitwise)
and against the sum of per-head runs (close, not bitwise), the baseline, argument errors, tracing, and the Triton
kernels under the faithful interpreter against the emulator bit for bit."""

import math
import os

os.environ["TRITON_INTERPRET"] = "1"

import numba  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import simfloat as sf  # noqa: E402
from simfloat.attention import baseline_backward, flash, flash_backward, lse_from_stats  # noqa: E402

torch = pytest.importorskip("torch")


def _inputs(batch, heads, kv_heads, seq, d, seed, fmt=None):
    rng = np.random.default_rng(seed)
    q, do = (rng.standard_normal((batch, heads, seq, d)) for _ in range(2))
    k, v = (rng.standard_normal((batch, kv_heads, seq, d)) for _ in range(2))
    if fmt is not None:
        q, k, v, do = (sf.round(x, fmt) for x in (q, k, v, do))
    return q, k, v, do


def _forward(q, k, v, plan, bm, bn, causal):
    """o and the backward plan's lse from the matching forward plan (the forward maps the kv heads itself)."""
    fwd = "fp64" if plan == "fp64" else plan
    o, m, l = flash(q, k, v, plan=fwd, block_m=bm, block_n=bn, causal=causal, return_stats=True)  # noqa: E741
    return o, lse_from_stats(m, l, plan=plan)


def _torch_grads_gqa(q, k, v, do, causal):
    """float64 autograd with k, v repeated per query head (repeat_interleave): their gradients are the sums."""
    g = q.shape[1] // k.shape[1]
    qq, kk, vv = (torch.tensor(x, dtype=torch.float64, requires_grad=True) for x in (q, k, v))
    kr, vr = kk.repeat_interleave(g, dim=1), vv.repeat_interleave(g, dim=1)
    s = (qq @ kr.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), -math.inf)
    (torch.softmax(s, -1) @ vr).backward(torch.tensor(do, dtype=torch.float64))
    return tuple(t.grad.numpy() for t in (qq, kk, vv))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads, kv_heads", [(4, 2), (4, 1)])
@pytest.mark.parametrize("plan", ["triton-bf16", "fp64"])
def test_vector_engine_equals_reference_bitwise(plan, heads, kv_heads, causal):
    fmt = "bf16" if plan != "fp64" else None
    q, k, v, do = _inputs(2, heads, kv_heads, 97, 16, seed=heads + kv_heads, fmt=fmt)
    o, lse = _forward(q, k, v, plan, 32, 16, causal)
    kw = dict(plan=plan, block_m=32, block_n=16, causal=causal, return_delta=True)
    ref = flash_backward(q, k, v, o, do, lse, engine="reference", **kw)
    assert ref[1].shape == k.shape and ref[2].shape == v.shape and ref[0].shape == q.shape
    old = numba.get_num_threads()
    try:
        for threads in (1, min(2, numba.config.NUMBA_NUM_THREADS)):
            numba.set_num_threads(threads)
            got = flash_backward(q, k, v, o, do, lse, engine="vector", **kw)
            for label, g, r in zip(("dq", "dk", "dv", "delta"), got, ref, strict=True):
                assert np.array_equal(g, r), (label, threads, int(np.sum(g != r)))
    finally:
        numba.set_num_threads(old)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads, kv_heads", [(4, 2), (4, 1)])
def test_fp64_plan_matches_torch_autograd_of_repeated_kv(heads, kv_heads, causal):
    q, k, v, do = _inputs(1, heads, kv_heads, 97, 16, seed=7)
    o, lse = _forward(q, k, v, "fp64", 32, 16, causal)
    got = flash_backward(q, k, v, o, do, lse, plan="fp64", block_m=32, block_n=16, causal=causal)
    want = _torch_grads_gqa(q, k, v, do, causal)
    for name, g, w in zip(("dq", "dk", "dv"), got, want, strict=True):
        assert g.shape == w.shape
        err = np.abs(g - w).max() / np.abs(w).max()
        assert err <= 1e-12, (name, err)
    base = baseline_backward(q, k, v, do, plan="fp64", causal=causal)
    for name, g, w in zip(("dq", "dk", "dv"), base, want, strict=True):
        assert g.shape == w.shape
        assert np.abs(g - w).max() <= 1e-12 * np.abs(w).max(), name


@pytest.mark.parametrize("plan", ["triton-bf16", "fp64"])
@pytest.mark.parametrize("heads, kv_heads", [(4, 2), (4, 1)])
def test_group_order_equals_an_equal_heads_run_on_concatenated_queries(plan, heads, kv_heads):
    """G1 is one accumulator over the group's query heads, each over its query tiles. Without a mask and with
    seq_q a multiple of block_m, that is exactly the key tile's walk over the query tiles of one head whose
    queries are the group's queries one after the other: dK and dV are bitwise equal, and so is every dQ row."""
    fmt = "bf16" if plan != "fp64" else None
    seq, bm, bn, g = 64, 32, 16, heads // kv_heads
    q, k, v, do = _inputs(1, heads, kv_heads, seq, 16, seed=3, fmt=fmt)
    o, lse = _forward(q, k, v, plan, bm, bn, False)
    dq, dk, dv = flash_backward(q, k, v, o, do, lse, plan=plan, block_m=bm, block_n=bn)

    def cat(x):  # (1, heads, S, D) -> (1, kv_heads, g * S, D): the group's rows one head after the other
        return x.reshape((1, kv_heads, g * x.shape[2]) + x.shape[3:])

    dq2, dk2, dv2 = flash_backward(cat(q), k, v, cat(o), cat(do), cat(lse), plan=plan, block_m=bm, block_n=bn)
    assert np.array_equal(dk, dk2) and np.array_equal(dv, dv2)
    assert np.array_equal(cat(dq), dq2)


def test_group_sum_is_not_the_sum_of_per_head_gradients():
    """The kernel keeps one fp32 accumulator over the group and rounds (E1, E2) once; the sum of per-head runs
    (each with its own accumulator, scale multiply and cast) is another computation: in float64 the two agree to
    rounding, under triton-bf16 they differ in the last bits of many entries."""
    for plan, fmt in (("fp64", None), ("triton-bf16", "bf16")):
        q, k, v, do = _inputs(1, 4, 2, 97, 16, seed=11, fmt=fmt)
        o, lse = _forward(q, k, v, plan, 32, 32, True)
        kw = dict(plan=plan, block_m=32, block_n=32, causal=True)
        _, dk, dv = flash_backward(q, k, v, o, do, lse, **kw)
        kr, vr = np.repeat(k, 2, axis=1), np.repeat(v, 2, axis=1)
        _, dkh, dvh = flash_backward(q, kr, vr, o, do, lse, **kw)  # per query head
        dks, dvs = (x.reshape(1, 2, 2, 97, 16).sum(axis=2) for x in (dkh, dvh))
        if plan == "fp64":
            for a, b in ((dk, dks), (dv, dvs)):
                assert np.abs(a - b).max() <= 1e-13 * np.abs(b).max()
        else:
            dks, dvs = (sf.round(x, "bf16") for x in (dks, dvs))
            assert not np.array_equal(dk, dks) and not np.array_equal(dv, dvs)
            assert np.abs(dk - dks).max() <= 0.02 * np.abs(dks).max()


def test_baseline_sums_the_group_in_the_delta_format():
    q, k, v, do = _inputs(1, 4, 2, 33, 16, seed=5, fmt="bf16")
    dq, dk, dv = baseline_backward(q, k, v, do, plan="pytorch-bf16", causal=True)
    kr, vr = np.repeat(k, 2, axis=1), np.repeat(v, 2, axis=1)
    dqh, dkh, dvh = baseline_backward(q, kr, vr, do, plan="pytorch-bf16", causal=True)
    assert np.array_equal(dq, dqh)
    for got, per_head in ((dk, dkh), (dv, dvh)):  # fp32 sum of the two bf16 per-head gradients, one bf16 cast
        pairs = per_head.reshape(1, 2, 2, 33, 16).astype(np.float32)
        want = sf.round((pairs[:, :, 0] + pairs[:, :, 1]).astype(np.float64), "bf16")
        assert np.array_equal(got, want)


def test_bad_head_counts_name_the_argument():
    q, k, v, do = _inputs(1, 4, 2, 16, 8, seed=0)
    o, lse = _forward(q, k, v, "fp64", 16, 16, False)
    kw = dict(plan="fp64", block_m=16, block_n=16)
    k3, v3 = _inputs(1, 4, 3, 16, 8, seed=1)[1:3]
    with pytest.raises(ValueError, match="q has 4 heads and k has 3"):
        flash_backward(q, k3, v3, o, do, lse, **kw)
    with pytest.raises(ValueError, match="q has 4 heads and v has 3"):
        flash_backward(q, k, v3, o, do, lse, **kw)
    with pytest.raises(ValueError, match="k has leading dims"):
        flash_backward(q, k[None], v, o, do, lse, **kw)
    with pytest.raises(ValueError, match="k has leading dims"):
        flash_backward(q, np.concatenate([k, k]), v, o, do, lse, **kw)
    with pytest.raises(ValueError, match="k and v must have the same leading dims"):
        flash_backward(q, k, v[:, :1], o, do, lse, **kw)
    with pytest.raises(ValueError, match="q has 4 heads and k has 3"):
        baseline_backward(q, k3, v3, do, plan="fp64")
    with pytest.raises(ValueError, match="q has 2 heads and k has 4"):
        flash_backward(q[:, :2], _inputs(1, 4, 4, 16, 8, 0)[1], v, o[:, :2], do[:, :2], lse[:, :2], **kw)


def test_traced_gqa_run_returns_the_untraced_bits():
    from simfloat.trace import Tracer

    pytest.importorskip("pandas")
    q, k, v, do = _inputs(1, 4, 1, 37, 8, seed=2, fmt="bf16")
    o, lse = _forward(q, k, v, "triton-bf16", 16, 16, True)
    kw = dict(plan="triton-bf16", block_m=16, block_n=16, causal=True, return_delta=True)
    want = flash_backward(q, k, v, o, do, lse, **kw)
    tr = Tracer()
    got = flash_backward(q, k, v, o, do, lse, trace=tr, **kw)
    for a, b in zip(want, got, strict=True):
        assert np.array_equal(a, b)
    assert len(tr.local_errors()) > 0


# -- the Triton kernels ------------------------------------------------------------------------------------------

triton = pytest.importorskip("triton")
from simfloat_gpu.interpreter import faithful  # noqa: E402
from simfloat_gpu.kernels.flash_attention import flash_attention  # noqa: E402
from simfloat_gpu.kernels.flash_attention_bwd import flash_attention_backward  # noqa: E402

_TORCH = {"bf16": torch.bfloat16, "fp16": torch.float16}


@pytest.mark.triton
@pytest.mark.parametrize(
    "fmt, heads, kv_heads, seq, causal, bm, bn",
    [("bf16", 4, 2, 64, False, 32, 16), ("fp16", 4, 1, 97, True, 16, 32)],
)
def test_kernel_under_faithful_equals_emulator_bit_for_bit(fmt, heads, kv_heads, seq, causal, bm, bn):
    q, k, v, do = _inputs(1, heads, kv_heads, seq, 32, seed=seq, fmt=fmt)
    tq, tk, tv, tdo = (torch.tensor(x, dtype=torch.float32).to(_TORCH[fmt]) for x in (q, k, v, do))
    with faithful():
        o, m, l = flash_attention(tq, tk, tv, causal=causal, block_m=bm, block_n=bn, return_stats=True)  # noqa: E741
        dq, dk, dv, delta, lse = flash_attention_backward(
            tq, tk, tv, o, tdo, m, l, causal=causal, block_m=bm, block_n=bn, return_stats=True
        )
    assert tuple(dk.shape) == k.shape and tuple(dv.shape) == v.shape
    plan = f"triton-{fmt}"
    lse_e = lse_from_stats(m.double().numpy(), l.double().numpy(), plan=plan)
    assert np.array_equal(lse_e, lse.double().numpy())
    on = o.float().double().numpy()
    got = flash_backward(q, k, v, on, do, lse_e, plan=plan, block_m=bm, block_n=bn, causal=causal, return_delta=True)
    for name, g, w in zip(("dq", "dk", "dv", "delta"), got, (dq, dk, dv, delta), strict=True):
        w = w.float().double().numpy()
        assert np.array_equal(g, w), (name, int(np.sum(g != w)), float(np.abs(g - w).max()))


@pytest.mark.triton
def test_kernel_rejects_head_counts_that_do_not_divide():
    q, o, do = (torch.zeros(1, 4, 16, 16) for _ in range(3))
    k, v = torch.zeros(1, 3, 16, 16), torch.zeros(1, 3, 16, 16)
    m, l = torch.zeros(1, 4, 16), torch.ones(1, 4, 16)  # noqa: E741
    with pytest.raises(ValueError, match="q has 4 heads and k has 3"):
        flash_attention_backward(q, k, v, o, do, m, l)
