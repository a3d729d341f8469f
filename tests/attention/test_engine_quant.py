"""The vectorized engine of the quantized (INT8 / FP8) flash attention against the scalar reference kernel it
replaces, bit for bit (outputs, m and l): every preset, causal and not, odd lengths (1, 97, 257), block sizes
smaller and larger than the sequences, adversarial inputs (ties, zero rows, large magnitudes, tiles that a
causal row cannot see), every scaling granularity and quantizer rule, the slow paths (float64 ops, non-fused
steps, other accumulation models), batched leads, and 1 or 2 threads; block-scaled quantizers and MMAs (every
SageAttention3 FP4 preset, MX variants on the mxf4 and mixed-format mxf8f6f4 MMAs) on N(0, 1), outliers, zero
and subnormal-scale blocks, and products whose group sums must not be truncated term by term; Q smoothing with
its correction in the MMA's accumulator and on the dequantized scores; the released SageAttention3 kernel's
fixed P shift."""

from __future__ import annotations

import numba
import numpy as np
import pytest

import simfloat as sf
from simfloat.accumulate import Chunked, Sequential, tensor_core
from simfloat.attention import EXACT, Quant, fp8_flash, int8_flash, quant_flash, quant_plan, quant_presets


def _bits(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, dtype=np.float64).view(np.uint64)


