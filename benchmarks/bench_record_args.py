"""What a compiled function's record argument costs to compile: a NamedTuple (numba flattens it into one scalar
argument per field, at every call and every read) against a numpy structured record (numba passes a pointer).

The shape is the engine's: a plan's parameters as nested records (an op = a format's ten fields + a rounding
mode; 30 ops and 20 scalars, some 350 fields), read by a function that calls a small op helper 40 times, itself
called from a loop. Both forms compute the same value; the script checks it and prints each form's compile time
(process CPU time of the first call, a fresh process, no cache).

    python benchmarks/bench_record_args.py
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

import numba
import numpy as np

N_OPS, N_SCALARS, N_READS = 30, 20, 40


class Format(NamedTuple):
    a: int
    b: int
    c: int
    d: int
    e: int
    f: int
    g: int
    h: int
    i: int
    j: int


class Op(NamedTuple):
    p: Format
    mode: int


def _params() -> tuple[Any, Any]:
    """The same parameters as a NamedTuple and as a structured record."""
    fields = [f"o{i}" for i in range(N_OPS)] + [f"x{i}" for i in range(N_SCALARS)]
    Params = NamedTuple("Params", [(f, Any) for f in fields])  # type: ignore[misc]
    ops = [Op(Format(*(k + i for k in range(10))), 1 + i % 2) for i in range(N_OPS)]
    scalars = [i + 1 for i in range(N_SCALARS)]
    nt = Params(*ops, *scalars)
    fmt = np.dtype([(c, np.int64) for c in Format._fields])
    op = np.dtype([("p", fmt), ("mode", np.int64)])
    arr = np.zeros(1, np.dtype([(f"o{i}", op) for i in range(N_OPS)] + [(f"x{i}", np.int64) for i in range(N_SCALARS)]))
    for i, o in enumerate(ops):
        arr[0][f"o{i}"]["p"] = tuple(o.p)
        arr[0][f"o{i}"]["mode"] = o.mode
    for i, s in enumerate(scalars):
        arr[0][f"x{i}"] = s
    return nt, arr[0]


@numba.njit
def _op(x, o):
    if o.mode == 1:
        return x * o.p.a + o.p.b
    return x - o.p.c


def _body_source() -> str:
    lines = ["def body(pp, x):", "    s = 0.0"]
    for i in range(N_READS):
        lines += [f"    s += op(x, pp.o{i % N_OPS})", f"    if s > {i}.0:", f"        s -= pp.x{i % N_SCALARS}"]
    return "\n".join([*lines, "    return s", ""])


def _compiled() -> Any:
    ns: dict[str, Any] = {"op": _op}
    exec(_body_source(), ns)  # noqa: S102 - a generated benchmark body
    body = numba.njit(ns["body"])

    @numba.njit
    def loop(pp, x):
        t = 0.0
        for k in range(8):
            t += body(pp, x + k)
        return t

    return loop


def main() -> None:
    nt, rec = _params()
    numba.njit(lambda x: x + 1)(1)  # numba's own start-up, outside both timings
    print(f"numba {numba.__version__}; {N_OPS} ops of 11 fields + {N_SCALARS} scalars, {N_READS} reads")
    values = []
    for name, arg in (("NamedTuple (flattened)", nt), ("structured record (a pointer)", rec)):
        f = _compiled()
        t = time.process_time()
        values.append(f(arg, 3.0))
        print(f"  {name:32s} compile + first call {time.process_time() - t:6.2f} s")
    assert values[0] == values[1], values


if __name__ == "__main__":
    main()
