"""The Triton tutorial's backward (``python/tutorials/06-fused-attention.py``: ``_attn_bwd_preprocess`` and
``_attn_bwd``, causal) against the ``triton-tutorial-fp16`` backward preset under the faithful interpreter: a
re-implementation of its dataflow (written here from the kernel's description, not copied; boundary masks added
so that sequence lengths need not be tile multiples) run by the faithful interpreter on the CPU, bit for bit with
flash_backward's dq, dk, dv and delta on both engines, and the closest earlier backward plans agreeing less.

The dataflow: the host pre-scales K, ``k' = fp16(k * (sm_scale / ln 2))``. One program per key tile of BLOCK_N1
keys computes dK, dV over its rows, first the diagonal rows in steps of BLOCK_M1 / 2 (masked), then the rest
in steps of BLOCK_M1: ``qkT = k' q^T``, ``pT = exp2(qkT - M)``, ``dv += fp16(pT) do``, ``dpT = v do^T``, ``dsT =
fp16(pT * (dpT - D))``, ``dk += dsT q``; ``dk * sm_scale`` on store. The same program computes dQ of query tile
pid (BLOCK_M2 rows): first its diagonal keys in steps of BLOCK_N2 / 2 (masked), then the keys before it from 0
in steps of BLOCK_N2: ``dq += fp16(p * (dp - D)) k'``; ``dq * ln 2`` on store. The GPU's Triton folds ``acc +=
tl.dot(a, b)`` into the dot's accumulator; the kernel below writes the folded form ``tl.dot(a, b, acc)``."""

import numpy as np
import pytest
from triton_kernels import faithful, tl, torch, triton  # the interpreter's set-up (skips without torch, triton)

from simfloat.attention import backward_plan, flash, flash_backward, lse_from_stats

pytestmark = pytest.mark.triton


@triton.jit
def _delta_kernel(Out, DO, Delta, seq, HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr):
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    at = tl.program_id(1) * seq * HEAD_DIM + rows[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :]
    o = tl.load(Out + at, mask=rows[:, None] < seq, other=0.0)
    do = tl.load(DO + at, mask=rows[:, None] < seq, other=0.0).to(tl.float32)
    tl.store(Delta + tl.program_id(1) * seq + rows, tl.sum(o * do, axis=1), mask=rows < seq)


@triton.jit
def _dkdv_rows(dk, dv, Q, DO, M, D, k, v, keys, start_m, base, stat, seq,
               HEAD_DIM: tl.constexpr, ROWS: tl.constexpr, MASK: tl.constexpr):  # fmt: skip
    # one step of the dK/dV loop over ROWS query rows from start_m
    rows = start_m + tl.arange(0, ROWS)
    dims = tl.arange(0, HEAD_DIM)
    inside = rows < seq
    q_t = tl.load(Q + base + rows[None, :] * HEAD_DIM + dims[:, None], mask=inside[None, :], other=0.0)
    m = tl.load(M + stat + rows, mask=inside, other=0.0)
    qk_t = tl.dot(k, q_t)
    p_t = tl.math.exp2(qk_t - m[None, :])
    keep = inside[None, :] & (keys[:, None] < seq)
    if MASK:
        keep = keep & (rows[None, :] >= keys[:, None])
    p_t = tl.where(keep, p_t, 0.0)
    do = tl.load(DO + base + rows[:, None] * HEAD_DIM + dims[None, :], mask=inside[:, None], other=0.0)
    dv = tl.dot(p_t.to(tl.float16), do, dv)
    d_i = tl.load(D + stat + rows, mask=inside, other=0.0)
    dp_t = tl.dot(v, tl.trans(do))
    ds_t = (p_t * (dp_t - d_i[None, :])).to(tl.float16)
    dk = tl.dot(ds_t, tl.trans(q_t), dk)
    return dk, dv