def same(a: np.ndarray, b: np.ndarray) -> bool:
    """Bitwise equality (every NaN counts as one value)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        return False
    na, nb = np.isnan(a), np.isnan(b)
    return bool(np.array_equal(na, nb) and np.array_equal(_bits(np.where(na, 0.0, a)), _bits(np.where(nb, 0.0, b))))


def _qkv(lead, sq, sk, d, seed, fmt="float16"):
    g = np.random.default_rng(seed)
    q = sf.round(g.standard_normal(lead + (sq, d)), fmt)
    k = sf.round(g.standard_normal(lead + (sk, d)), fmt)
    v = sf.round(g.standard_normal(lead + (sk, d)), fmt)
    return q, k, v


def _check(q, k, v, **kw):
    """Vector and reference engines give the same out, m and l."""
    a = quant_flash(q, k, v, engine="vector", return_stats=True, **kw)
    r = quant_flash(q, k, v, engine="reference", return_stats=True, **kw)
    for x, y, what in zip(a, r, ("out", "m", "l"), strict=True):
        assert same(x, y), (what, kw.get("plan"), float(np.nanmax(np.abs(x - y))))
    return a[0]


_VECTOR = sorted(quant_presets())  # block-scaled (FP4) ones included


@pytest.mark.parametrize("name", _VECTOR)
def test_every_preset_vector_equals_reference(name):
    q, k, v = _qkv((1,), 97, 97, 32, 1)
    for causal in (False, True):
        _check(q, k, v, plan=name, block_m=32, block_n=16, causal=causal)


@pytest.mark.parametrize(
    "name", ["int8-reference", "int8-consistent", "half-int8", "fp8-e4m3", "fp8-e5m2-block", "sage2-int8-fp8"]
)
@pytest.mark.parametrize("seq", [1, 97, 257])
def test_odd_lengths_and_block_sizes(name, seq):
    q, k, v = _qkv((1,), seq, seq, 16, seq)
    for bm, bn in ((16, 64), (64, 32), (128, 512)):
        _check(q, k, v, plan=name, block_m=bm, block_n=bn, causal=True)
    _check(q, k, v, plan=name, block_m=32, block_n=32, causal=False)


def test_different_query_and_key_lengths():
    for sq, sk in ((33, 97), (97, 20)):
        q, k, v = _qkv((2,), sq, sk, 16, sq + sk)
        for name in ("int8-reference", "fp8-e4m3-block", "half-int8-consistent"):
            for causal in (False, True):
                _check(q, k, v, plan=name, block_m=16, block_n=32, causal=causal)


def test_adversarial_inputs():
    g = np.random.default_rng(7)
    n, d = 97, 16
    # ties: small integers and halves (scores, codes and P land on rounding midpoints), repeated keys
    q = g.integers(-3, 4, (1, n, d)) * 0.5
    k = np.repeat(g.integers(-2, 3, (1, n // 8 + 1, d)) * 0.25, 8, axis=1)[:, :n]
    v = g.integers(-4, 5, (1, n, d)) * 1.0
    # zero rows (an all-zero group takes scale 1), large magnitudes, one huge outlier per tensor
    q[0, 5] = 0.0
    k[0, 10:14] = 0.0
    v[0, 20] = 0.0
    q[0, 40] *= 3e4
    k[0, 50] *= 6e4
    v[0, 60, 3] = 6e4
    z = np.zeros((1, 9, d))
    for name in (
        "int8-reference",
        "int8-consistent",
        "half-int8",
        "fp8-e4m3",
        "fp8-e4m3-block",
        "fp8-e5m2-unscaled",
        "fp16-flash",
        "int8-reference-fp64",
        "fp64",
    ):
        for causal in (False, True):
            # block_m 64 > block_n 8: the first rows of a q tile see no key of the later key tiles
            _check(q, k, v, plan=name, block_m=64, block_n=8, causal=causal)
        _check(z, z, z, plan=name, block_m=4, block_n=4, causal=True)  # all scores zero: P ties at 1


@pytest.mark.parametrize(
    "changes",
    [
        {"q_quant": Quant("int", "per-tensor", pre="float32"), "k_quant": Quant("int", "per-block", pre="float32")},
        {"q_quant": Quant("int", "per-block", "nearest_away"), "k_quant": Quant("int", "per-token", "toward_zero")},
        {"v_quant": Quant("int", "per-channel", pre="float32"), "row_sum": "consistent"},
        {"v_quant": Quant("int", "per-block", pre="float32"), "contract": False},
        {"p_quant": Quant("int", "fixed", "half_up_unfused", arith="float16", pre="float16")},
        {"p_quant": Quant("int", "fixed", "half_up", qmax=255, arith="float32"), "row_sum": "consistent"},
        {"exp2": False, "scale": "float16", "acc": "bfloat16"},
        {"exp": ("float32", "toward_zero"), "l_i": ("float32", "up"), "normalize": ("float16", "down")},
        {"dequant": "float64", "pv_dequant": "float64", "acc": "float64", "l_i": "float64"},
        {"pv": Sequential("float32")},
        {"qk": tensor_core("sm90", "fp16"), "pv": Chunked(splits=2, inner=Sequential("float32"))},
    ],
)
def test_int8_plan_variants(changes):
    q, k, v = _qkv((1,), 97, 97, 32, 3)
    pl = quant_plan("int8-reference").replace(**changes)
    for causal in (False, True):
        _check(q, k, v, plan=pl, block_m=32, block_n=32, causal=causal)


@pytest.mark.parametrize(
    "changes",
    [
        {"p_quant": Quant("float", "unscaled", fmt="float8_e5m2"), "row_sum": "consistent"},
        {"p_quant": Quant("float", "unscaled", "toward_zero", fmt="float8_e4m3fn", pre="float16")},
        {"p_quant": Quant(), "row_sum": "consistent"},
        {"q_quant": Quant("float", "per-block", fmt="float8_e5m2", pre="float32"), "contract": False},
        {"pv": tensor_core("sm90", "tf32"), "qk": tensor_core("sm80", "fp16")},
        {"v_quant": Quant("float", "per-channel", fmt="float8_e4m3fn", qmax=240.0, arith="bfloat16")},
    ],
)
def test_fp8_plan_variants(changes):
    q, k, v = _qkv((1,), 97, 97, 32, 4)
    base = "fp8-e4m3-block" if "q_quant" in changes else "fp8-e4m3"
    pl = quant_plan(base).replace(**changes)
    for causal in (False, True):
        _check(q, k, v, plan=pl, block_m=16, block_n=32, causal=causal)


def test_incoherent_processing_and_entry_points():
    q, k, v = _qkv((2, 1), 65, 65, 32, 5)
    for scaling in ("per-tensor", "per-block"):
        a = fp8_flash(q, k, v, scaling=scaling, incoherent=True, seed=3, block_m=16, block_n=32)
        r = fp8_flash(q, k, v, scaling=scaling, incoherent=True, seed=3, block_m=16, block_n=32, engine="reference")
        assert same(a, r)
    assert same(int8_flash(q, k, v, causal=True), int8_flash(q, k, v, causal=True, engine="reference"))


def test_results_do_not_depend_on_the_thread_count():
    q, k, v = _qkv((2, 2), 257, 257, 32, 9)
    before = numba.get_num_threads()
    try:
        outs = []
        for threads in (1, 2):
            numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
            outs.append(
                (
                    int8_flash(q, k, v, causal=True, return_stats=True),
                    fp8_flash(q, k, v, scaling="per-block", return_stats=True),
                    quant_flash(q, k, v, plan="half-int8", block_m=32, block_n=64),
                    quant_flash(q, k, v, plan="sage2-int8-fp8-single", block_m=32, block_n=64, causal=True),
                    quant_flash(q, k, v, plan="sage3-fp4", block_m=32, block_n=64, causal=True, return_stats=True),
                )
            )
    finally:
        numba.set_num_threads(before)
    for x, y in zip(*outs, strict=True):
        for a, b in zip(x if isinstance(x, tuple) else (x,), y if isinstance(y, tuple) else (y,), strict=True):
            assert same(a, b)
    assert same(outs[0][0][0], int8_flash(q, k, v, causal=True, engine="reference"))


def test_block_sizes_beyond_the_sequences_give_the_sequences_bits():
    q, k, v = _qkv((1,), 20, 30, 8, 4)
    for name in ("int8-reference", "fp8-e4m3-block"):
        for causal in (False, True):
            kw = {"plan": name, "causal": causal, "return_stats": True}
            fit = quant_flash(q, k, v, block_m=30 if causal else 20, block_n=30, engine="reference", **kw)
            for engine in ("vector", "reference"):
                huge = quant_flash(q, k, v, block_m=2**40, block_n=2**40, engine=engine, **kw)
                for x, y in zip(fit, huge, strict=True):
                    assert same(x, y), (name, causal, engine)


def test_engine_argument():
    q, k, v = _qkv((1,), 8, 8, 4, 0)
    with pytest.raises(ValueError, match="engine"):
        int8_flash(q, k, v, engine="gpu")
    with pytest.raises(ValueError, match="reference engine"):
        quant_flash(q, k, v, plan="int8-reference", engine="vector", trace=sf.Tracer())
    tr = sf.Tracer()
    traced = int8_flash(q, k, v, trace=tr)  # engine=None with a tracer: the reference, which records
    assert same(traced, int8_flash(q, k, v, engine="vector"))
    assert len(tr.by_op()) > 0


def test_sage_plan_variants_vector_equals_reference():
    """The SageAttention2 dataflow's own paths: fixed-scale P in every P.V update that takes it, two-level with
    and without contraction, float64 smoothing, per-warp groups that straddle q tiles, int P two-level."""
    q, k, v = _qkv((2,), 97, 83, 16, 21)
    sage = quant_plan("sage2-int8-fp8")
    variants = [
        sage.replace(pv_update="separate"),
        sage.replace(contract=False),
        sage.replace(k_smooth="float64", q_quant=Quant("int", "per-warp", pre="float32", group=12)),
        sage.replace(p_quant=Quant("float", "fixed", fmt="float8_e5m2", arith="float16")),
        sage.replace(p_quant=Quant("int", "fixed", "half_up", arith="float16", pre="float16")),
        sage.replace(pv=Sequential("float32"), p_quant=Quant("float", "fixed", fmt="float8_e4m3fn", qmax=240.0)),
    ]
    for pl in variants:
        for causal in (False, True):
            _check(q, k, v, plan=pl, block_m=32, block_n=16, causal=causal)


def _block_plans():
    """Every sage3-fp4 preset and MX variants: mxfp4 on the mxf4 MMA; mxfp8 (e4m3) Q and V with mxfp4 K and P
    on the mixed-format mxf8f6f4 MMA (operand clamps differing between A and B)."""
    names = (
        "sage3-fp4",
        "sage3-fp4-tensorscale",
        "sage3-fp4-onelevel",
        "sage3-fp4-qsmooth",
        "sage3-fp4-fixedp",
        "sage3-fp4-released",
        "sage3-fp4-fp64",
    )
    plans = {n: quant_plan(n) for n in names}
    sage3 = plans["sage3-fp4"]
    mx4 = Quant("block", "unscaled", fmt="mxfp4", pre="float32")
    mx8 = Quant("block", "unscaled", fmt="mxfp8_e4m3", pre="float32")
    p4 = Quant("block", "per-token", fmt="mxfp4", qmax=6.0 * 256)
    mxf4 = tensor_core("sm100", "e2m1", kind="mxf4")
    plans["mxfp4"] = sage3.replace(
        name="sage3-mxfp4", q_quant=mx4, k_quant=mx4, v_quant=mx4, p_quant=p4, qk=mxf4, pv=mxf4
    )
    plans["mxfp8-mixed"] = sage3.replace(
        name="sage3-mxfp8-mixed",
        q_quant=mx8,
        k_quant=mx4,
        v_quant=mx8,
        p_quant=p4,
        qk=tensor_core("sm100", "e4m3", "e2m1", kind="mxf8f6f4"),
        pv=tensor_core("sm100", "e2m1", "e4m3", kind="mxf8f6f4"),
    )
    return plans


_BLOCK = _block_plans()


def _outliers(lead, n, d, seed):
    """N(0, 1) with a zero row, an all-zero block of channels, a large outlier and a tiny block (subnormal ue4m3
    scales), a whole key tile of zero keys and values."""
    q, k, v = (x.astype(np.float32) for x in _qkv(lead, n, n, d, seed, fmt="float32"))
    q[..., 3, :] = 0.0
    q[..., 5, :16] = 0.0
    k[..., 7, 3] = 900.0
    v[..., 9, 5] = -3000.0
    q[..., 11, 16:32] *= 1e-3
    k[..., 13, :] *= 1e-3
    k[..., 32:64, :] = 0.0
    v[..., 32:64, :] = 0.0
    return q, k, v


def _group_gap(n, seed):
    """Scores whose two large groups of 16 products cancel exactly, leaving two groups with scales 28 binades
    below theirs: the nvf4 MMA truncates each group's sum, not each product, and here the two differ."""
    g = np.random.default_rng(seed)
    q, k = np.empty((1, n, 64)), np.empty((1, n, 64))
    big = 2400.0 * g.uniform(-1, 1, (n, 16))
    big[:, 0] = 2400.0
    q[0, :, :16], q[0, :, 16:32] = big, big
    kb = 2400.0 * g.uniform(-1, 1, (n, 16))
    kb[:, 0] = 2400.0
    k[0, :, :16], k[0, :, 16:32] = kb, -kb
    q[0, :, 32:], k[0, :, 32:] = 0.1 * g.uniform(-1, 1, (n, 32)), 0.1 * g.uniform(-1, 1, (n, 32))
    q[0, :, 32], k[0, :, 32] = 0.18, 0.18
    return q.astype(np.float32), k.astype(np.float32), g.standard_normal((1, n, 64)).astype(np.float32)


