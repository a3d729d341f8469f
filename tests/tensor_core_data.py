"""The independent lab's tensor-core measurements (tests/fixtures/tensor_cores: Khattak & Mikaitis, arXiv
2512.07004) as the tests read them: per data set the operands, C and the measured bits, and the count of rows
a tensor_core preset reproduces (tests/core/test_tensor_core_measured.py, tests/core/test_profiles.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from simfloat.accumulate import matmul

DATA = Path(__file__).resolve().parent / "fixtures" / "tensor_cores"
MANIFEST: dict[str, Any] = json.loads((DATA / "manifest.json").read_text())
# the instruction each data set's kernel ran: wmma::mma_sync and the fp8 mma.sync both issue mma.sync
INSTRUCTION = "mma.sync"


def dataset(name: str) -> dict[str, Any]:
    """The manifest entry of the file ``name``."""
    return next(ds for ds in MANIFEST["datasets"] if ds["file"] == name)


def load(name: str, out: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(a, b, c, want): float64 values and the measured result's float32 bits. C is the file's, rounded to fp16
    for fp16 results as the measuring kernel did; zero for the fp32 results whose source validation takes zero
    (H100 fp8: those fit C = 0, its fp16 results the file's C)."""
    ds = dataset(name)
    z = np.load(DATA / name)

    def val(x: np.ndarray) -> np.ndarray:
        return x.astype(np.uint32).view(np.float32).astype(np.float64)

    a, b, c = val(z["a"]), val(z["b"]), val(z["c"])
    if ds["c_used_by_source_validation"] == "zero" and out == "fp32":
        c = np.zeros_like(c)
    if out == "fp16":
        c = c.astype(np.float16).astype(np.float64)
    return a, b, c, z["d_" + out].astype(np.uint32)


def bits(x: np.ndarray) -> np.ndarray:
    """float32 bits of values (fp16 results are fp32 values too)."""
    return np.asarray(x, dtype=np.float64).astype(np.float32).view(np.uint32)


def rows(model: Any, a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """One dot per row: ``c[i] + a[i] . b[i]`` under ``model`` (the vector engine)."""
    return matmul(a[:, None, :], b[:, :, None], c[:, None, None], acc=model)[:, 0, 0]


def lab_counts(arch: str) -> dict[tuple[str, str], tuple[int, int]]:
    """Per (input format, instruction): rows of the arch's fp32-output data sets that
    ``tensor_core(arch, fmt, instruction=...)`` reproduces bit for bit, and their number."""
    from simfloat.accumulate import tensor_core

    out = {}
    for ds in MANIFEST["datasets"]:
        if ds["arch"] != arch or "fp32" not in ds["outputs"]:
            continue
        a, b, c, want = load(ds["file"], "fp32")
        model = tensor_core(arch, ds["input_format"], instruction=INSTRUCTION)
        out[(ds["input_format"], INSTRUCTION)] = (int((bits(rows(model, a, b, c)) == want).sum()), len(want))
    return out
