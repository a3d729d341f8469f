"""simfloat.tolerance: rtol/atol from a plan's numerics (simfloat/tolerances.py).

The recorded H200 outputs (tests/fixtures/gpu/h200) lie inside the tolerance of their h200-<fmt> plans; a
kernel with one op less precise than its plan falls outside; a more precise plan gets a smaller tolerance; the
same arguments give the same numbers; bad arguments raise.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import simfloat
from simfloat.attention import flash, plan
from simfloat.tolerances import Tolerance, fit_tolerance, reference64

SHAPE = (1, 2, 97, 16)  # odd length: partial last tiles
TILES = dict(block_m=32, block_n=32)
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gpu" / "h200"


def _inputs(seed: int, shape=SHAPE, fmt="bf16", stds=(1.0, 1.0, 1.0)):
    rng = np.random.default_rng(seed)
    return tuple(simfloat.round((rng.standard_normal(shape) * s).astype(np.float32), fmt) for s in stds)


@pytest.fixture(scope="module")
def fp32_out_plan():
    return plan("triton-bf16").replace(out="float32")


@pytest.fixture(scope="module")
def tol_bf16(fp32_out_plan):
    return simfloat.tolerance(fp32_out_plan, SHAPE, causal=True, samples=4, **TILES)


def test_tolerance_is_deterministic_and_unpacks(fp32_out_plan, tol_bf16):
    again = simfloat.tolerance(fp32_out_plan, SHAPE, causal=True, samples=4, **TILES)
    assert again == tol_bf16
    rtol, atol = tol_bf16
    assert isinstance(tol_bf16, Tolerance) and tol_bf16.kwargs == {"rtol": rtol, "atol": atol}
    assert 0 < atol and 0 < rtol < 0.1
    other = simfloat.tolerance(fp32_out_plan, SHAPE, causal=True, samples=4, seed=1, **TILES)
    assert other != tol_bf16  # another draw, another estimate


def test_matching_kernel_passes_assert_allclose(fp32_out_plan, tol_bf16):
    for seed in (100, 101, 102):
        q, k, v = _inputs(seed)
        out = flash(q, k, v, plan=fp32_out_plan, causal=True, **TILES)
        np.testing.assert_allclose(out, reference64(q, k, v, causal=True), **tol_bf16.kwargs)


@pytest.mark.parametrize(
    "change",
    [dict(acc="bfloat16"), dict(pv="bfloat16"), dict(l_i="float16")],
    ids=["acc-bf16", "pv-bf16", "l_i-fp16"],
)
def test_one_op_less_precise_falls_outside(change):
    base = plan("triton-fp32")
    tol = simfloat.tolerance(base, SHAPE, causal=True, samples=4, **TILES)
    worse = base.replace(**change)
    outside = 0
    for seed in (200, 201):
        q, k, v = _inputs(seed, fmt="fp32")
        ref = reference64(q, k, v, causal=True)
        assert tol.inside(flash(q, k, v, plan=base, causal=True, **TILES), ref).all()
        outside += int((~tol.inside(flash(q, k, v, plan=worse, causal=True, **TILES), ref)).sum())
    assert outside > 0, (change, tol)


def test_bf16_pv_in_a_bf16_plan_falls_outside(fp32_out_plan, tol_bf16):
    worse = fp32_out_plan.replace(pv="bfloat16")  # P.V accumulated in bf16 instead of the tensor core's fp32
    q, k, v = _inputs(200)
    ref = reference64(q, k, v, causal=True)
    assert (~tol_bf16.inside(flash(q, k, v, plan=worse, causal=True, **TILES), ref)).sum() > 0


def test_more_precise_plan_smaller_tolerance(tol_bf16):
    fp32 = simfloat.tolerance("triton-fp32", SHAPE, causal=True, samples=4, **TILES)
    assert fp32.rtol < tol_bf16.rtol / 100 and fp32.atol < tol_bf16.atol / 100, (fp32, tol_bf16)


def test_bound_method_covers_the_emulator_and_is_wider(tol_bf16, fp32_out_plan):
    bound = simfloat.tolerance(fp32_out_plan, SHAPE, causal=True, samples=2, method="bound", **TILES)
    assert bound.rtol > tol_bf16.rtol and bound.atol > tol_bf16.atol
    q, k, v = _inputs(300)
    out = flash(q, k, v, plan=fp32_out_plan, causal=True, **TILES)
    assert bound.inside(out, reference64(q, k, v, causal=True)).all()


def test_fit_tolerance_tail():
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((4, 1, 1000))
    err = np.abs(rng.standard_normal((4, 1, 1000))) * 1e-3 * (0.5 + np.abs(ref))
    tol = fit_tolerance(list(err), list(ref), confidence=0.99)
    a0 = np.median(np.abs(ref))
    assert tol.atol == pytest.approx(tol.rtol * a0)
    z = err / (a0 + np.abs(ref))
    assert tol.rtol >= z.max()  # never below what was seen
    assert tol.rtol < 10 * z.max()
    # a higher confidence asks more
    assert fit_tolerance(list(err), list(ref), confidence=0.9999).rtol > tol.rtol
    with pytest.raises(ValueError, match="finite"):
        fit_tolerance([np.array([np.nan])], [np.array([1.0])])
    with pytest.raises(ValueError, match="one shape"):
        fit_tolerance([np.zeros(3), np.zeros(4)], [np.zeros(3), np.zeros(4)])
    with pytest.raises(ValueError, match="one reference per"):
        fit_tolerance([], [])


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        (dict(confidence=1.0), ValueError, "confidence"),
        (dict(confidence=0), ValueError, "confidence"),
        (dict(confidence="high"), TypeError, "confidence"),
        (dict(samples=0), ValueError, "samples"),
        (dict(samples=1.5), TypeError, "samples"),
        (dict(seed=-1), ValueError, "seed"),
        (dict(method="guess"), ValueError, "method"),
        (dict(input_std=0.0), ValueError, "input_std"),
        (dict(input_std=(1.0, 1.0)), ValueError, "input_std"),
        (dict(causal=1), TypeError, "causal"),
        (dict(v_dim=0), ValueError, "v_dim"),
    ],
)
def test_bad_arguments_raise(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        simfloat.tolerance("triton-bf16", SHAPE, **kwargs)


@pytest.mark.parametrize(
    "q_shape, k_shape, match",
    [
        ((97,), None, "at least"),
        ((1, 0, 97, 16), None, ">= 1"),
        ("1x2", None, "tuple of ints"),
        ((1, 2, 97, 16), (1, 2, 97, 32), "head_dim differ"),
        ((1, 3, 97, 16), (1, 2, 97, 16), "multiple"),
    ],
)
def test_bad_shapes_raise(q_shape, k_shape, match):
    with pytest.raises((ValueError, TypeError), match=match):
        simfloat.tolerance("triton-bf16", q_shape, k_shape)


def test_unknown_plan_raises():
    with pytest.raises(ValueError):
        simfloat.tolerance("triton-bf17", SHAPE)
    with pytest.raises(TypeError, match="plan"):
        simfloat.tolerance(3, SHAPE)  # type: ignore[arg-type]


# -- the recorded H200 outputs ------------------------------------------------------------------------------------


def _fixture_configs():
    if not (FIXTURES / "configs.json").is_file():
        return []
    from simfloat_gpu.campaign.fixtures import load_fixture_dir

    _, items = load_fixture_dir(FIXTURES)
    return [(cfg, arrays) for cfg, _, arrays in items if cfg.kind == "flash" and cfg.seq == 97]


CONFIGS = _fixture_configs()


@pytest.mark.skipif(not CONFIGS, reason="no H200 fixtures (tests/fixtures/gpu/h200)")
def test_h200_fixtures_inside_the_tolerance_of_their_plans():
    from simfloat_gpu.campaign.grid import SPREAD, make_inputs

    worst = 0.0
    for cfg, arrays in CONFIGS:
        pl = plan(f"h200-{cfg.fmt}")
        if cfg.out == "fp32":
            pl = pl.replace(out="float32")
        tol = simfloat.tolerance(
            pl,
            cfg.shape,
            cfg.kv_shape,
            causal=cfg.causal,
            block_m=cfg.block_m,
            block_n=cfg.block_n,
            input_std=(SPREAD, 1.0, 1.0),
            samples=3,
        )
        q, k, v = make_inputs(cfg)
        ref = reference64(q, k, v, causal=cfg.causal)
        out = arrays["out"]
        np.testing.assert_allclose(out, ref, **tol.kwargs, err_msg=cfg.id)
        worst = max(worst, float(np.max(np.abs(out - ref) / (tol.atol + tol.rtol * np.abs(ref)))))
    print(f"{len(CONFIGS)} H200 fixture configs: largest |out - ref| / (atol + rtol |ref|) = {worst:.3f}")


def test_baseline_plan_and_grouped_query_shapes():
    tol = simfloat.tolerance("pytorch-bf16", (1, 2, 33, 16), samples=2)
    q, k, v = _inputs(400, shape=(1, 2, 33, 16))
    from simfloat.attention import baseline

    assert tol.inside(baseline(q, k, v, plan="pytorch-bf16"), reference64(q, k, v)).all()
    gqa = simfloat.tolerance("triton-bf16", (1, 4, 33, 16), (1, 2, 33, 16), samples=2, **TILES)
    assert gqa.rtol > 0 and gqa.atol > 0