def _built(monkeypatch):
    """The engine records (or None: declined, the reference ran) of every vector call from here on."""
    import simfloat.attention.quantized as quantized

    built = []
    real = quantized.flash_engine

    def spy(*args, **kw):
        built.append(real(*args, **kw))
        return built[-1]

    monkeypatch.setattr(quantized, "flash_engine", spy)
    return built


@pytest.mark.parametrize("name", sorted(_BLOCK))
def test_block_scaled_vector_equals_reference(name, monkeypatch):
    built = _built(monkeypatch)
    pl = _BLOCK[name]
    inputs = [_qkv((2,), 97, 97, 64, 5, fmt="float32"), _outliers((1, 2), 97, 64, 6)]
    for q, k, v in inputs:
        for causal in (False, True):
            _check(q, k, v, plan=pl, block_m=32, block_n=32, causal=causal)
    q, k, v = _qkv((1,), 257, 257, 32, 8, fmt="float32")
    _check(q, k, v, plan=pl, block_m=64, block_n=64, causal=True)
    z = np.zeros((1, 40, 32))  # every block all zero: zero scales, P uniform
    _check(z, z, z, plan=pl, block_m=16, block_n=32, causal=True)
    assert len(built) == 6 and all(b is not None for b in built)  # the vector engine ran every call


