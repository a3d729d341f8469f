"""Validating a Triton kernel of one's own against a plan (``simfloat_gpu.campaign.validate.compare_kernel``,
docs/guides/validating-your-kernel.md). The kernel here is not the project's: a small flash-attention forward that
multiplies the scores by the scale after the dot, exponentiates with ``tl.exp`` (not exp2 with log2(e) folded into
the scale) and adds the row sums with a separate multiply and add, compiled without fp fusion
(``enable_fp_fusion=False``, so the GPU rounds the multiply and the add separately). Under ``faithful()`` it matches
the plan that says so, ``exp_impl="tl.exp"`` and ``contract=False``, bit for bit; the plan with a correctly rounded
exp does not reproduce its row sums. With fp fusion (Triton's default) the GPU contracts ``l_i * alpha + l_ij`` into
one fma but not the scale (a ``tl.where`` lies between the multiply and the subtraction), which faithful() follows
and no preset plan flag expresses."""

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


def exp_flash(q, k, v, *, causal, block_m, block_n, enable_fp_fusion=False):
    """The launcher compare_kernel calls: (out, m, l) for (batch, heads, seq, head_dim) tensors; compiled without
    fp fusion unless asked."""
    b, h, n, d = q.shape
    o = torch.empty_like(q)
    m = torch.empty((b, h, n), dtype=torch.float32, device=q.device)
    l = torch.empty_like(m)  # noqa: E741
    grid = (triton.cdiv(n, block_m), b * h)
    _exp_flash_kernel[grid](
        q, k, v, o, m, l, n, 1.0 / math.sqrt(d), HEAD_DIM=d, BLOCK_M=block_m, BLOCK_N=block_n, CAUSAL=causal,
        enable_fp_fusion=enable_fp_fusion,
    )  # fmt: skip
    return o, m, l


#: the kernel's numerics as a plan (compiled without fp fusion): triton-bf16's formats, no exp2 folding, no FMA
#: contraction, tl.exp
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


def test_with_fp_fusion_the_row_sum_alone_is_contracted():
    """Triton's default (fp fusion on): ``l_i * alpha + tl.sum(p, 1)`` is one fma (PTX of triton 3.9 for sm_90: two
    fma.rn.f32, the row sums of a thread's two rows); the scale is not, so the scores and m_i keep their bits."""
    from simfloat_gpu.interpreter import faithful

    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(1, 2, 97, 16, generator=g).to(torch.bfloat16) for _ in range(3))
    with faithful():
        fused = exp_flash(q, k, v, causal=False, block_m=32, block_n=16, enable_fp_fusion=True)
        plain = exp_flash(q, k, v, causal=False, block_m=32, block_n=16)
    with faithful(contract=False):
        twice = exp_flash(q, k, v, causal=False, block_m=32, block_n=16, enable_fp_fusion=True)
    assert torch.equal(fused[1], plain[1])  # m_i
    assert not torch.equal(fused[2], plain[2])  # l_i: one rounding per update instead of two
    assert torch.allclose(fused[2], plain[2], rtol=2**-20, atol=0)
    for a, b in zip(twice, plain, strict=True):  # contract=False rounds twice whatever the launch says
        assert torch.equal(a, b)


def test_compare_kernel_checks_the_plan_and_configs():
    with pytest.raises(ValueError, match="no flash config"):
        compare_kernel(exp_flash, TL_EXP, [Config("flash", "fp16", 40, 16, 16, 16, False, "low")], backend="faithful")
    with pytest.raises(ValueError, match="exp2=True never calls"):
        plan("triton-bf16").replace(exp_impl="tl.exp")


def test_tl_exp_plans_run_on_both_engines():
    import numpy as np

    import simfloat as sf
    from simfloat.attention import flash

    g = np.random.default_rng(3)
    q, k, v = (sf.round(g.standard_normal((1, 2, 33, 16)), "bf16") for _ in range(3))
    auto = flash(q, k, v, plan=TL_EXP, block_m=16, block_n=16, return_stats=True)  # the vector engine
    ref = flash(q, k, v, plan=TL_EXP, block_m=16, block_n=16, return_stats=True, engine="reference")
    plain = flash(q, k, v, plan=TL_EXP.replace(exp_impl="correctly_rounded"), block_m=16, block_n=16, return_stats=True)
    for a, b in zip(auto, ref, strict=True):
        assert np.array_equal(a.view(np.uint64), b.view(np.uint64))
    assert not np.array_equal(auto[2], plain[2])  # the row sums l differ: the option changes the exp


