"""The attention backward pass: the emulator (simfloat.attention.flash_backward) against torch's float64 autograd
and, bit for bit, against the Triton backward kernels (simfloat_gpu/kernels/flash_attention_bwd.py) under the faithful
interpreter; the kernels against torch autograd; argument errors."""

import math
import os

os.environ["TRITON_INTERPRET"] = "1"

import numba  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import simfloat as sf  # noqa: E402
from simfloat.attention import (  # noqa: E402
    BackwardPlan,
    backward_plan,
    backward_presets,
    baseline_backward,
    flash,
    flash_backward,
    lse_from_stats,
)

torch = pytest.importorskip("torch")


def _torch_grads(q, k, v, do, causal, scale=None, dtype=torch.float64):
    """(dq, dk, dv) of softmax(scale q k^T) v by torch autograd in ``dtype``."""
    qq, kk, vv = (torch.tensor(x, dtype=dtype, requires_grad=True) for x in (q, k, v))
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = (qq @ kk.transpose(-1, -2)) * scale
    if causal:
        mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).triu(1)
        s = s.masked_fill(mask, -math.inf)
    (torch.softmax(s, -1) @ vv).backward(torch.tensor(do, dtype=dtype))
    return tuple(t.grad.double().numpy() for t in (qq, kk, vv))


def _inputs(lead, seq_q, seq_k, d, seed=0, fmt=None):
    rng = np.random.default_rng(seed)
    q, do = rng.standard_normal(lead + (seq_q, d)), rng.standard_normal(lead + (seq_q, d))
    k, v = rng.standard_normal(lead + (seq_k, d)), rng.standard_normal(lead + (seq_k, d))
    if fmt is not None:
        q, k, v, do = (sf.round(x, fmt) for x in (q, k, v, do))
    return q, k, v, do


def _emulate(q, k, v, do, plan, bm, bn, causal):
    o, m, l = flash(  # noqa: E741
        q,
        k,
        v,
        plan="fp64" if plan == "fp64" else f"triton-{plan.split('-')[1]}",
        block_m=bm,
        block_n=bn,
        causal=causal,
        return_stats=True,
    )
    lse = lse_from_stats(m, l, plan=plan)
    return flash_backward(q, k, v, o, do, lse, plan=plan, block_m=bm, block_n=bn, causal=causal)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    "seq_q, seq_k, d, bm, bn", [(97, 97, 32, 32, 16), (1, 5, 16, 16, 16), (64, 257, 8, 48, 64), (257, 257, 16, 64, 32)]
)
def test_fp64_plan_matches_torch_float64_autograd(seq_q, seq_k, d, bm, bn, causal):
    q, k, v, do = _inputs((2,), seq_q, seq_k, d, seed=seq_q)
    got = _emulate(q, k, v, do, "fp64", bm, bn, causal)
    want = _torch_grads(q, k, v, do, causal)
    for name, g, w in zip(("dq", "dk", "dv"), got, want, strict=True):
        assert g.shape == w.shape
        ref = np.abs(w).max() if np.abs(w).max() > 0 else 1.0  # one query, one visible key: dq = 0
        err = np.abs(g - w).max() / ref
        assert err <= 1e-12, (name, err)


def test_thread_count_changes_no_bits_and_bf16_gradients_are_close():
    q, k, v, do = _inputs((3,), 97, 97, 16, seed=5, fmt="bf16")
    o, m, l = flash(q, k, v, plan="triton-bf16", block_m=32, block_n=32, return_stats=True)  # noqa: E741
    lse = lse_from_stats(m, l, plan="triton-bf16")
    old = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = flash_backward(q, k, v, o, do, lse, plan="triton-bf16", block_m=32, block_n=16, return_delta=True)
        numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
        two = flash_backward(q, k, v, o, do, lse, plan="triton-bf16", block_m=32, block_n=16, return_delta=True)
    finally:
        numba.set_num_threads(old)
    for a, b in zip(one, two, strict=True):
        assert np.array_equal(a, b)
    # every gradient is a bf16 value, and close to the float64 gradients
    want = _torch_grads(q, k, v, do, False)
    for g, w in zip(one[:3], want, strict=True):
        assert np.array_equal(sf.round(g, "bf16"), g)
        assert np.abs(g - w).max() <= 0.05 * np.abs(w).max()


