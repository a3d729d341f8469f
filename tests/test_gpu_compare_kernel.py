"""Validating a Triton kernel of one's own against a plan (``simfloat_gpu.campaign.validate.compare_kernel``,
docs/guides/validating-your-kernel.md). The kernel here is not the project's: a small flash-attention forward that
multiplies the scores by the scale after the dot, exponentiates with ``tl.exp`` (not exp2 with log2(e) folded into
the scale) and adds the row sums with a separate multiply and add. Under ``faithful()`` it matches the plan that says
so, ``exp_impl="tl.exp"``, bit for bit; the plan with a correctly rounded exp does not reproduce its row sums."""

import math

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

from simfloat.attention import plan  # noqa: E402
from simfloat_gpu.campaign.validate import Config, compare_kernel  # noqa: E402

pytestmark = pytest.mark.triton


@triton.jit
def _exp_flash_kernel(
    Q,
    K,
    V,
    Out,
    M,
    L,
    seq,
    sm_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, HEAD_DIM)
    base = tl.program_id(1) * seq * HEAD_DIM
    q = tl.load(Q + base + rows[:, None] * HEAD_DIM + dims[None, :], mask=rows[:, None] < seq, other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    for start in range(0, seq, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)
        kv = base + keys[:, None] * HEAD_DIM + dims[None, :]
        k = tl.load(K + kv, mask=keys[:, None] < seq, other=0.0)
        v = tl.load(V + kv, mask=keys[:, None] < seq, other=0.0)
        s = tl.dot(q, tl.trans(k)) * sm_scale
        seen = keys[None, :] < seq
        if CAUSAL:
            seen = seen & (keys[None, :] <= rows[:, None])
        s = tl.where(seen, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = tl.dot(p.to(V.dtype.element_ty), v, acc * alpha[:, None])
        m_i = m_new
    o = acc / l_i[:, None]
    tl.store(
        Out + base + rows[:, None] * HEAD_DIM + dims[None, :], o.to(Out.dtype.element_ty), mask=rows[:, None] < seq
    )
    stats = tl.program_id(1) * seq + rows
    tl.store(M + stats, m_i, mask=rows < seq)
    tl.store(L + stats, l_i, mask=rows < seq)


def exp_flash(q, k, v, *, causal, block_m, block_n):
    """The launcher compare_kernel calls: (out, m, l) for (batch, heads, seq, head_dim) tensors."""
    b, h, n, d = q.shape
    o = torch.empty_like(q)
    m = torch.empty((b, h, n), dtype=torch.float32, device=q.device)
    l = torch.empty_like(m)  # noqa: E741
    grid = (triton.cdiv(n, block_m), b * h)
    _exp_flash_kernel[grid](
        q, k, v, o, m, l, n, 1.0 / math.sqrt(d), HEAD_DIM=d, BLOCK_M=block_m, BLOCK_N=block_n, CAUSAL=causal
    )
    return o, m, l


#: the kernel's numerics as a plan: triton-bf16's formats, no exp2 folding, no FMA contraction, tl.exp
TL_EXP = plan("triton-bf16").replace(name="exp-flash-bf16", exp2=False, contract=False, exp_impl="tl.exp")
CONFIGS = [
    Config("flash", "bf16", 97, 16, 32, 16, False, "low"),
    Config("flash", "bf16", 64, 32, 16, 32, True, "low"),
    Config("flash", "bf16", 40, 16, 64, 64, False, "low"),
]


@pytest.fixture(scope="module")
def with_tl_exp():
    return compare_kernel(exp_flash, TL_EXP, CONFIGS, backend="faithful", log=lambda m: None)


def test_a_kernel_using_tl_exp_matches_the_tl_exp_plan_bit_for_bit(with_tl_exp):
    print("\n" + with_tl_exp.table())
    rows = with_tl_exp.rows
    assert len(rows) == len(CONFIGS)
    for r in rows:
        assert r.status == "ok", r.status
        assert (r.bitwise_agreement, r.m_agreement, r.l_agreement) == (1.0, 1.0, 1.0), r.id
    s = with_tl_exp.summary()
    assert s["compared"] == len(CONFIGS) and s["out_min"] == s["m_min"] == s["l_min"] == 1.0
    assert "3 of 3 configs compared against plan exp-flash-bf16" in with_tl_exp.table()


def test_without_the_tl_exp_option_no_plan_reproduces_the_row_sums():
    plain = TL_EXP.replace(exp_impl="correctly_rounded")
    res = compare_kernel(exp_flash, plain, CONFIGS, backend="faithful", log=lambda m: None)
    assert all(r.status == "ok" for r in res.rows)
    s = res.summary()
    assert s["m_min"] == 1.0  # the running max does not go through exp
    assert s["l_mean"] < 0.9, s  # the row sums do: e**x rounded once is not exp2(rn32(x * log2e))


def test_compare_kernel_checks_the_plan_and_configs():
    with pytest.raises(ValueError, match="no flash config"):
        compare_kernel(exp_flash, TL_EXP, [Config("flash", "fp16", 40, 16, 16, 16, False, "low")], backend="faithful")
    with pytest.raises(ValueError, match="exp2=True never calls"):
        plan("triton-bf16").replace(exp_impl="tl.exp")


def test_tl_exp_plans_run_on_the_reference_engine():
    import numpy as np

    import simfloat as sf
    from simfloat.attention import flash

    g = np.random.default_rng(3)
    q, k, v = (sf.round(g.standard_normal((1, 2, 33, 16)), "bf16") for _ in range(3))
    with pytest.raises(ValueError, match="does not model exp_impl='tl.exp'"):
        flash(q, k, v, plan=TL_EXP, block_m=16, block_n=16, engine="vector")
    auto = flash(q, k, v, plan=TL_EXP, block_m=16, block_n=16, return_stats=True)
    ref = flash(q, k, v, plan=TL_EXP, block_m=16, block_n=16, return_stats=True, engine="reference")
    plain = flash(q, k, v, plan=TL_EXP.replace(exp_impl="correctly_rounded"), block_m=16, block_n=16, return_stats=True)
    for a, b in zip(auto, ref, strict=True):
        assert np.array_equal(a, b)
    assert not np.array_equal(auto[2], plain[2])  # the row sums l differ: the option changes the exp
