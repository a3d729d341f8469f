"""simfloat.metrics.error_metrics against hand-computed values and independent formulas."""

from __future__ import annotations

import math

import numpy as np
import pytest

from simfloat.metrics import METRIC_KEYS, error_metrics


def test_hand_computed():
    ref = np.array([1.0, -2.0, 0.0, 4.0, 2.0])
    x = np.array([1.5, -2.0, 0.5, 3.0, 2.0])
    m = error_metrics(x, ref)
    assert list(m) == list(METRIC_KEYS)
    # |e| = 0.5, 0, 0.5, 1, 0
    assert m["max_abs"] == 1.0
    assert m["mean_abs"] == pytest.approx(0.4)
    assert m["std_abs"] == pytest.approx(math.sqrt((0.01 + 0.16 + 0.01 + 0.36 + 0.16) / 5))
    assert m["rmse"] == pytest.approx(math.sqrt(1.5 / 5))
    rel = [0.5 / (1 + 1e-5), 0.0, 0.5 / 1e-5, 1 / (4 + 1e-5), 0.0]
    assert m["mre"] == pytest.approx(sum(rel) / 5)
    assert m["mre_last4"] == pytest.approx(sum(rel[1:]) / 4)
    dot, nx, nr = 1.5 - 2 * -2.0 + 0 + 12 + 4, math.sqrt(2.25 + 4 + 0.25 + 9 + 4), math.sqrt(1 + 4 + 16 + 4)
    assert m["cos_sim"] == pytest.approx(dot / (nx * nr))
    assert m["rel_l1"] == pytest.approx(2.0 / 9.0)
    assert m["snr_db"] == pytest.approx(10 * math.log10(25 / 1.5))


def test_independent_formulas_random():
    rng = np.random.default_rng(5)
    ref = rng.standard_normal((7, 33))
    x = ref + 1e-3 * rng.standard_normal(ref.shape)
    m = error_metrics(x.astype(np.float32), ref)
    x = x.astype(np.float32).astype(np.float64)
    e = x - ref
    assert m["rmse"] == pytest.approx(np.linalg.norm(e) / math.sqrt(e.size))
    assert m["cos_sim"] == pytest.approx(
        1 - 0.5 * np.linalg.norm(x / np.linalg.norm(x) - ref / np.linalg.norm(ref)) ** 2
    )
    assert m["snr_db"] == pytest.approx(20 * math.log10(np.linalg.norm(ref) / np.linalg.norm(e)))
    assert m["rel_l1"] == pytest.approx(np.linalg.norm(e.ravel(), 1) / np.linalg.norm(ref.ravel(), 1))
    # per row along the last axis: the mean of the rows' values
    r = error_metrics(x, ref, axis=-1)
    rows = [error_metrics(x[i], ref[i]) for i in range(7)]
    for key in ("cos_sim", "rel_l1", "snr_db", "mre_last4"):
        assert r[key] == pytest.approx(np.mean([row[key] for row in rows]))
    for key in ("max_abs", "mean_abs", "std_abs", "rmse", "mre"):
        assert r[key] == m[key]
    assert error_metrics(x.T, ref.T, axis=0)["cos_sim"] == pytest.approx(r["cos_sim"])


def test_edge_cases_and_errors():
    z = np.zeros(3)
    m = error_metrics(z, z)
    assert m["max_abs"] == 0 and m["snr_db"] != m["snr_db"] and math.isnan(m["cos_sim"]) and math.isnan(m["rel_l1"])
    assert error_metrics(np.ones(3), np.ones(3))["snr_db"] == math.inf
    assert error_metrics(np.ones(3), z)["rel_l1"] == math.inf
    with pytest.raises(ValueError, match="shape"):
        error_metrics(np.ones(3), np.ones(4))
    with pytest.raises(ValueError, match="no elements"):
        error_metrics(np.ones(0), np.ones(0))
    with pytest.raises(TypeError, match="x must be a real numeric"):
        error_metrics(np.array(["a"]), np.ones(1))
    with pytest.raises(ValueError, match="axis 2"):
        error_metrics(np.ones((2, 2)), np.ones((2, 2)), axis=2)
