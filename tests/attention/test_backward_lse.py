"""The backward's log-sum-exp (``lse_from_stats``, D3) is rounded once from the exact logarithm, in float64 too:
checked against mpmath at 200 bits in every directed mode."""

import math

import mpmath
import numpy as np
import pytest

from simfloat.attention import lse_from_stats
from simfloat.attention._backward_inputs import log_rounded as _log_rounded
from simfloat.attention.backward_plan import backward_plan
from simfloat.attention.plan import OpSpec

MODES = ("nearest_even", "toward_zero", "up", "down")


def _expected(x: float, mode: str, base2: bool) -> float:
    with mpmath.workprec(200):
        v = mpmath.log(mpmath.mpf(x), 2) if base2 else mpmath.log(mpmath.mpf(x))
        f = float(v)  # nearest
        if mpmath.mpf(f) == v or mode == "nearest_even":
            return f
        lo, hi = (f, math.nextafter(f, math.inf)) if mpmath.mpf(f) < v else (math.nextafter(f, -math.inf), f)
    return {"toward_zero": lo if v > 0 else hi, "up": hi, "down": lo}[mode]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("base2", [True, False])
def test_float64_logs_are_rounded_once_from_the_exact_value(mode, base2):
    rng = np.random.default_rng(7)
    x = np.concatenate([rng.uniform(1.0, 300.0, 300), [1.0, 2.0, 64.0, 3.0, 1.0 + 2.0**-40]])
    got = _log_rounded(x, OpSpec("float64", mode), base2)
    want = np.array([_expected(float(v), mode, base2) for v in x])
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, [(x[i], got[i], want[i]) for i in bad[:5]]


def test_fp64_plan_lse_and_narrow_formats():
    rng = np.random.default_rng(3)
    m = rng.normal(0, 3, (2, 97))
    l = rng.uniform(1.0, 97.0, (2, 97))  # noqa: E741
    pl = backward_plan("fp64")
    lse = lse_from_stats(m, l, plan=pl)
    logs = np.array([_expected(float(v), "nearest_even", pl.exp2) for v in l.ravel()]).reshape(l.shape)
    assert np.array_equal(lse, m + logs)  # float64 addition rounds once, as the lse op does
    for fmt in ("float32", "bfloat16"):  # narrow formats: round to odd in float64, then into fmt
        got = _log_rounded(l.ravel(), OpSpec(fmt, "toward_zero"), True)
        want = []
        for v in l.ravel():
            with mpmath.workprec(200):
                e = mpmath.log(mpmath.mpf(float(v)), 2)
                bits = 24 if fmt == "float32" else 8
                k = int(mpmath.floor(mpmath.log(e, 2))) - bits + 1
                want.append(float(mpmath.floor(e / mpmath.mpf(2) ** k) * mpmath.mpf(2) ** k))
        assert np.array_equal(got, np.array(want)), fmt