# ----------------------------------------------------------------------------------------------------
# a stranger's kernel: crashes, a wrong kernel, a log-sum-exp, grids of whole tiles, assertions
# ----------------------------------------------------------------------------------------------------

TINY = [
    Config("flash", "bf16", 33, 16, 16, 16, False, "low"),
    Config("flash", "bf16", 40, 16, 16, 16, True, "low"),
    Config("flash", "bf16", 48, 16, 16, 16, False, "low"),
]


def crashing_flash(q, k, v, *, causal, block_m, block_n):
    """exp_flash, but the process dies on seq 40 (SIGSEGV, as a store out of bounds may) and seq 48 (exit 3)."""
    import os
    import signal

    if q.shape[2] == 40:
        os.kill(os.getpid(), signal.SIGSEGV)
    if q.shape[2] == 48:
        os._exit(3)
    return exp_flash(q, k, v, causal=causal, block_m=block_m, block_n=block_n)


def test_a_config_whose_process_dies_costs_its_row_only():
    res = compare_kernel(crashing_flash, TL_EXP, TINY, backend="faithful", log=lambda m: None)
    print("\n" + res.table())
    status = [r.status for r in res.rows]
    assert status == ["ok", "crashed: signal SIGSEGV (11)", "crashed: exit code 3"], status
    assert res.rows[0].bitwise_agreement == 1.0 and res.rows[1].bitwise_agreement is None
    s = res.summary()
    assert (s["configs"], s["compared"], s["crashed"], s["errors"]) == (3, 1, 2, 0)
    assert "2 crashed" in res.table()


def _wrong_scale_flash(q, k, v, *, causal, block_m, block_n):
    """exp_flash with the softmax scale 1 instead of 1/sqrt(head_dim)."""
    b, h, n, d = q.shape
    o = torch.empty_like(q)
    m = torch.empty((b, h, n), dtype=torch.float32, device=q.device)
    l = torch.empty_like(m)  # noqa: E741
    _exp_flash_kernel[(triton.cdiv(n, block_m), b * h)](
        q, k, v, o, m, l, n, 1.0, HEAD_DIM=d, BLOCK_M=block_m, BLOCK_N=block_n, CAUSAL=causal, enable_fp_fusion=False
    )
    return o


def unnormalized_flash(q, k, v, *, causal, block_m, block_n):
    """exp_flash's output times l: the 1/l normalization left out."""
    o, m, l = exp_flash(q, k, v, causal=causal, block_m=block_m, block_n=block_n)  # noqa: E741
    return (o.float() * l[..., None]).to(q.dtype)


@pytest.mark.parametrize("launcher", [_wrong_scale_flash, unnormalized_flash])
def test_a_kernel_far_beyond_the_emulators_error_is_kernel_wrong_not_ok(launcher):
    from simfloat_gpu.campaign.user_kernel import KERNEL_WRONG_FACTOR

    res = compare_kernel(launcher, TL_EXP, TINY[:1], backend="faithful", log=lambda m: None)
    (r,) = res.rows
    print("\n" + res.table())
    assert r.status.startswith("kernel-wrong: "), r.status
    assert "the kernel, not the numerics, disagrees" in r.status
    assert r.kernel_err_max > KERNEL_WRONG_FACTOR * r.emulator_err_max
    assert res.summary()["kernel_wrong"] == 1 and res.summary()["out_min"] is None


def lse_flash(q, k, v, *, causal, block_m, block_n):
    """exp_flash returning (out, lse): the natural log-sum-exp fp32(m + fp32(ln l)), as (batch * heads, seq)."""
    o, m, l = exp_flash(q, k, v, causal=causal, block_m=block_m, block_n=block_n)  # noqa: E741
    log_l = torch.log(l.double()).float()  # ln l rounded once to fp32
    return o, (m.double() + log_l.double()).float().reshape(-1, q.shape[2])  # the fp32 add, rounded once


def lse2_flash(q, k, v, *, causal, block_m, block_n):
    """exp_flash returning (out, lse in log2 units), as Triton's tutorial stores it (here from float64)."""
    o, m, l = exp_flash(q, k, v, causal=causal, block_m=block_m, block_n=block_n)  # noqa: E741
    return o, ((m.double() + torch.log(l.double())) / math.log(2.0)).float()


