"""The same bits on every CPU: the engines compiled for a generic x86-64 (SSE2 only: no FMA, no AVX, no
AVX-512) give every output bit for bit as compiled for the host CPU.

Without fastmath LLVM neither contracts ``a*b + c`` nor reassociates, whatever the vector width; where a kernel
asks for a fused multiply-add (``simfloat._jit.fma64`` / ``fma32``, the ``llvm.fma`` intrinsic, never
``llvm.fmuladd``) a CPU without FMA calls the C library's correctly rounded ``fma``. The workload
(``tests/cpu_target.py``) runs flash (triton-bf16 on both engines, h200-bf16, fp8-e4m3), the fp32 baseline, the
triton-bf16 backward, a tensor-core matmul, ``simfloat.round`` in every mode and the exactly rounded ops (on
operands whose float64 result is a midpoint of the format while the exact one is not: there only the error term
of the fused multiply-add decides; an unfused ``fma64`` changes about half of those products and quotients); the
generic build runs in a fresh process with a numba cache of its own (a cold compile: minutes), the native one in
this process (the suite's cache)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import cpu_target
import numpy as np
import pytest

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent


@pytest.mark.slow
@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="the generic target is x86-64's")
def test_every_engine_gives_the_same_bits_compiled_without_fma_or_avx(tmp_path: Path) -> None:
    generic, native = tmp_path / "generic", tmp_path / "native"
    env = dict(
        os.environ,
        NUMBA_CPU_NAME="generic",
        NUMBA_CPU_FEATURES="",
        NUMBA_CACHE_DIR=str(tmp_path / "numba-cache"),
        # glibc's libm picks its exp / log by the CPU it runs on (an FMA build differs in the last bit of some
        # float64 results): ask it for its SSE2 ones too, as on a CPU without FMA or AVX (2.26-2.32 names, then 2.33+)
        GLIBC_TUNABLES="glibc.cpu.hwcaps=-AVX512F_Usable,-AVX2_Usable,-FMA_Usable,-FMA4_Usable,-AVX512F,-AVX2,-FMA,-FMA4",
        SIMFLOAT_QUIET_COMPILE="1",
        PYTHONPATH=os.pathsep.join([str(ROOT), str(TESTS), os.environ.get("PYTHONPATH", "")]),
    )
    run = subprocess.run(
        [sys.executable, str(TESTS / "cpu_target.py"), str(generic)], env=env, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr[-6000:]
    cpu_target.main(str(native))

    gen = json.loads((generic / "target.json").read_text())
    nat = json.loads((native / "target.json").read_text())
    assert gen["cpu"] == "generic" and gen["features"] == ""  # what the generic build was compiled for
    assert not gen["fma_instruction"] and gen["fma_call"], "fma64 without FMA: the software fma, not a fmuladd"
    assert nat["cpu"] != "generic"
    if "+fma" in nat["features"].split(","):  # then the two builds do differ where it matters
        assert nat["fma_instruction"] and not nat["fma_call"]

    names = sorted(p.name for p in native.glob("*.npy"))
    assert names == sorted(p.name for p in generic.glob("*.npy")) and len(names) >= 33
    differ = []
    for name in names:
        a, b = np.load(native / name), np.load(generic / name)
        assert a.dtype == b.dtype and a.shape == b.shape and a.dtype.kind == "f", name
        bits = np.dtype(f"u{a.dtype.itemsize}")
        if not np.array_equal(a.view(bits), b.view(bits)):
            differ.append(f"{name}: {int(np.sum(a.view(bits) != b.view(bits)))} of {a.size}")
    assert not differ, differ
