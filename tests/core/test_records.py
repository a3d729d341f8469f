"""The engines' parameter records as numpy records (:func:`simfloat._jit.record_of`).

The vector engines pass a plan's parameters, its lanes and its dot models to compiled code as numpy records
(one pointer each) instead of NamedTuples (every number an argument). The record is made from the NamedTuple's
declared field types, so a value of another type would be converted on the way: every record of every preset
must read back exactly the tuple it was made from (floats bit for bit, NaN and the sign of zero included).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np
import pytest

from simfloat._jit import record_dtype, record_of
from simfloat._lanes import lane, lane_of
from simfloat.accumulate._rows import mma
from simfloat.attention import backward_presets
from simfloat.attention._flash_params import FlashParams, flash_params
from simfloat.attention.plan import plan, presets
from simfloat.formats import format as _format
from simfloat.rounding import RoundingMode

_ARRAYS = ("ex2_tab", "ex2_poly")


def _same(a: Any, b: Any) -> bool:
    """a == b, floats by their bits (NaN, -0.0), bools as bools."""
    if isinstance(b, (bool, np.bool_)):
        return isinstance(a, (bool, np.bool_)) and bool(a) == bool(b)
    if isinstance(b, float):
        return np.float64(a).tobytes() == np.float64(b).tobytes()
    return int(a) == b and float(a) == float(b)


def _check(rec: Any, nt: Any, skip: tuple[str, ...] = (), where: str = "") -> None:
    for name, v in zip(nt._fields, nt, strict=True):
        if name in skip:
            assert name not in rec.dtype.names
            continue
        r = rec[name]  # (not getattr: a field may share a name with a numpy method, as MMA.prod)
        if isinstance(v, tuple):
            _check(r, v, where=f"{where}.{name}")
        else:
            assert _same(r, v), f"{where}.{name}: {v!r} became {r!r}"


@pytest.mark.parametrize("name", sorted(presets()))
def test_every_preset_record_reads_back_its_params(name: str) -> None:
    pl = plan(name)
    fp = flash_params(pl, 0.125)
    _check(record_of(fp, skip=_ARRAYS), fp, _ARRAYS, name)
    if not pl.quantized:  # the baseline's params (plans with quantizers have no baseline)
        pp = pl.params(0.125)
        _check(record_of(pp, skip=("ex2_tab",)), pp, ("ex2_tab",), name)
    for dot in (pl.qk, pl.pv):
        m = mma(dot)
        _check(record_of(m), m, where=name)


@pytest.mark.parametrize("name", sorted(backward_presets()))
def test_every_backward_preset_record_reads_back_its_params(name: str) -> None:
    bp = backward_presets()[name].params(0.125)
    _check(record_of(bp, skip=("ex2_tab",)), bp, ("ex2_tab",), name)


@pytest.mark.parametrize("fmt", ["float64", "float32", "bfloat16", "float16", "fp8_e4m3", "fp8_e5m2", "fp4_e2m1"])
@pytest.mark.parametrize("mode", [m for m in RoundingMode if m != RoundingMode.STOCHASTIC])
def test_every_lane_reads_back(fmt: str, mode: RoundingMode) -> None:
    ln = lane(_format(fmt), int(mode))
    _check(record_of(ln), ln, where=f"{fmt}/{mode.name}")
    # the compiled loops take a record's lane as a value (lane_of, which names every field): the same numbers
    back = lane_of(record_of(ln))
    assert type(back) is type(ln)
    _check(record_of(back), ln, where=f"lane_of {fmt}/{mode.name}")


class _Inner(NamedTuple):
    flag: bool
    n: int


class _Outer(NamedTuple):
    x: float
    inner: _Inner
    table: np.ndarray


def test_nested_records_and_skipped_arrays() -> None:
    nt = _Outer(-0.0, _Inner(True, -3), np.zeros(2))
    rec = record_of(nt, skip=("table",))
    assert rec.dtype.names == ("x", "inner")
    _check(rec, nt, ("table",))
    assert math.copysign(1.0, rec["x"]) == -1.0
    # equal tuples give equal bytes (the padding is zeroed), so records can be compared or hashed by their bytes
    assert rec.tobytes() == record_of(_Outer(-0.0, _Inner(True, -3), np.ones(3)), skip=("table",)).tobytes()


def test_an_array_field_must_be_skipped() -> None:
    with pytest.raises(TypeError, match="table"):
        record_dtype(_Outer)
    with pytest.raises(TypeError, match="ex2_tab"):
        record_dtype(FlashParams, skip=("ex2_poly",))