def test_block_scaled_tiles_and_group_sums(monkeypatch):
    """Tiles longer than the sequence (a P block cut short at the last key), seq_q != seq_k, and the group-sum
    truncation case on the nvf4 and mxf4 MMAs (without K smoothing, which would remove the cancelling keys)."""
    built = _built(monkeypatch)
    q, k, v = _qkv((1,), 97, 97, 32, 9, fmt="float32")
    for pl in (_BLOCK["sage3-fp4"], _BLOCK["mxfp4"]):
        _check(q, k, v, plan=pl, block_m=16, block_n=128, causal=True)
        _check(q[:, :33], k, v, plan=pl, block_m=32, block_n=64, causal=False)
        _check(q, k[:, :60], v[:, :60], plan=pl, block_m=64, block_n=32, causal=True)
        gq, gk, gv = _group_gap(97, 10)
        _check(gq, gk, gv, plan=pl.replace(k_smooth=None), block_m=32, block_n=32, causal=False)
    assert len(built) == 8 and all(b is not None for b in built)


def test_block_scaled_operands_beyond_the_row_kernels_run_the_reference(monkeypatch):
    """MX scales (e8m0) let scaled scores reach float32's range: the engine builder declines (its row kernels'
    fallback would not give the block-scaled model's bits) and the call runs the reference, with its bits."""
    built = _built(monkeypatch)
    q, k, v = _qkv((1,), 40, 40, 32, 11, fmt="float32")
    pl = _BLOCK["mxfp4"]
    _check(q, k, v, plan=pl, block_m=16, block_n=32)
    assert built[-1] is not None
    q[0, 3, 7] = 1e30
    k[0, 5, 2] = -1e30
    _check(q, k, v, plan=pl, block_m=16, block_n=32)
    assert built[-1] is None


