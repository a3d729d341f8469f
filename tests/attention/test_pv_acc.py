"""``Plan.pv_acc``, the P.V accumulator's format: SageAttention1's fp16-accumulating P.V (``pv_accum_dtype="fp16"``:
the accumulator held in fp16, rescaled by the fp16 alpha) and its two other accumulators, on both engines bit for
bit, traced, and attributed with the acc op."""

from __future__ import annotations

import numpy as np
import pytest

import simfloat as sf
from simfloat.accumulate import tensor_core
from simfloat.attention import flash, plan
from simfloat.attention.quantized import quant_flash
from simfloat.attribution._plans import ablation_plan, isolation_plan, reference_plan

SAGE1 = ("sage1-int8-fp16", "sage1-int8-fp16-acc16", "sage1-int8-fp16-acc16-flush32")
TILES = {"block_m": 32, "block_n": 32}


def _qkv(sq: int, sk: int, d: int = 16, seed: int = 0) -> tuple[np.ndarray, ...]:
    g = np.random.default_rng(seed)
    return tuple(sf.round(g.standard_normal((1, 2, s, d)) * 2.0, "float16") for s in (sq, sk, sk))


def _bits(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, dtype=np.float64).view(np.uint64)


@pytest.mark.parametrize("name", SAGE1)
@pytest.mark.parametrize(("sq", "sk"), [(97, 97), (70, 97)])
@pytest.mark.parametrize("causal", [False, True])
def test_sage1_vector_equals_reference(name: str, sq: int, sk: int, causal: bool) -> None:
    q, k, v = _qkv(sq, sk)
    kw = dict(plan=name, causal=causal, return_stats=True, **TILES)
    ref = quant_flash(q, k, v, engine="reference", **kw)
    vec = quant_flash(q, k, v, engine="vector", **kw)
    for x, y in zip(ref, vec, strict=True):
        assert np.array_equal(_bits(x), _bits(y)), (name, sq, sk, causal)


def _count(tr: sf.Tracer, op: str) -> int:
    t = tr.by_op().reset_index()
    return int(t.loc[t["op"] == op, "count"].sum())


def test_fp16_accumulator_is_not_the_fp32_one() -> None:
    """The three accumulators give three results; without the field (alpha unrounded) the fp16 one moves too."""
    q, k, v = _qkv(70, 97, seed=3)
    out = {n: quant_flash(q, k, v, plan=n, engine="vector", **TILES) for n in SAGE1}
    acc16 = plan("sage1-int8-fp16-acc16")
    no_field = quant_flash(q, k, v, plan=acc16.replace(pv_acc=None), engine="vector", **TILES)
    fp32 = out["sage1-int8-fp16"]
    assert (out["sage1-int8-fp16-acc16"] != fp32).mean() > 0.2
    assert (out["sage1-int8-fp16-acc16-flush32"] != fp32).mean() > 0.01
    assert (out["sage1-int8-fp16-acc16"] != no_field).mean() > 0.01  # alpha's fp16 rounding
    exact = quant_flash(q, k, v, plan="sage1-int8-fp16-fp64", engine="vector", **TILES)
    err = {n: np.abs(o - exact).max() for n, o in out.items()}
    assert err["sage1-int8-fp16-acc16"] > err["sage1-int8-fp16"]


@pytest.mark.parametrize("causal", [False, True])
def test_traced_alpha_rounding(causal: bool) -> None:
    """The reference records alpha's rounding into the accumulator's format as an acc op (one per row and key
    tile), and the traced run gives the untraced bits."""
    q, k, v = _qkv(70, 97, seed=5)
    acc16 = plan("sage1-int8-fp16-acc16")
    counts = []
    for pl in (acc16, acc16.replace(pv_acc=None)):
        tr = sf.Tracer()
        traced = quant_flash(q, k, v, plan=pl, causal=causal, trace=tr, **TILES)
        vec = quant_flash(q, k, v, plan=pl, causal=causal, engine="vector", **TILES)
        assert np.array_equal(_bits(traced), _bits(vec))
        counts.append(_count(tr, "acc"))
    # (row, key tile) pairs: every row meets its q tile's key tiles (causal: up to the q tile's end)
    visits = 2 * 70 * 4 if not causal else 2 * sum(i // 32 + 1 for i in range(70))
    assert counts[0] - counts[1] == visits


def test_float_plan_takes_the_field() -> None:
    """A plan without quantizers (``triton-fp16`` with an fp16 accumulator): both engines, and the field moves bits."""
    pl = plan("triton-fp16").replace(pv=tensor_core("sm89", "fp16", out_format="fp16"), acc="float16")
    with_field = pl.replace(pv_acc="float16")
    q, k, v = _qkv(97, 97, seed=7)
    for causal in (False, True):
        kw = dict(causal=causal, **TILES)
        ref = flash(q, k, v, plan=with_field, engine="reference", **kw)
        vec = flash(q, k, v, plan=with_field, engine="vector", **kw)
        assert np.array_equal(_bits(ref), _bits(vec))
        assert (vec != flash(q, k, v, plan=pl, engine="vector", **kw)).any()


def test_attribution_keeps_the_field_with_acc() -> None:
    qp = plan("sage1-int8-fp16-acc16")
    assert qp.exact().pv_acc is None and qp.arith_fp64().pv_acc is None
    assert qp.isolate("acc").pv_acc == qp.pv_acc and qp.isolate("pv").pv_acc is None
    assert qp.ablate("acc").pv_acc is None and qp.ablate("pv").pv_acc == qp.pv_acc
    fp = plan("triton-fp16").replace(acc="float16", pv_acc="float16")
    assert reference_plan(fp).pv_acc is None
    assert isolation_plan(fp, "acc").pv_acc == fp.pv_acc and isolation_plan(fp, "exp").pv_acc is None
    assert ablation_plan(fp, "acc").pv_acc is None and ablation_plan(fp, "exp").pv_acc == fp.pv_acc


def test_pv_acc_errors() -> None:
    acc16 = plan("sage1-int8-fp16-acc16")
    with pytest.raises(ValueError, match="acc op .* same format"):
        acc16.replace(acc="float32")
    with pytest.raises(ValueError, match="pv_update='two_level'"):
        acc16.replace(pv_update="two_level")
    with pytest.raises(ValueError, match="normalization='per_step'"):
        plan("triton-fp16").replace(acc="float16", pv_acc="float16", normalization="per_step")
    with pytest.raises(ValueError, match="baseline"):
        sf.attention.Plan(**{**_fields(plan("fp64")), "kernel": "baseline", "pv_acc": "float64"})
    with pytest.raises(ValueError):
        plan("triton-fp16").replace(pv_acc="float17")
    assert "pv_acc=float16" in str(acc16)


def _fields(p: sf.attention.Plan) -> dict[str, object]:
    import dataclasses

    return {f.name: getattr(p, f.name) for f in dataclasses.fields(p)}