def test_a_kernel_returning_a_log_sum_exp_is_compared_on_it():
    from simfloat_gpu.campaign.user_kernel import LSE_RTOL

    res = compare_kernel(lse_flash, TL_EXP, TINY[:2], backend="faithful", log=lambda m: None)
    print("\n" + res.table())
    for r in res.rows:  # the plan's own form (ln with an exp plan): fp32(m + fp32(ln l)), bit for bit
        assert r.status == "ok" and r.stats == "lse", (r.status, r.stats)
        assert (r.bitwise_agreement, r.lse_agreement, r.lse_max_ulp) == (1.0, 1.0, 0), r.id
        assert r.m_agreement is None and r.l_agreement is None
    assert "lse_agreement" in res.table() and res.summary()["lse_min"] == 1.0
    res2 = compare_kernel(lse2_flash, TL_EXP, TINY[:1], backend="faithful", log=lambda m: None)
    (r,) = res2.rows  # auto: log2 units detected; not the plan's form: within the stated tolerance
    assert r.stats == "lse2" and r.lse_rel_diff <= LSE_RTOL, (r.stats, r.lse_rel_diff)
    # stated: the same numbers read as natural units are far off
    res3 = compare_kernel(lse2_flash, TL_EXP, TINY[:1], backend="faithful", stats="lse", log=lambda m: None)
    assert res3.rows[0].stats == "lse" and res3.rows[0].lse_rel_diff > 0.1
    bad = compare_kernel(lse_flash, TL_EXP, TINY[:1], backend="faithful", stats="ml", log=lambda m: None)
    assert bad.rows[0].status.startswith("error: ValueError: stats='ml'"), bad.rows[0].status
    with pytest.raises(ValueError, match="stats must be one of"):
        compare_kernel(lse_flash, TL_EXP, TINY[:1], backend="faithful", stats="log")


def test_the_tiles_grid_is_whole_tiles_of_common_sizes():
    from simfloat_gpu.campaign.grid import TILE_BLOCKS, TILE_HEAD_DIMS, TILE_SEQS, grid

    cfgs = grid("tiles")
    assert cfgs and all(c.kind == "flash" for c in cfgs)
    for c in cfgs:
        assert c.seq % c.block_m == 0 and c.seq % c.block_n == 0 and c.block_m % c.block_n == 0, c.id
        assert c.head_dim >= 64 and c.head_dim & (c.head_dim - 1) == 0, c.id
    # every value of every dimension at least once
    assert {(c.block_m, c.block_n) for c in cfgs} == set(TILE_BLOCKS)
    assert {c.seq for c in cfgs} == set(TILE_SEQS) and {c.head_dim for c in cfgs} == set(TILE_HEAD_DIMS)
    assert {c.fmt for c in cfgs} == {"bf16", "fp16"} and {c.causal for c in cfgs} == {False, True}
    # the ci grid has ragged tiles (seq 97, 1000): the tiles grid is what a kernel without masks takes
    assert any(c.seq % c.block_m for c in grid("ci", int8=False))


@triton.jit
def _needs_wide_heads(X, HEAD_DIM: tl.constexpr):
    tl.static_assert(HEAD_DIM >= 64)
    x = tl.load(X + tl.arange(0, HEAD_DIM))
    tl.store(X + tl.arange(0, HEAD_DIM), x)


def asserting_flash(q, k, v, *, causal, block_m, block_n):
    """A launcher whose kernel takes head dims of 64 and more only (tl.static_assert)."""
    _needs_wide_heads[(1,)](q, HEAD_DIM=q.shape[-1])
    return exp_flash(q, k, v, causal=causal, block_m=block_m, block_n=block_n)


def test_a_failing_static_assert_names_the_kernels_source_line():
    import inspect

    line = inspect.getsourcelines(_needs_wide_heads.fn)[1] + 2  # @triton.jit, def, then the assert
    res = compare_kernel(asserting_flash, TL_EXP, TINY[:1], backend="faithful", log=lambda m: None)
    status = res.rows[0].status
    assert status.startswith("error: AssertionError at "), status
    assert f"test_gpu_compare_kernel.py:{line} `tl.static_assert(HEAD_DIM >= 64)`" in status, status
    assert "AssertionError('')" not in status
    in_process = compare_kernel(asserting_flash, TL_EXP, TINY[:1], backend="faithful", isolate=False, log=print)
    assert in_process.rows[0].status == status


def tutorial_style_lse(q, k, v, *, causal, block_m, block_n):
    """The project's exp2 kernel returning (out, m + log2 l) as Triton's fused-attention tutorial stores it:
    fp32(m + fp32(log2 l))."""
    from simfloat_gpu.kernels.flash_attention import flash_attention

    o, m, l = flash_attention(q, k, v, causal=causal, block_m=block_m, block_n=block_n, return_stats=True)  # noqa: E741
    return o, (m.double() + torch.log2(l.double()).float().double()).float()