def _q_smooth_variants():
    """Q smoothing with its correction in each place: the MMA's initial accumulator (FP4 block-scaled MMA,
    fp16 tensor cores with unscaled casts, an fp32 FMA chain; with an fp32, bf16 or float64 delta_s) and the
    dequantized scores (INT8 per warp / per token); other mean and correction formats, no contraction."""
    fp32, e4m3 = "float32", "float8_e4m3fn"
    sage = quant_plan("sage2-int8-fp8-qsmooth")
    sage3 = quant_plan("sage3-fp4-qsmooth")
    fp16 = quant_plan("fp16-flash")
    return [
        sage.replace(q_delta=EXACT, contract=False),
        sage.replace(q_smooth="bfloat16", q_delta=tensor_core("sm90", "bf16")),
        sage.replace(q_quant=Quant("int", "per-token", pre=fp32), k_smooth=None),
        quant_plan("int8-reference").replace(q_smooth="float16", q_delta=Sequential("float16")),
        sage3.replace(q_delta=EXACT),
        sage3.replace(q_smooth="float16", k_quant=Quant("block", "per-tensor", fmt="nvfp4", pre=fp32)),
        fp16.replace(q_smooth=fp32),
        fp16.replace(q_smooth=fp32, q_delta=EXACT),
        fp16.replace(q_smooth=fp32, qk=Sequential(fp32), q_quant=Quant("float", "unscaled", fmt=e4m3)),
        quant_plan("sage3-fp4-released").replace(contract=False),
        quant_plan("sage3-fp4-released").replace(
            q_smooth="bfloat16", q_delta=Chunked(splits=1, inner=Sequential(fp32), outer_fmt="bfloat16")
        ),
        quant_plan("sage3-fp4-fixedp").replace(exp2=False, scale="bfloat16"),
        _BLOCK["mxfp4"].replace(p_quant=Quant("block", "fixed", fmt="mxfp4", qmax=6.0 * 256)),
    ]


