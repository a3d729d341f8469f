"""The GPU job's probes of the two tensor-core rules no measurement settles yet (``BlockFMA.overflow``: a step's
sum beyond fp32's range; ``BlockFMA.zero_sign``: a negative sum below fp32's smallest step): the dot probe's
inputs hold both cases, and the fit reports each rule from outputs a model computed with each setting (the
synthetic "hardware"), or says the outputs do not settle it."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest

pytest.importorskip("torch")

from simfloat.accumulate import matmul, tensor_core  # noqa: E402
from simfloat_gpu.campaign import fit, probes  # noqa: E402

SHAPE = (16, 16, 32)  # BLOCK_M, N, K of the smallest probe tile with a K of two sm90 bf16 steps


def _hardware(fmt: str, model, inp):  # type: ignore[no-untyped-def]
    """(2, T, bm, bn) outputs of the probe's two launches under ``model``."""
    a, b, c0 = inp["a"], inp["b"], inp["c0"]
    return np.stack([matmul(a, b, c, acc=model) for c in (np.zeros_like(c0), c0)])


@pytest.mark.parametrize("fmt", probes.RANGE_FORMATS)
def test_probe_rows_reach_both_cases(fmt: str) -> None:
    inp = probes.dot_inputs(fmt, *SHAPE)
    fams = list(inp["families"])
    a = inp["a"].reshape(-1, SHAPE[2])[: inp["rows"]]
    b = inp["b"][0]
    assert (b[:, probes.TINY_COL] == probes.TINY_B).all()
    exact = a @ b  # float64: every product exact, the sums far inside float64's range
    over = inp["family"] == fams.index("overflow")
    tiny = inp["family"] == fams.index("negtiny")
    f32max = float(np.finfo(np.float32).max)
    assert over.sum() >= 8 and (np.abs(exact[over][:, :2]) > f32max).all()  # columns 1 and -1: beyond fp32
    t = exact[tiny][:, probes.TINY_COL]
    assert tiny.sum() >= 8 and (t < 0).all() and (-t < 2.0**-149).all()  # negative, below the smallest step
    for other in ("fp16", "e4m3"):  # no such rows where the products cannot leave fp32's range
        assert "overflow" not in probes.dot_inputs(other, *SHAPE)["families"]


@pytest.mark.parametrize("fmt", probes.RANGE_FORMATS)
def test_fit_reports_the_rules_the_hardware_follows(fmt: str) -> None:
    inp = probes.dot_inputs(fmt, *SHAPE)
    base = tensor_core("sm90", fmt)
    name = f"{fmt}_{'_'.join(map(str, SHAPE))}"
    for overflow, zero_sign in itertools.product(*fit.RULES.values()):
        hw = dataclasses.replace(base, overflow=overflow, zero_sign=zero_sign)
        prob = fit.dot_problem(name, probes.dot_record(fmt, inp, _hardware(fmt, hw, inp), "wgmma"))
        model, rules = fit.settle_rules(base, [prob], log=lambda _s: None)
        assert model == hw
        assert rules["overflow"]["value"] == overflow and rules["zero_sign"]["value"] == zero_sign
        for r in ("overflow", "zero_sign"):
            n = rules[r]["outputs"]
            assert n > 0 and rules[r]["exact"][rules[r]["value"]] == n
            assert min(rules[r]["exact"].values()) < n
        assert fit.score_dot(model, prob)[1].all()  # every output, as bits


def test_rules_unsettled_without_those_rows() -> None:
    """fp16 probes cannot leave fp32's range: the fit keeps the model's values and says so."""
    inp = probes.dot_inputs("fp16", *SHAPE)
    base = tensor_core("sm90", "fp16")
    hw = dataclasses.replace(base, overflow="inf", zero_sign="positive")
    prob = fit.dot_problem("fp16_16_16_32", probes.dot_record("fp16", inp, _hardware("fp16", hw, inp)))
    model, rules = fit.settle_rules(base, [prob], log=lambda _s: None)
    assert model == base and rules["overflow"]["outputs"] == rules["zero_sign"]["outputs"] == 0


def test_fit_dot_carries_the_rules() -> None:
    inp = probes.dot_inputs("bf16", *SHAPE)
    hw = dataclasses.replace(tensor_core("sm90", "bf16"), overflow="inf", zero_sign="positive")
    v = probes.dot_record("bf16", inp, _hardware("bf16", hw, inp), "wgmma")
    res = fit.fit_dot("bf16_16_16_32", v, coarse_rows=64, log=lambda _s: None)
    assert res["rules"]["overflow"]["value"] == "inf" and res["rules"]["zero_sign"]["value"] == "positive"
    assert res["model"].overflow == "inf" and res["agreement"] == 1.0
