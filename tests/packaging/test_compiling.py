"""The compile notice (once, at the first compilation of a simfloat kernel; silenced by its env var) and the
compile clock that keeps progress bars' rates, hence their ETAs, free of compile time."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numba
import pytest
from numba.core import event

from simfloat import _compiling
from simfloat._compiling import NOTICE, QUIET_ENV, BarClock, compile_seconds

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _fresh(module: str):
    """A new, uncached njit function that numba sees as defined in ``module``."""

    def f(x):
        return x * 2 + 1

    f.__module__ = module
    f.__qualname__ = f.__name__ = f"f_{time.perf_counter_ns()}"
    return numba.njit(cache=False)(f)


@pytest.fixture
def unnoticed(monkeypatch):
    monkeypatch.setattr(_compiling._CLOCK, "noticed", False)
    monkeypatch.delenv(QUIET_ENV, raising=False)


def test_notice_once_at_the_first_simfloat_compilation(unnoticed, capsys):
    _fresh("user_code")(1)  # someone else's numba code: no notice
    assert NOTICE not in capsys.readouterr().err
    _fresh("simfloat.some_module")(1)
    _fresh("simfloat.other_module")(2)
    err = capsys.readouterr().err
    assert err.count(NOTICE) == 1


def test_notice_silenced_by_env(unnoticed, monkeypatch, capsys):
    monkeypatch.setenv(QUIET_ENV, "1")
    _fresh("simfloat.some_module")(1)
    assert NOTICE not in capsys.readouterr().err


def test_compile_seconds_count_compilations():
    c0 = compile_seconds()
    _fresh("user_code")(3)
    assert compile_seconds() > c0
    c1 = compile_seconds()
    time.sleep(0.05)  # no compilation: the clock stands still
    assert compile_seconds() == c1


def _fake_compile(seconds: float) -> None:
    data = dict(dispatcher=None, args=(), return_type=None)
    with event.trigger_event("numba:compile", data=data):
        time.sleep(seconds)


@pytest.mark.parametrize("clocked", [True, False])
def test_bar_rate_leaves_out_compile_time(clocked):
    tqdm = pytest.importorskip("tqdm").tqdm
    bar = tqdm(total=10, mininterval=0, file=open(os.devnull, "w"))  # noqa: SIM115
    clock = BarClock(bar)
    _fake_compile(0.5)  # the first run compiles for 0.5 s and then takes no time
    if clocked:
        clock.update(1)
    else:
        bar.update(1)
    rate = bar.format_dict["rate"]
    bar.close()
    if clocked:  # ETA from the run's own time: 9 runs left take well under the compile's 0.5 s each
        assert rate is not None and rate > 20
    else:  # the plain bar counts the compilation (the failure this clock fixes)
        assert rate is not None and rate < 2.5


def test_bar_rate_leaves_out_compile_time_reported_by_workers():
    tqdm = pytest.importorskip("tqdm").tqdm
    bar = tqdm(total=10, mininterval=0, file=open(os.devnull, "w"))  # noqa: SIM115
    clock = BarClock(bar)
    time.sleep(0.5)  # a worker process compiled for 0.5 s (this process did not)
    clock.update(1, compiled=0.5)
    assert bar.format_dict["rate"] > 20
    bar.close()


def test_notice_in_a_fresh_process_then_not_from_the_cache(tmp_path):
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path), PYTHONPATH=ROOT)
    env.pop(QUIET_ENV, None)
    code = "import numpy as np, simfloat as sf; sf.round(np.zeros(3), 'bf16')"

    def stderr(**extra: str) -> str:
        out = subprocess.run([sys.executable, "-c", code], env={**env, **extra}, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        return out.stderr

    assert stderr(**{QUIET_ENV: "1"}).count(NOTICE) == 0  # silenced (and it fills the cache)
    assert stderr().count(NOTICE) == 0  # all from the cache: nothing compiles, nothing said
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    assert stderr(NUMBA_CACHE_DIR=str(fresh)).count(NOTICE) == 1


def test_plans_with_and_without_an_ex2_table_share_the_compiled_engine(monkeypatch):
    """numba compiles a kernel per type of its arguments, read-only flags included: the H200's ex2 table is
    read-only, so the empty table of the other plans is too, and one compiled flash engine serves both (the
    numba types of the vector loop's arguments, its kernel values included, are compared, whatever else this
    process compiled before)."""
    import importlib

    import numba
    import numpy as np

    import simfloat as sf
    from simfloat.attention import flash

    loop = importlib.import_module("simfloat.attention.vector.forward")  # the vector loop's driver calls run_rows

    real = loop.run_rows
    types = []

    def spy(fn, n, *args):
        types.append(tuple(numba.typeof(a) for a in args))
        return real(fn, n, *args)

    monkeypatch.setattr(loop, "run_rows", spy)
    g = np.random.default_rng(0)
    q, k, v = (sf.round(g.standard_normal((1, 1, 40, 16)), "bf16") for _ in range(3))
    for name in ("triton-bf16", "h200-bf16"):
        flash(q, k, v, plan=name, engine="vector")
    assert len(types) == 2 and types[0] == types[1], types
