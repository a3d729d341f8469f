"""experiments/int8_error.py: the fast fp16 standard-attention reference equals simfloat's baseline plan bit
for bit, the metrics are the stated ones, and the smoke run writes its files."""

import os
import sys

import numpy as np
import pytest

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(_ROOT, "experiments"))

import int8_error  # noqa: E402

from simfloat.attention import baseline  # noqa: E402


@pytest.mark.parametrize("kind", int8_error.INPUTS)
def test_fp16_standard_reference_equals_baseline_plan(kind):
    q, k, v = int8_error.make_inputs(kind, 70, 32)
    fast = int8_error.fp16_standard_attention(q, k, v)
    assert np.array_equal(fast, baseline(q, k, v, plan="pytorch-fp16"))


def test_inputs_are_fp16_and_reproducible():
    q, k, v = int8_error.make_inputs("outlier", 200, 64)
    assert np.array_equal(q, q.astype(np.float16).astype(np.float32))
    assert np.array_equal(q, int8_error.make_inputs("outlier", 200, 64)[0])
    assert np.abs(q).max() > 8  # the outlier component is there
    u = int8_error.make_inputs("uniform", 50, 16)[0]
    assert u.min() >= 0 and u.max() <= 1
    with pytest.raises(ValueError, match="unknown input kind"):
        int8_error.make_inputs("cauchy", 4, 4)


def test_metrics():
    ref = np.array([[1.0, -2.0], [0.0, 4.0], [1.0, 1.0]])
    out = ref + np.array([[0.1, 0.0], [0.0, 0.0], [0.0, -0.2]])
    m = int8_error.metrics(out, ref)
    rel = np.array([0.1 / (1 + 1e-5), 0, 0, 0, 0, 0.2 / (1 + 1e-5)])
    assert m["mre_all"] == pytest.approx(rel.mean())
    assert m["mre_last4"] == pytest.approx(rel[-4:].mean())
    assert m["rmse"] == pytest.approx(np.sqrt(0.05 / 6))
    assert m["max_abs"] == pytest.approx(0.2)
    assert m["cos"] == pytest.approx(out.ravel() @ ref.ravel() / np.linalg.norm(out) / np.linalg.norm(ref))


def test_smoke_run_writes_its_files(tmp_path):
    paths = int8_error.main(["--smoke", "--quiet", "--out", str(tmp_path)])
    for p in paths.values():
        assert os.path.getsize(p) > 0
    import pandas as pd

    table = pd.read_csv(paths["csv"])
    assert set(table["input"]) == set(int8_error.INPUTS)
    assert set(int8_error.METHODS) <= set(table["method"])
    assert (table["cos"] > 0.9).all()
    attr = pd.read_csv(paths["attribution"])
    assert {"only q_quant", "only p_quant", "full plan"} <= set(attr["variant"])
    text = open(paths["md"]).read()
    assert "INT-FlashAttention's comparison" in text and "Attribution" in text