@pytest.mark.parametrize("pl", _q_smooth_variants(), ids=lambda p: p.name)
def test_q_smoothing_and_fixed_p_vector_equals_reference(pl, monkeypatch):
    """Random inputs with a common offset in Q (what Q smoothing removes) and the outlier mix, seq 97, q tiles
    that do and do not divide the sequence, seq_q != seq_k, causal and not; also the fixed P shift's paths
    (unfused, ln instead of log2, a bf16 shift, MXFP4 P)."""
    built = _built(monkeypatch)
    q, k, v = _qkv((2,), 97, 97, 32, 12, fmt="float32")
    q = q + np.float32(6.0) * np.sign(np.arange(32) - 15.5).astype(np.float32)
    oq, ok, ov = _outliers((1,), 97, 32, 13)
    for causal in (False, True):
        _check(q, k, v, plan=pl, block_m=32, block_n=32, causal=causal)
        _check(oq, ok, ov, plan=pl, block_m=48, block_n=32, causal=causal)
    _check(q[:, :40], k, v, plan=pl, block_m=16, block_n=32, causal=True)
    _check(q, k[:, :33], v[:, :33], plan=pl, block_m=64, block_n=32, causal=False)
    assert len(built) == 6 and all(b is not None for b in built)


# -- the float dataflow's options on plans with quantizers (one forward loop per engine) -------------------------

_HW_PLANS = [
    "int8-reference",
    "int8-consistent",
    "half-int8",
    "fp8-e4m3",
    "fp8-e5m2-block",
    "sage2-int8-fp8",
    "sage3-fp4",
]


def _stats(q, k, v, pl, engine, **kw):
    return quant_flash(q, k, v, plan=pl, block_m=32, block_n=32, causal=True, return_stats=True, engine=engine, **kw)


@pytest.mark.parametrize("name", _HW_PLANS)
def test_hardware_models_and_lazy_rescaling_apply_to_quantized_plans(name):
    """The H200's ex2 table, its tl.sum order and lazy rescaling are optional steps of the one forward loop: on a
    plan with quantizers both engines give the same bits, and each option changes them (it is applied)."""
    from simfloat.attention import plan

    base = plan(name)
    q, k, v = _qkv((2,), 97, 97, 32, 3)
    want = _stats(q, k, v, base, "reference")
    options = [{"exp2_impl": "h200"}, {"lazy_threshold": 8.0}, {"exp2_impl": "h200", "sum_order": "h200-mma"}]
    if not (base.row_sum == "consistent" and base.p_quant.kind == "int"):  # that row sum is an exact integer sum
        options.append({"sum_order": "h200-mma"})
    for opt in options:
        pl = base.replace(**opt)
        got = _stats(q, k, v, pl, "vector")
        ref = _stats(q, k, v, pl, "reference")
        for x, y, what in zip(got, ref, ("out", "m", "l"), strict=True):
            assert same(x, y), (name, opt, what)
        changed = "m" if "lazy_threshold" in opt else "l"  # lazy keeps m; the others round l's terms otherwise
        i = ("out", "m", "l").index(changed)
        assert not same(ref[i], want[i]), (name, opt)
        # causal False, other tiles and two leads: the same agreement
        _check(q, k, v, plan=pl, block_m=16, block_n=64, causal=False)


def test_tl_exp_on_a_quantized_plan_runs_on_the_reference():
    """exp_impl='tl.exp' (exp2=False) on a plan with quantizers: modelled by the reference loop, which engine=None
    picks; the vector engine refuses it, as for the float plans."""
    from simfloat.attention import plan

    base = plan("fp8-e4m3").replace(exp2=False)
    pl = base.replace(exp_impl="tl.exp")
    q, k, v = _qkv((1,), 65, 65, 16, 4)
    got = _stats(q, k, v, pl, None)
    ref = _stats(q, k, v, pl, "reference")
    assert all(same(x, y) for x, y in zip(got, ref, strict=True))
    assert not same(ref[2], _stats(q, k, v, base, "reference")[2])
    with pytest.raises(ValueError, match="tl.exp"):
        _stats(q, k, v, pl, "vector")


def test_quantized_plans_still_refuse_fa1_and_the_tie_shift():
    import dataclasses

    from simfloat.attention import plan

    for change in ({"normalization": "per_step"}, {"tie_shift": 2.0}):
        with pytest.raises(ValueError, match="do not model it"):
            dataclasses.replace(plan("int8-reference"), **change)