def _adversarial(lead, seq_q, seq_k, d, kind, fmt):
    """Inputs that stress the backward: ``ties`` (every key of a block equal: tied row maxima, P exactly 1 at
    several keys, one-signed V), ``range`` (rows scaled over 2**+-12), else plain normal."""
    q, k, v, do = _inputs(lead, seq_q, seq_k, d, seed=seq_q + seq_k, fmt=None)
    if kind == "ties":
        k[..., : seq_k // 2 + 1, :] = k[..., :1, :]
        v = np.abs(v) + 0.5
    elif kind == "range":
        rng = np.random.default_rng(1)
        q = q * 2.0 ** rng.integers(-12, 4, size=q.shape[:-1] + (1,))
        do = do * 2.0 ** rng.integers(-12, 12, size=do.shape[:-1] + (1,))
    return tuple(sf.round(x, fmt) for x in (q, k, v, do))


_ODD = backward_plan("triton-bf16").replace(
    name="odd-modes",
    scale=("float32", "toward_zero"),
    p=("bfloat16", "odd"),
    ds=("float32", "up"),
    delta=("float64", "toward_zero"),
    grad=("float16", "down"),
    ds_cast=("e6m9", "nearest_away"),
)
_FORWARD = {
    "triton-bf16": "triton-bf16",
    "triton-fp16": "triton-fp16",
    "all-bf16": "all-bf16",
    "fp64": "fp64",
    "triton-tf32": "triton-tf32",
    "h200-bf16": "h200-bf16",
    "odd-modes": "triton-bf16",
}


@pytest.mark.parametrize(
    "plan, seq_q, seq_k, bm, bn, causal, kind",
    [
        ("triton-bf16", 97, 97, 32, 16, True, "ties"),
        ("triton-bf16", 257, 97, 64, 64, False, "range"),
        ("triton-fp16", 1, 1, 16, 16, True, "plain"),
        ("triton-fp16", 97, 257, 24, 40, True, "range"),
        ("all-bf16", 97, 97, 16, 32, False, "ties"),
        ("fp64", 257, 257, 48, 32, True, "plain"),
        ("triton-tf32", 97, 97, 32, 32, False, "plain"),
        ("h200-bf16", 97, 97, 32, 32, True, "plain"),
        (_ODD, 97, 97, 32, 16, True, "range"),
    ],
)
def test_vector_engine_equals_scalar_reference_bit_for_bit(plan, seq_q, seq_k, bm, bn, causal, kind):
    name = plan if isinstance(plan, str) else plan.name
    fmt = {"bf16": "bf16", "fp16": "fp16"}.get(name.split("-")[-1], "float32" if name != "fp64" else "float64")
    if name == "odd-modes":
        fmt = "bf16"
    q, k, v, do = _adversarial((2,), seq_q, seq_k, 16, kind, fmt)
    o, m, l = flash(q, k, v, plan=_FORWARD[name], block_m=bm, block_n=bn, causal=causal, return_stats=True)  # noqa: E741
    lse = lse_from_stats(m, l, plan=plan)
    kw = dict(plan=plan, block_m=bm, block_n=bn, causal=causal, return_delta=True)
    ref = flash_backward(q, k, v, o, do, lse, engine="reference", **kw)
    old = numba.get_num_threads()
    try:
        for threads in (1, min(2, numba.config.NUMBA_NUM_THREADS)):
            numba.set_num_threads(threads)
            got = flash_backward(q, k, v, o, do, lse, engine="vector", **kw)
            for label, g, r in zip(("dq", "dk", "dv", "delta"), got, ref, strict=True):
                assert np.array_equal(g, r), (label, threads, int(np.sum(g != r)))
    finally:
        numba.set_num_threads(old)


def test_presets_and_plan_entries():
    names = set(backward_presets())
    for fam in ("fp64", "all-bf16", "triton-bf16", "triton-fp16", "triton-fp32", "h200-bf16", "pytorch-bf16"):
        assert fam in names
    pl = backward_plan("triton-bf16")
    assert pl.ds_cast.fmt.name == "bfloat16" and pl.grad.fmt.name == "bfloat16" and pl.exp2 and pl.contract
    ablated = pl.replace(ds_cast="float32")
    assert ablated.ds_cast.fmt.name == "float32" and ablated.name == "triton-bf16*"
    with pytest.raises(ValueError, match="unknown backward plan entries"):
        pl.replace(pv="float32")
    with pytest.raises(ValueError, match="unknown backward plan"):
        backward_plan("triton-int3")
    assert isinstance(backward_plan(ablated), BackwardPlan)


def test_ablating_the_ds_cast_shrinks_the_bf16_gradient_error():
    q, k, v, do = _inputs((2,), 97, 97, 32, seed=3, fmt="bf16")
    want = _torch_grads(q, k, v, do, True)
    o, m, l = flash(q, k, v, plan="triton-bf16", block_m=32, block_n=32, causal=True, return_stats=True)  # noqa: E741
    lse = lse_from_stats(m, l, plan="triton-bf16")
    full = backward_plan("triton-bf16").replace(grad="float32")
    errs = {}
    for name, pl in (("ds bf16", full), ("ds fp32", full.replace(ds_cast="float32"))):
        dq, _, _ = flash_backward(q, k, v, o, do, lse, plan=pl, block_m=32, block_n=32, causal=True)
        errs[name] = np.abs(dq - want[0]).max()
    assert errs["ds fp32"] < errs["ds bf16"]


def test_baseline_backward_fp64_and_bf16():
    q, k, v, do = _inputs((2,), 33, 40, 16, seed=9)
    want = _torch_grads(q, k, v, do, False)
    got = baseline_backward(q, k, v, do, plan="fp64")
    for g, w in zip(got, want, strict=True):
        assert np.abs(g - w).max() <= 1e-12 * np.abs(w).max()
    qb, kb, vb, dob = (sf.round(x, "bf16") for x in (q, k, v, do))
    got = baseline_backward(qb, kb, vb, dob, plan="pytorch-bf16", causal=True)
    want = _torch_grads(qb, kb, vb, dob, True)
    for g, w in zip(got, want, strict=True):
        assert np.array_equal(sf.round(g, "bf16"), g)
        assert np.abs(g - w).max() <= 0.05 * np.abs(w).max()


def test_bad_inputs_name_the_argument():
    q, k, v, do = _inputs((2,), 16, 16, 8)
    o, m, l = flash(q, k, v, plan="triton-fp32", block_m=16, block_n=16, return_stats=True)  # noqa: E741
    lse = lse_from_stats(m, l, plan="triton-fp32")
    kw = dict(plan="triton-fp32", block_m=16, block_n=16)
    with pytest.raises(ValueError, match="do must have shape"):
        flash_backward(q, k, v, o, do[:, :8], lse, **kw)
    with pytest.raises(ValueError, match="lse must have shape"):
        flash_backward(q, k, v, o, do, lse[:, :3], **kw)
    with pytest.raises(ValueError, match="o has leading dims"):
        flash_backward(q, k, v, o[:1], do, lse, **kw)
    with pytest.raises(TypeError, match="do must have dtype"):
        flash_backward(q, k, v, o, do.astype(np.int32), lse, **kw)
    with pytest.raises(TypeError, match="lse must be a numpy array"):
        flash_backward(q, k, v, o, do, list(lse), **kw)
    with pytest.raises(ValueError, match="k and v sequence lengths differ"):
        flash_backward(q, k, v[:, :5], o, do, lse, **kw)
    # the lse of another plan (natural-log units from the fp64 forward) or of other inputs
    o64, m64, l64 = flash(q, k, v, plan="fp64", return_stats=True)
    with pytest.raises(ValueError, match="lse does not belong"):
        flash_backward(q, k, v, o, do, lse_from_stats(m64, l64, plan="fp64"), **kw)
    with pytest.raises(ValueError, match="lse does not belong"):
        flash_backward(q, k, v, o, do, lse - 3.0, **kw)
    with pytest.raises(ValueError, match="l must be > 0"):
        lse_from_stats(m, np.zeros_like(l), plan="triton-fp32")


# -- the Triton kernels ------------------------------------------------------------------------------------------

triton = pytest.importorskip("triton")
from simfloat_gpu.interpreter import faithful  # noqa: E402
from simfloat_gpu.kernels.flash_attention import flash_attention  # noqa: E402
from simfloat_gpu.kernels.flash_attention_bwd import flash_attention_backward, flash_attention_grad  # noqa: E402

_TORCH = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@pytest.mark.triton
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seq, d, bm, bn", [(97, 32, 32, 16), (64, 16, 16, 32)])
def test_kernel_autograd_matches_torch_float64(seq, d, bm, bn, causal):
    q, k, v, do = _inputs((1, 2), seq, seq, d, seed=seq + d)
    want = _torch_grads(q, k, v, do, causal)
    qq, kk, vv = (torch.tensor(x, dtype=torch.float32, requires_grad=True) for x in (q, k, v))
    out = flash_attention_grad(qq, kk, vv, causal=causal, block_m=bm, block_n=bn, bwd_block_m=bm, bwd_block_n=bn)
    out.backward(torch.tensor(do, dtype=torch.float32))
    for t, w in zip((qq, kk, vv), want, strict=True):
        err = np.abs(t.grad.double().numpy() - w).max() / np.abs(w).max()
        assert err < 1e-5


@pytest.mark.triton
def test_kernel_rejects_bad_arguments():
    q, k, v = (torch.zeros(1, 1, 16, 16) for _ in range(3))
    m, l = torch.zeros(1, 1, 16), torch.ones(1, 1, 16)  # noqa: E741
    with pytest.raises(ValueError, match="do must have q's shape"):
        flash_attention_backward(q, k, v, q, torch.zeros(1, 1, 8, 16), m, l)
    with pytest.raises(TypeError, match="do has dtype"):
        flash_attention_backward(q, k, v, q, q.half(), m, l)
    with pytest.raises(ValueError, match="l must have shape"):
        flash_attention_backward(q, k, v, q, q, m, l[..., :4])
    with pytest.raises(TypeError, match="m must be float32"):
        flash_attention_backward(q, k, v, q, q, m.double(), l)


@pytest.mark.triton
@pytest.mark.parametrize(
    "fmt, seq, causal, bm, bn",
    [("bf16", 64, False, 32, 16), ("bf16", 97, True, 16, 32), ("fp16", 97, False, 32, 32), ("fp16", 64, True, 16, 16)],
)
def test_kernel_under_faithful_equals_emulator_bit_for_bit(fmt, seq, causal, bm, bn):
    d = 32
    q, k, v, do = _inputs((1, 2), seq, seq, d, seed=seq, fmt=fmt)
    dt = _TORCH[fmt]
    tq, tk, tv, tdo = (torch.tensor(x, dtype=torch.float32).to(dt) for x in (q, k, v, do))
    with faithful():
        o, m, l = flash_attention(tq, tk, tv, causal=causal, block_m=bm, block_n=bn, return_stats=True)  # noqa: E741
        dq, dk, dv, delta, lse = flash_attention_backward(
            tq, tk, tv, o, tdo, m, l, causal=causal, block_m=bm, block_n=bn, return_stats=True
        )
    on, mn, ln = o.float().double().numpy(), m.double().numpy(), l.double().numpy()
    plan = f"triton-{fmt}"
    lse_e = lse_from_stats(mn, ln, plan=plan)
    assert np.array_equal(lse_e, lse.double().numpy())
    got = flash_backward(q, k, v, on, do, lse_e, plan=plan, block_m=bm, block_n=bn, causal=causal, return_delta=True)
    for name, g, w in zip(("dq", "dk", "dv", "delta"), got, (dq, dk, dv, delta), strict=True):
        w = w.float().double().numpy()
        assert np.array_equal(g, w), (name, int(np.sum(g != w)), float(np.abs(g - w).max()))
