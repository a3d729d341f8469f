"""The CPU-target check's workload (tests/core/test_cpu_target.py): a few small runs of every engine, saved as .npy.

``python cpu_target.py OUT`` runs them in a fresh process, compiled for whatever ``NUMBA_CPU_NAME`` /
``NUMBA_CPU_FEATURES`` say (numba's host CPU by default), and writes each output array to ``OUT/<name>.npy``, and
``OUT/target.json``: the CPU name and features numba compiled for, and whether the machine code of the hardware
FMA helper (``simfloat._jit.fma64``) holds an FMA instruction. Inputs are pure numpy (small integers over 32:
exact in bf16), so that every bit of an output comes from simfloat's compiled code.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np

#: Shapes of q, k, v: a ragged key length (33) so that the last key block is partial.
SHAPE = (1, 2, 33, 16)
#: The rounding modes simfloat.round takes (STOCHASTIC with a seed).
MODES = ("nearest_even", "nearest_away", "toward_zero", "up", "down", "odd", "stochastic")


def _inputs(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return (rng.integers(-96, 97, size=shape) / 32.0).astype(np.float32)


def _round_input(rng: np.random.Generator) -> np.ndarray:
    """Values over every range a rounding meets: normals of many scales, subnormals, ties, zeros, inf, NaN."""
    x = rng.standard_normal(2048) * np.exp2(rng.integers(-140, 140, size=2048))
    ties = (rng.integers(1, 1 << 9, size=256) * 2 + 1) * np.exp2(-9.0)  # halfway between bf16 neighbours
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 5e-324, -5e-324, 1e-40, 3.4e38, -3.4e38])
    return np.concatenate([x, ties, -ties, special])


def _near_ties(rng: np.random.Generator, frac_bits: int, op: str, n: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """Operands whose float64 result (``a * b``, ``a / b``, ``sqrt(a)``) is exactly a midpoint between two
    neighbours of a format with ``frac_bits`` fraction bits while the exact result is not: only the error term
    the ops take from the hardware FMA says which way to round (an unfused ``a*b + c`` gets them wrong)."""
    from fractions import Fraction

    a_out, b_out = [], []
    while len(a_out) < n:
        k = int(rng.integers(0, 1 << frac_bits))
        m = 1.0 + (2 * k + 1) * 2.0 ** -(frac_bits + 1)  # a midpoint in [1, 2)
        b = float(1.0 + rng.integers(1, 1 << 52) * 2.0**-52)  # 53 bits: the exact results are not float64
        if op == "mul":
            a = m / b
            exact = Fraction(a) * Fraction(b)
            got = a * b
        elif op == "div":
            a = m * b
            exact = Fraction(a) / Fraction(b)
            got = a / b
        else:  # a float64 neighbour of m**2 (exact in float64): its square root is m to float64
            a = float(np.nextafter(m * m, np.inf if rng.integers(2) else -np.inf))
            exact = Fraction(a)
            got = float(np.sqrt(a))
            if got == m and exact != Fraction(m) ** 2:
                a_out.append(a)
                b_out.append(0.0)
            continue
        if got == m and exact != m:
            a_out.append(a)
            b_out.append(b)
    return np.array(a_out), np.array(b_out)


def outputs() -> dict[str, np.ndarray]:
    """Every output of the workload by name (float arrays; the caller compares their bits)."""
    import simfloat
    from simfloat.attention import baseline, flash, flash_backward, lse_from_stats

    rng = np.random.default_rng(20261205)
    q, k, v, do = (_inputs(rng, SHAPE) for _ in range(4))
    out: dict[str, np.ndarray] = {}
    for name in ("triton-bf16", "h200-bf16", "fp8-e4m3"):  # triton-bf16: fma64 (contract) in the exp argument
        out[f"flash-{name}"] = flash(q, k, v, plan=name, block_m=16, block_n=16)
    out["flash-triton-bf16-reference"] = flash(q, k, v, plan="triton-bf16", block_m=16, block_n=16, engine="reference")
    out["baseline-pytorch-fp32"] = baseline(q, k, v, plan="pytorch-fp32")
    o, m, l = flash(q, k, v, plan="triton-bf16", block_m=16, block_n=16, return_stats=True)  # noqa: E741
    lse = lse_from_stats(m, l, plan="triton-bf16")
    for i, g in enumerate(flash_backward(q, k, v, o, do, lse, plan="triton-bf16", block_m=16, block_n=16)):
        out[f"backward-triton-bf16-{'qkv'[i]}"] = g
    a, b = _inputs(rng, (8, 64)), _inputs(rng, (64, 8))
    out["matmul-sm90-bf16"] = simfloat.matmul(a, b, acc=simfloat.tensor_core("sm90", "bf16"))
    x = _round_input(rng)
    y = rng.standard_normal(x.size)
    for mode in MODES:
        seed = 7 if mode == "stochastic" else None
        out[f"round-bf16-{mode}"] = simfloat.round(x, "bf16", mode, seed=seed)
        out[f"round-e4m3-{mode}"] = simfloat.round(x, "e4m3", mode, seed=seed)
    # the exactly rounded ops take their error terms from the hardware FMA (fma64)
    out["ops-mul-bf16"] = simfloat.ops.mul(x, y, "bf16")
    out["ops-div-fp16"] = simfloat.ops.div(x, y, "fp16")
    out["ops-sqrt-fp32"] = simfloat.ops.sqrt(np.abs(x), "fp32")
    out["ops-fma-bf16"] = simfloat.ops.fma(x, y, x[::-1].copy(), "bf16")
    for fmt, bits in (("bf16", 7), ("fp32", 23)):
        a, b = _near_ties(rng, bits, "mul")
        out[f"ops-mul-{fmt}-ties"] = simfloat.ops.mul(a, b, fmt)
        a, b = _near_ties(rng, bits, "div")
        out[f"ops-div-{fmt}-ties"] = simfloat.ops.div(a, b, fmt)
        a, _ = _near_ties(rng, bits, "sqrt")
        out[f"ops-sqrt-{fmt}-ties"] = simfloat.ops.sqrt(a, fmt)
    return out


def target() -> dict[str, object]:
    """What numba compiled for: its CPU name and features, and whether fma64's machine code uses an FMA
    instruction (x86 ``vfmadd``) or calls a function (the correctly rounded software ``fma``)."""
    import numba
    from numba.core import config
    from numba.core.registry import cpu_target

    from simfloat._jit import fma64

    @numba.njit(cache=False)
    def probe(a, b, c):
        return fma64(a, b, c)

    probe(1.0, 2.0, 3.0)
    asm = probe.inspect_asm(probe.signatures[0])
    triple, cpu, features = cpu_target.target_context.codegen().magic_tuple()
    return {
        "config_cpu_name": config.CPU_NAME,
        "cpu": cpu,
        "features": features,
        "fma_instruction": bool(re.search(r"\bvfn?m(add|sub)", asm)),
        "fma_call": bool(re.search(r"\b(call|jmp)\w*\s+\S*\bfma\b|\$fma\b", asm)),  # direct or via a register
    }


def main(out_dir: str) -> None:
    """Write the outputs and the target description into ``out_dir``."""
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    for name, arr in outputs().items():
        np.save(d / f"{name}.npy", np.ascontiguousarray(arr))
    (d / "target.json").write_text(json.dumps(target(), indent=1))


if __name__ == "__main__":
    main(sys.argv[1])