def natural_lse_of_exp2(q, k, v, *, causal, block_m, block_n):
    """The same kernel returning the natural log-sum-exp, (m + log2 l) * ln 2 (a form the plan does not model)."""
    o, lse2 = tutorial_style_lse(q, k, v, causal=causal, block_m=block_m, block_n=block_n)
    return o, (lse2.double() * math.log(2.0)).float()


def test_an_exp2_kernels_log2_lse_is_compared_bit_for_bit_and_its_natural_lse_within_tolerance():
    from simfloat_gpu.campaign.user_kernel import LSE_RTOL

    cfgs = [Config("flash", "bf16", 33, 16, 16, 16, True, "fp32")]
    res = compare_kernel(tutorial_style_lse, plan("triton-bf16"), cfgs, backend="faithful", log=lambda m: None)
    (r,) = res.rows
    assert (r.status, r.stats, r.bitwise_agreement, r.lse_agreement) == ("ok", "lse2", 1.0, 1.0), r
    nat = compare_kernel(natural_lse_of_exp2, plan("triton-bf16"), cfgs, backend="faithful", log=lambda m: None)
    (r,) = nat.rows
    assert r.status == "ok" and r.stats == "lse" and r.lse_rel_diff <= LSE_RTOL, (r.status, r.stats, r.lse_rel_diff)


def test_the_kernel_wrong_rule():
    """Beyond KERNEL_WRONG_FACTOR times the emulator's error (at least the output format's unit roundoff), not
    bitwise equal, or a non-finite error where the emulator's is finite: kernel-wrong; else the status stays."""
    import dataclasses

    from simfloat_gpu.campaign.compare import new_record
    from simfloat_gpu.campaign.records import KernelRecord
    from simfloat_gpu.campaign.user_kernel import KERNEL_WRONG_FACTOR, _kernel_wrong

    cfg = TINY[0]  # bf16 output: unit roundoff 2**-8
    base = KernelRecord(**dataclasses.asdict(new_record(cfg, "faithful")))

    def status(kerr, eerr, agree=0.5):
        rec = dataclasses.replace(base, kernel_err_max=kerr, emulator_err_max=eerr, bitwise_agreement=agree)
        return _kernel_wrong(rec, cfg)

    assert status(KERNEL_WRONG_FACTOR * 0.01, 0.01) == ""  # at the limit
    assert status(KERNEL_WRONG_FACTOR * 0.01 * 1.01, 0.01).startswith("kernel-wrong: ")
    assert status(1.57, 5e-4).startswith("kernel-wrong: ")  # the case: 1.57 vs 5e-4
    assert status(1.57, 5e-4, agree=1.0) == ""  # bitwise equal: the plan is what the kernel computes
    assert status(KERNEL_WRONG_FACTOR * 2.0**-8, 0.0) == ""  # the floor: one unit roundoff of bf16
    assert "non-finite" in status(float("nan"), 0.01)


def test_a_launcher_a_child_cannot_import_is_refused_clearly():
    def local(q, k, v, *, causal, block_m, block_n):
        return exp_flash(q, k, v, causal=causal, block_m=block_m, block_n=block_n)

    with pytest.raises(ValueError, match="does not pickle.*isolate=False"):
        compare_kernel(local, TL_EXP, TINY[:1], backend="faithful")
    with pytest.raises(ValueError, match="isolate must be"):
        compare_kernel(exp_flash, TL_EXP, TINY[:1], backend="faithful", isolate="thread")
    res = compare_kernel(local, TL_EXP, TINY[:1], backend="faithful", isolate=False, log=lambda m: None)
    assert res.rows[0].status == "ok" and res.rows[0].bitwise_agreement == 1.0


def sleeping_flash(q, k, v, *, causal, block_m, block_n):
    """exp_flash, but it hangs on seq 40."""
    import time

    if q.shape[2] == 40:
        time.sleep(60)
    return exp_flash(q, k, v, causal=causal, block_m=block_m, block_n=block_n)


def test_a_kernel_that_hangs_past_the_time_limit_costs_its_row():
    cfgs = [TINY[1], TINY[0]]  # the one that hangs first: the child process server's start counts against it
    res = compare_kernel(sleeping_flash, TL_EXP, cfgs, backend="faithful", timeout_s=15, log=lambda m: None)
    assert [r.status for r in res.rows] == ["timeout: killed after 15 s", "ok"]
    assert res.summary()["timeouts"] == 1 and "1 timeouts" in res.table()