@triton.jit
def _dq_keys(dq, q, do, m, d_i, rows, K, V, start_n, base, seq,
             HEAD_DIM: tl.constexpr, KEYS: tl.constexpr, MASK: tl.constexpr):  # fmt: skip
    # one step of the dQ loop over KEYS keys from start_n
    keys = start_n + tl.arange(0, KEYS)
    dims = tl.arange(0, HEAD_DIM)
    k_t = tl.load(K + base + keys[None, :] * HEAD_DIM + dims[:, None], mask=keys[None, :] < seq, other=0.0)
    v_t = tl.load(V + base + keys[None, :] * HEAD_DIM + dims[:, None], mask=keys[None, :] < seq, other=0.0)
    p = tl.math.exp2(tl.dot(q, k_t) - m[:, None])
    keep = (rows[:, None] < seq) & (keys[None, :] < seq)
    if MASK:
        keep = keep & (rows[:, None] >= keys[None, :])
    p = tl.where(keep, p, 0.0)
    dp = tl.dot(do, v_t)
    ds = (p * (dp - d_i[:, None])).to(tl.float16)
    return tl.dot(ds, tl.trans(k_t), dq)


@triton.jit
def _tutorial_bwd_kernel(Q, K, V, DO, DQ, DK, DV, M, D, seq, sm_scale, HEAD_DIM: tl.constexpr,
                         BLOCK_M1: tl.constexpr, BLOCK_N1: tl.constexpr, BLOCK_M2: tl.constexpr,
                         BLOCK_N2: tl.constexpr, SLICE: tl.constexpr):  # fmt: skip
    LN2: tl.constexpr = 0.6931471824645996
    pid = tl.program_id(0)
    base = tl.program_id(1) * seq * HEAD_DIM
    stat = tl.program_id(1) * seq
    dims = tl.arange(0, HEAD_DIM)
    # dK, dV of key tile pid
    start_n = pid * BLOCK_N1
    keys = start_n + tl.arange(0, BLOCK_N1)
    kv_at = base + keys[:, None] * HEAD_DIM + dims[None, :]
    k = tl.load(K + kv_at, mask=keys[:, None] < seq, other=0.0)
    v = tl.load(V + kv_at, mask=keys[:, None] < seq, other=0.0)
    dk = tl.zeros([BLOCK_N1, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N1, HEAD_DIM], dtype=tl.float32)
    for start_m in range(start_n, start_n + BLOCK_N1, BLOCK_M1 // SLICE):
        dk, dv = _dkdv_rows(dk, dv, Q, DO, M, D, k, v, keys, start_m, base, stat, seq, HEAD_DIM,
                            BLOCK_M1 // SLICE, True)  # fmt: skip
    for start_m in range(start_n + BLOCK_N1, seq, BLOCK_M1):
        dk, dv = _dkdv_rows(dk, dv, Q, DO, M, D, k, v, keys, start_m, base, stat, seq, HEAD_DIM, BLOCK_M1, False)
    tl.store(DV + kv_at, dv, mask=keys[:, None] < seq)
    dk *= sm_scale
    tl.store(DK + kv_at, dk, mask=keys[:, None] < seq)
    # dQ of query tile pid: its diagonal keys first, then the keys before it from 0
    start_m = pid * BLOCK_M2
    rows = start_m + tl.arange(0, BLOCK_M2)
    q_at = base + rows[:, None] * HEAD_DIM + dims[None, :]
    q = tl.load(Q + q_at, mask=rows[:, None] < seq, other=0.0)
    do = tl.load(DO + q_at, mask=rows[:, None] < seq, other=0.0)
    m = tl.load(M + stat + rows, mask=rows < seq, other=0.0)
    d_i = tl.load(D + stat + rows, mask=rows < seq, other=0.0)
    dq = tl.zeros([BLOCK_M2, HEAD_DIM], dtype=tl.float32)
    for start_n in range(start_m, start_m + BLOCK_M2, BLOCK_N2 // SLICE):
        dq = _dq_keys(dq, q, do, m, d_i, rows, K, V, start_n, base, seq, HEAD_DIM, BLOCK_N2 // SLICE, True)
    for start_n in range(0, start_m, BLOCK_N2):
        dq = _dq_keys(dq, q, do, m, d_i, rows, K, V, start_n, base, seq, HEAD_DIM, BLOCK_N2, False)
    dq *= LN2
    tl.store(DQ + q_at, dq, mask=rows[:, None] < seq)


def _bits(x):
    return np.asarray(x, np.float64).view(np.uint64)


def _f64(x):
    return x.float().numpy().astype(np.float64)


# the tutorial's tiles but BLOCK_N1 = BLOCK_M2 = 64 (several tiles at these lengths); head dim 16
TILES = dict(block_m=32, block_n=64, block_m2=64, block_n2=32)


# seed 11 at seq 97: inputs where walking dQ's key tiles forward changes some stored fp16 bits of dq (most
# inputs at these sizes hide the order's fp32 differences in the store)
@pytest.mark.parametrize(("seq", "seed"), [(97, 11), (70, 70)])
def test_the_triton_tutorial_backward_matches_its_preset_bit_for_bit(seq, seed):
    d, sm_scale = 16, 0.3  # not a power of two: where the scale is applied shows in the bits
    g = torch.Generator().manual_seed(seed)
    q, k, v, do = (torch.randn(2, seq, d, generator=g).to(torch.float16) for _ in range(4))
    qn, kn, vn, don = (_f64(x) for x in (q, k, v, do))
    # the forward's o and M (m + log2 l) from the emulated tutorial forward: inputs to both backwards
    o, m, l_i = flash(qn, kn, vn, plan="triton-tutorial-fp16", block_m=32, block_n=16, causal=True,
                      scale=sm_scale, return_stats=True)  # fmt: skip
    lse = lse_from_stats(m.astype(np.float32), l_i.astype(np.float32), plan="triton-tutorial-fp16")
    o_t, m_t = torch.from_numpy(o).to(torch.float16), torch.from_numpy(lse).to(torch.float32)
    arg_k = k * (sm_scale * 1.4426950408889634)  # the host's pre-scale (torch: fp32 product, fp16 result)
    delta = torch.empty((2, seq), dtype=torch.float32)
    dq, dk, dv = (torch.empty_like(q) for _ in range(3))
    blocks = dict(BLOCK_M1=32, BLOCK_N1=64, BLOCK_M2=64, BLOCK_N2=32, SLICE=2)
    with faithful():
        _delta_kernel[(triton.cdiv(seq, 32), 2)](o_t, do, delta, seq, HEAD_DIM=d, BLOCK=32)
        _tutorial_bwd_kernel[(triton.cdiv(seq, 64), 2)](
            q, arg_k, v, do, dq, dk, dv, m_t, delta, seq, sm_scale, HEAD_DIM=d, **blocks
        )
    want = [_f64(x) for x in (dq, dk, dv)] + [delta.numpy().astype(np.float64)]
    args = (qn, kn, vn, _f64(o_t), don, lse)
    kw = dict(TILES, causal=True, scale=sm_scale, return_delta=True)
    for engine in ("vector", "reference"):
        got = flash_backward(*args, plan="triton-tutorial-fp16", engine=engine, **kw)
        for name, x, y in zip(("dq", "dk", "dv", "delta"), got, want, strict=True):
            assert np.array_equal(_bits(x), _bits(y)), (engine, name, np.mean(x == y))
    # the closest plans before scale_at and the dQ order: triton-fp16 (the scale on the scores, dQ forward)
    # do not reproduce dq, dk; the tutorial's plan with dQ walked forward does not reproduce dq (seed 11)
    near = flash_backward(*args, plan="triton-fp16", **kw)
    agree = [float(np.mean(x == y)) for x, y in zip(near[:2], want[:2], strict=True)]
    print(f"triton-fp16: dq, dk agree {agree}")
    assert agree[0] < 1.0 and agree[1] < 1.0, agree
    fwd = backward_plan("triton-tutorial-fp16").replace(dq_order="forward")
    same = float(np.mean(flash_backward(*args, plan=fwd, **kw)[0] == want[0]))
    print(f"dq_order='forward': dq agrees {same}")
    if seed == 11:
        assert same < 1.0, same
