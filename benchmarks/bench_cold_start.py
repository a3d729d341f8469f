"""Time to the first result: each entry point in a fresh process with an empty numba cache, then warm.

For every entry point a new Python process starts with ``NUMBA_CACHE_DIR`` set to a new empty folder (so
nothing compiled earlier is reused), imports simfloat, and times the entry point's first call (compiling
included) and then the same call again (warm: the machine code in memory). Printed per entry point: the first
call's seconds, the warm call's seconds, and the seconds numba spent compiling (its ``numba:compile`` events).

    python benchmarks/bench_cold_start.py [--only NAME ...] [--cpu N] [--default-job]

``--cpu N`` pins every process to core N (``taskset``-like, Linux), for figures of one core. The entry points:
``import`` (``import simfloat``), ``flash-triton-bf16``, ``flash-h200-bf16``, ``baseline`` (``pytorch-bf16``)
and ``backward`` (``flash_backward`` of ``triton-bf16``) on a (1, 1, 64, 16) input, ``attribute-quick``
(``simfloat attribute --quick``); ``--default-job`` adds ``attribute`` (the default job, minutes).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_SETUP = """
import json, sys, time
t0 = time.perf_counter()
import numpy as np
import simfloat as sf
from simfloat._compiling import compile_seconds
t_import = time.perf_counter() - t0
g = np.random.default_rng(0)
q, k, v = (sf.round(g.standard_normal((1, 1, 64, 16)), "bf16") for _ in range(3))
"""

_CALLS = {
    "flash-triton-bf16": "from simfloat.attention import flash\ncall = lambda: flash(q, k, v, plan='triton-bf16')",
    "flash-h200-bf16": "from simfloat.attention import flash\ncall = lambda: flash(q, k, v, plan='h200-bf16')",
    "baseline": "from simfloat.attention import baseline\ncall = lambda: baseline(q, k, v, plan='pytorch-bf16')",
    "backward": (
        "from simfloat.attention import flash, flash_backward, lse_from_stats\n"
        "do = sf.round(g.standard_normal(q.shape), 'bf16')\n"
        "def call():\n"
        "    o, m, l = flash(q, k, v, plan='triton-bf16', return_stats=True)\n"
        "    lse = lse_from_stats(m, l, plan='triton-bf16')\n"
        "    return flash_backward(q, k, v, sf.round(o, 'bf16'), do, lse, plan='triton-bf16')"
    ),
    "attribute-quick": (
        "import contextlib, io, tempfile\n"
        "from simfloat.cli import main\n"
        "def call():\n"
        "    with tempfile.TemporaryDirectory() as d, contextlib.redirect_stdout(io.StringIO()):\n"
        "        rc = main(['attribute', '--quick', '--out', d])\n"
        "    assert rc == 0, rc"
    ),
    "attribute": (
        "import contextlib, io, tempfile\n"
        "from simfloat.cli import main\n"
        "def call():\n"
        "    with tempfile.TemporaryDirectory() as d, contextlib.redirect_stdout(io.StringIO()):\n"
        "        rc = main(['attribute', '--out', d])\n"
        "    assert rc == 0, rc"
    ),
}

_TIMED = """
c0 = compile_seconds()
t = time.perf_counter()
call()
first = time.perf_counter() - t
compiled = compile_seconds() - c0
t = time.perf_counter()
call()
warm = time.perf_counter() - t
res = dict(import_s=t_import, first_s=first, warm_s=warm, compile_s=compiled, simfloat=sf.__file__)
print("RESULT " + json.dumps(res))
"""

_IMPORT_ONLY = """
res = dict(import_s=t_import, first_s=t_import, warm_s=None, compile_s=0.0, simfloat=sf.__file__)
print('RESULT ' + json.dumps(res))
"""


def _script(name: str) -> str:
    if name == "import":
        return _SETUP + _IMPORT_ONLY
    return _SETUP + _CALLS[name] + "\n" + _TIMED


def run_one(name: str, cpu: int | None, src: str = ROOT) -> dict[str, float | None]:
    """The figures of one entry point, measured in a fresh process with an empty numba cache, on the
    simfloat found at ``src``."""
    with tempfile.TemporaryDirectory(prefix="simfloat-cold-") as cache:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache, PYTHONPATH=src, SIMFLOAT_QUIET_COMPILE="1")
        env.setdefault("OPENBLAS_NUM_THREADS", "1")
        pre = ["taskset", "-c", str(cpu)] if cpu is not None else []
        t = time.perf_counter()
        # run from the empty cache folder: `python -c` puts the working directory first on sys.path, so a run
        # started inside a checkout would import that checkout's simfloat whatever ``src`` says
        proc = subprocess.run(
            [*pre, sys.executable, "-c", _script(name)], env=env, capture_output=True, text=True, cwd=cache
        )
        wall = time.perf_counter() - t
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{name} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    out = json.loads(lines[-1][len("RESULT ") :])
    where = out.pop("simfloat", None)
    if where is not None and not os.path.realpath(where).startswith(os.path.realpath(src) + os.sep):
        raise RuntimeError(f"{name} imported simfloat from {where}, not from --src {src}")
    out["process_s"] = wall
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="+", choices=["import", *_CALLS], help="these entry points only")
    ap.add_argument("--cpu", type=int, default=None, help="pin every process to this core")
    ap.add_argument("--default-job", action="store_true", help="also the default `simfloat attribute` job")
    ap.add_argument("--src", default=ROOT, help="the source tree to measure (default: this repository)")
    ap.add_argument("--json", default=None, help="also write the figures to this JSON file")
    args = ap.parse_args(argv)
    names = args.only or ["import", *[n for n in _CALLS if n != "attribute" or args.default_job]]
    import numba
    import numpy as np

    print(
        f"python {platform.python_version()}, numpy {np.__version__}, numba {numba.__version__}; "
        f"{platform.processor() or platform.machine()}; cpu {args.cpu if args.cpu is not None else 'any'}; "
        f"load {os.getloadavg()[0]:.2f}; a fresh NUMBA_CACHE_DIR per entry point"
    )
    print(f"{'entry point':20s} {'first (s)':>10s} {'compiling (s)':>14s} {'warm (s)':>10s}")
    rows = {}
    for name in names:
        r = run_one(name, args.cpu, args.src)
        rows[name] = r
        warm = "" if r["warm_s"] is None else f"{r['warm_s']:10.4f}"
        print(f"{name:20s} {r['first_s']:10.1f} {r['compile_s']:14.1f} {warm}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(load=os.getloadavg(), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
