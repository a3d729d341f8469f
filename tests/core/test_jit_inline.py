"""numba's inlining of ``ljit`` helpers with the IR built once per helper (``simfloat._jit._memoize_inlined_ir``).

The memoized IR must give the code numba's own inliner gives: each call site its own copy (the sites' variables
never mix), nested helpers inlined too, the helper's branches intact; and numba's front end runs once per helper,
not once per call site.
"""

from __future__ import annotations

import numba
import pytest
from numba.core.inline_closurecall import InlineWorker

import simfloat._jit  # noqa: F401  (installs the memoized inliner)


def _inner(x):
    return x * 2.0 if x > 0.0 else -x


def _helper(x, y):
    t = _inner_j(x)  # nested: inlined into the helper's IR, then with it into each site
    if y > t:
        return y - t
    return t + 1.0


_inner_j = numba.njit(inline="always")(_inner)
_helper_j = numba.njit(inline="always")(_helper)


@numba.njit
def _three_sites(a, b):
    u = _helper_j(a, b)
    v = _helper_j(b, a)  # another site: its own variables
    w = _helper_j(u, v)
    return u, v, w


def _three_sites_py(a, b):
    u = _helper(a, b)
    v = _helper(b, a)
    w = _helper(u, v)
    return u, v, w


def test_memo_installed():
    assert getattr(InlineWorker, "_simfloat_memo", False)


@pytest.mark.parametrize("a,b", [(1.5, 7.0), (-2.0, 0.5), (3.0, -4.0), (0.0, 0.0), (-1.0, -1.0)])
def test_sites_compute_what_python_computes(a, b):
    assert _three_sites(a, b) == _three_sites_py(a, b)


def test_front_end_runs_once_per_helper(monkeypatch):
    built: list[str] = []
    run = InlineWorker.run_untyped_passes

    def counting(self, func, enable_ssa=False):
        built.append(func.__name__)
        return run(self, func, enable_ssa)

    monkeypatch.setattr(InlineWorker, "run_untyped_passes", counting)

    def caller(a, b):
        return _helper_j(a, b) + _helper_j(b, a) + _helper_j(a, a) + _helper_j(b, b)

    f = numba.njit(caller)
    assert f(2.0, 5.0) == sum(_helper(*ab) for ab in ((2.0, 5.0), (5.0, 2.0), (2.0, 2.0), (5.0, 5.0)))
    # _helper was built by an earlier compile of this process or now, once; never once per site
    assert built.count("_helper") <= 1
    assert built.count("_inner") <= 1
