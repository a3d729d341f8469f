"""Cross-validation: the Triton attention kernels against simfloat's emulator, config by config, bit by bit.

    python -m simfloat_gpu.campaign.validate --out DIR [--grid full|ci|smoke] [--backend auto|gpu|faithful] [--jobs N]
    simfloat-gpu validate --out DIR ...                   (the same, through the console script)
    python -m simfloat_gpu.campaign.validate --out DIR --fixtures tests/fixtures/gpu/h200     (emulator vs recorded GPU
    outputs)
    python -m simfloat_gpu.campaign.validate --out DIR --fixtures tests/fixtures/gpu/h200 --plans triton,h200

For every config of a grid (below) it runs

* the Triton kernel (``simfloat_gpu.kernels.flash_attention.flash_attention``; int8 configs
``simfloat_gpu.kernels.int8_attention``; sage configs ``simfloat_gpu.kernels.sage_attention``, given the
emulator's mean key ``simfloat.attention.mean_key``) on the GPU
  when ``torch.cuda.is_available()`` (backend ``gpu``), else on the CPU under :func:`simfloat_gpu.interpreter.faithful`
  (backend ``faithful``: Triton's interpreter with simfloat's numerics);
* the emulator with the matching plan: ``simfloat.attention.flash(q, k, v, plan=plan("triton-<fmt>"),
  block_m, block_n, causal)`` with ``out`` fp32 or the input format (int8: ``simfloat.attention.int8_flash``
  where it exists; sage: ``simfloat.attention.quant_flash`` with the ``sage2-int8-fp8`` plan);
* a float64 reference (numpy), for the error of each against the exact softmax attention,

and writes ``DIR/validation.csv`` (one row per config) and ``DIR/validation.md`` (table, environment and,
under the interpreter, ``faithful_config()``). Under the faithful interpreter every config must agree 100%
bitwise (outputs, fp32 included, m_i and l_i); on a GPU the agreement measures the emulator's hardware model.

GPU mode can record fixtures (``--record-fixtures DIR``): the configs with their input seeds (inputs are
regenerated from seed + shape + dtype and checked by CRC32, never stored), the kernel's fp32 output and its
low-precision output, m_i and l_i, and the environment, as ``configs.json``, ``outputs.npz`` (compressed) and
``env.json``. ``tests/test_gpu_fixtures.py`` and ``--fixtures DIR`` compare the emulator against them; a
``backward/`` subfolder of the same layout (written by ``simfloat-gpu run``: the backward kernels' dq, dk, dv,
delta, lse, o, m, l) is compared with ``flash_backward`` under the same plan families (backward.csv / .md and
a section of validation.md; :func:`simfloat_gpu.campaign.validate_bwd.compare_backward_fixtures`).

Grid design (``grid("full")``): the dimensions are format {bf16, fp16} x BLOCK_M x BLOCK_N {16, 32, 64, 128} x
seq {64, 97, 256, 1000} x head_dim {16, 64, 128} x causal {off, on} x output {fp32, input format}: 1536
points, far too many for the interpreter. Three parts:

1. a cost-weighted greedy **all-pairs** covering array: every pair of values of any two dimensions occurs in
   at least one config (186 pairs, 25 configs); the greedy picks, at each step, the config covering the most
   uncovered pairs per estimated second of interpreter + emulator time;
2. the **full factorial** format x BLOCK_M x BLOCK_N x causal (64 configs) at seq 97 (a partial last tile
   for every block size), head_dim 16, the output alternating fp32 / input format;
3. two **stress** configs (seq 256 with 16 x 16 tiles and head_dim 128; seq 1000, head_dim 64);

plus int8 configs (INT-FlashAttention "int8" and "half-int8", both row sums, seq 64..1000) and sage configs
(SageAttention2-style INT8 QK^T / FP8 P.V, seq 97..1000; the ci grid: seq 40). Queries are
standard normal x 1.5, keys and values standard normal (numpy ``default_rng(seed)``), rounded to the format
(round to nearest even); seq_q = seq_k = seq, batch 1, 2 heads (1 at seq 1000), scale 1/sqrt(head_dim).

This module imports only numpy and the standard library at import time: torch, triton and simfloat are loaded
where used, and the GPU path (kernel runs and fixture recording) needs no simfloat at all.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import hashlib
import itertools
import json
import math
import os
import platform
import sys
import time
import zlib
from collections.abc import Callable, Container, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from simfloat.cli import positive_int, writable_dir
from simfloat_gpu.campaign.records import BackwardRecord, Record, ValidationRecord

#: where the kernel sources are (their hashes go into every fixture record)
KERNELS_DIR = Path(__file__).resolve().parents[1] / "kernels"

__all__ = [
    "Config",
    "grid",
    "make_inputs",
    "reference64",
    "run_kernel",
    "run_emulator",
    "validate_config",
    "run_grid",
    "environment",
    "write_report",
    "write_fixtures",
    "load_fixtures",
    "compare_fixtures",
    "agreement_table",
    "agreement_summary",
    "pivot",
    "emulator_plan",
    "plan_families",
    "PLAN_FAMILIES",
    "use_hardware",
    "check_args",
    "Interrupted",
    "KernelComparison",
    "compare_kernel",
    "positive_int",
    "positive_seconds",
    "writable_dir",
    "main",
    "FIELDS",
    "ValidationRecord",
    "compare_to_emulator",
    "compare_outputs",
]

FORMATS = ("bf16", "fp16")
BLOCKS = (16, 32, 64, 128)
SEQS = (64, 97, 256, 1000)
HEAD_DIMS = (16, 64, 128)
CAUSAL = (False, True)
OUTS = ("fp32", "low")
#: dot precisions of fp32 inputs (``input_precision``): "tf32" tensor cores (plan triton-tf32) or "ieee" FMA
#: loops (plan triton-fp32); backward grids only
PRECISIONS = ("tf32", "ieee")
#: emulator plan families a flash config is compared under (``<family>-<fmt>`` presets)
PLAN_FAMILIES = ("triton", "h200")
#: hardware profiles registered as plan families by :func:`use_hardware` (family = the profile's name)
_PROFILES: dict[str, Any] = {}


def use_hardware(profile: Any) -> str:
    """Register a hardware profile (:class:`simfloat.profiles.HardwareProfile`, a shipped name or a profile
    file) as a plan family of this process: flash configs compared under the family (its name) use
    ``plan("triton-<fmt>", hardware=profile)``; a profile named like a built-in family replaces it.
    Returns the family name.

    Raises:
        ValueError: not a valid profile (see :func:`simfloat.profiles.load_profile`).
    """
    from simfloat.profiles import load_profile

    prof = load_profile(profile)
    _PROFILES[prof.name] = prof
    return prof.name


def _known_family(family: str) -> bool:
    return family in PLAN_FAMILIES or family in _PROFILES


INT8_VARIANTS = ("int8", "half-int8")
#: Variants of the SageAttention-style kernel (simfloat_gpu.kernels.sage_attention), by emulator preset.
SAGE_VARIANTS = ("sage2-int8-fp8",)
#: queries are N(0, SPREAD^2): sharper softmax rows than N(0, 1), so that max / rescale paths are exercised
SPREAD = 1.5
#: bump when the grid or the input generation changes (recorded in fixtures)
GRID_VERSION = 1

#: the columns of validation.csv: the fields of :class:`ValidationRecord`
FIELDS = ValidationRecord.csv_fields()


# ----------------------------------------------------------------------------------------------------
# configs and the grid
# ----------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Config:
    """One validation point. ``out`` is "fp32" or "low" (the input format; int8 kernels write fp16)."""

    kind: str  # "flash" | "int8" | "sage"
    fmt: str  # input format: "bf16" | "fp16"
    seq: int
    head_dim: int
    block_m: int
    block_n: int
    causal: bool
    out: str
    variant: str = ""  # int8: "int8" | "half-int8"; sage: a SAGE_VARIANTS preset
    row_sum: str = ""  # int8: "reference" | "consistent"
    heads: int = 2
    batch: int = 1
    kv_heads: int = 0  # key/value heads (grouped-query attention); 0: as many as heads. Backward grids only
    precision: str = ""  # fmt "fp32": a PRECISIONS entry (the dots' input_precision). Backward grids only

    def __post_init__(self) -> None:
        if self.kind not in ("flash", "int8", "sage"):
            raise ValueError(f"Config.kind must be 'flash', 'int8' or 'sage', got {self.kind!r}")
        if self.fmt == "fp32" and self.kind == "flash":
            if self.precision not in PRECISIONS:
                raise ValueError(
                    f"Config.precision must be one of {PRECISIONS} for fp32 inputs, got {self.precision!r}"
                )
        elif self.fmt not in FORMATS:
            raise ValueError(f"Config.fmt must be one of {FORMATS} (flash: or fp32), got {self.fmt!r}")
        elif self.precision:
            raise ValueError(f"Config.precision is for fp32 inputs only, got {self.precision!r} with {self.fmt}")
        if self.kv_heads < 0 or (self.kv_heads and self.heads % self.kv_heads):
            raise ValueError(f"Config.kv_heads must divide heads ({self.heads}) or be 0, got {self.kv_heads}")
        if self.out not in OUTS:
            raise ValueError(f"Config.out must be one of {OUTS}, got {self.out!r}")
        if self.kind == "int8" and (self.variant not in INT8_VARIANTS or self.out != "low"):
            raise ValueError("int8 configs need variant 'int8' or 'half-int8' and out 'low' (fp16)")
        if self.kind == "sage" and (self.variant not in SAGE_VARIANTS or self.out != "low"):
            raise ValueError(f"sage configs need variant one of {SAGE_VARIANTS} and out 'low' (fp16)")

    @property
    def id(self) -> str:
        kind = {"flash": "flash", "sage": self.variant}.get(self.kind, f"{self.variant}-{self.row_sum[:3]}")
        return (
            f"{kind}-{self.fmt}-s{self.seq}-d{self.head_dim}-m{self.block_m}n{self.block_n}-"
            f"{'causal' if self.causal else 'full'}-{self.out}-h{self.heads}"
            + (f"-kv{self.kv_heads}" if self.kv_heads else "")
            + (f"-{self.precision}" if self.precision else "")
        )

    @property
    def seed(self) -> int:
        """Input seed: a hash of the id, so inputs never depend on the config's position in a grid."""
        return zlib.crc32(self.id.encode()) & 0x7FFFFFFF

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (self.batch, self.heads, self.seq, self.head_dim)

    @property
    def kv_shape(self) -> tuple[int, int, int, int]:
        """The shape of k and v: (batch, kv_heads or heads, seq, head_dim)."""
        return (self.batch, self.kv_heads or self.heads, self.seq, self.head_dim)

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["id"] = self.id
        d["seed"] = self.seed
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Config:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


def _heads(seq: int) -> int:
    return 1 if seq >= 1000 else 2


def _tiles_and_pairs(seq: int, bm: int, bn: int, causal: bool) -> tuple[int, int]:
    tiles = pairs = 0
    for t in range(-(-seq // bm)):
        lo, hi_row = t * bm, min(seq, (t + 1) * bm)
        hi = min((t + 1) * bm, seq) if causal else seq
        tiles += -(-hi // bn)
        pairs += sum(i + 1 for i in range(lo, hi_row)) if causal else (hi_row - lo) * seq
    return tiles, pairs


def estimated_cost(cfg: Config) -> float:
    """A rough cost model in seconds on one core, used only to order and budget the grid's configs: the
    interpreter's time per key tile plus its tensor-core dot emulation, the emulator's time per q.k.d product
    pair, and a launch overhead (constants fitted once by timing the ci grid; they need not be exact)."""
    tiles, pairs = _tiles_and_pairs(cfg.seq, cfg.block_m, cfg.block_n, cfg.causal)
    h = cfg.heads * cfg.batch
    interp = h * tiles * (0.022 + 8.5e-8 * cfg.block_m * cfg.block_n * cfg.head_dim)
    emu = h * pairs * cfg.head_dim * 2.3e-7
    return interp + emu + 0.3


def emulator_cost(cfg: Config) -> float:
    """Seconds on one core for the emulator alone (fixture comparisons)."""
    _, pairs = _tiles_and_pairs(cfg.seq, cfg.block_m, cfg.block_n, cfg.causal)
    return cfg.heads * cfg.batch * pairs * cfg.head_dim * 2.3e-7


def _flash(fmt: str, bm: int, bn: int, seq: int, d: int, causal: bool, out: str) -> Config:
    return Config("flash", fmt, seq, d, bm, bn, causal, out, heads=_heads(seq))


def _all_pairs(dims: Sequence[Sequence[Any]], make: Callable[..., Config]) -> list[Config]:
    """Cost-weighted greedy covering array of strength 2 over ``dims`` (deterministic)."""
    cands = list(itertools.product(*dims))
    n = len(dims)

    def pairs(c: tuple) -> set:
        return {(i, c[i], j, c[j]) for i in range(n) for j in range(i + 1, n)}

    cand_pairs = [pairs(c) for c in cands]
    costs = [estimated_cost(make(*c)) + 2.0 for c in cands]
    uncovered = set().union(*cand_pairs)
    chosen: list[Config] = []
    while uncovered:
        best = max(range(len(cands)), key=lambda i: (len(cand_pairs[i] & uncovered) / costs[i], -i))
        chosen.append(make(*cands[best]))
        uncovered -= cand_pairs[best]
    return chosen


def _all_values(dims: Sequence[Sequence[Any]], make: Callable[..., Config]) -> list[Config]:
    """Cost-weighted greedy covering of every single value of every dimension (strength 1)."""
    cands = list(itertools.product(*dims))
    costs = [estimated_cost(make(*c)) + 2.0 for c in cands]
    uncovered = {(i, v) for i, vals in enumerate(dims) for v in vals}
    chosen = []
    while uncovered:
        best = max(
            range(len(cands)), key=lambda i: (len({(j, x) for j, x in enumerate(cands[i])} & uncovered) / costs[i], -i)
        )
        chosen.append(make(*cands[best]))
        uncovered -= {(j, x) for j, x in enumerate(cands[best])}
    return chosen


def _int8_configs(small: bool) -> list[Config]:
    rows = [  # variant, row_sum, seq, d, bm, bn, causal
        ("int8", "reference", 97, 64, 64, 32, False),
        ("half-int8", "consistent", 97, 128, 16, 32, False),
        ("int8", "consistent", 256, 128, 32, 64, True),
        ("half-int8", "reference", 256, 64, 128, 128, True),
        ("half-int8", "reference", 64, 64, 64, 64, False),
        ("int8", "reference", 1000, 64, 128, 64, True),
    ]
    if small:
        rows = [rows[0], rows[1]]
    return [
        Config("int8", "fp16", s, d, bm, bn, c, "low", variant=var, row_sum=rs, heads=_heads(s))
        for var, rs, s, d, bm, bn, c in rows
    ]


def _sage_configs(small: bool) -> list[Config]:
    rows = [  # seq, d, bm, bn, causal
        (97, 64, 32, 32, True),
        (256, 128, 64, 64, False),
        (1000, 64, 128, 64, True),
    ]
    if small:
        rows = [(40, 32, 32, 32, True)]
    return [
        Config("sage", "fp16", s, d, bm, bn, c, "low", variant=SAGE_VARIANTS[0], heads=_heads(s))
        for s, d, bm, bn, c in rows
    ]


def _dedupe(configs: Iterable[Config]) -> list[Config]:
    seen: set[str] = set()
    out = []
    for c in configs:
        if c.id not in seen:
            seen.add(c.id)
            out.append(c)
    return out


def grid(name: str = "full", *, int8: bool = True) -> list[Config]:
    """The validation grid: "full" (see the module docstring), "ci" (every value of every dimension at least
    once, cheapest first: the CI test's subset) or "smoke" (three tiny configs)."""
    dims = (FORMATS, BLOCKS, BLOCKS, SEQS, HEAD_DIMS, CAUSAL, OUTS)
    if name == "full":
        pairs = _all_pairs(dims, _flash)
        factorial = [
            _flash(f, bm, bn, 97, 16, c, OUTS[(i + j + int(c)) % 2])
            for f in FORMATS
            for i, bm in enumerate(BLOCKS)
            for j, bn in enumerate(BLOCKS)
            for c in CAUSAL
        ]
        stress = [_flash("fp16", 16, 16, 256, 128, True, "fp32"), _flash("bf16", 64, 32, 1000, 64, True, "low")]
        configs = pairs + factorial + stress + (_int8_configs(False) + _sage_configs(False) if int8 else [])
    elif name == "ci":
        configs = _all_values(dims, _flash) + [_flash("fp16", 32, 16, 97, 64, True, "fp32")]
        configs += _int8_configs(True) + _sage_configs(True) if int8 else []
    elif name == "smoke":
        configs = [_flash("bf16", 16, 16, 40, 16, True, "fp32"), _flash("fp16", 32, 16, 33, 16, False, "low")]
        configs += (
            [Config("int8", "fp16", 40, 32, 16, 32, False, "low", variant="int8", row_sum="reference")] if int8 else []
        )
    else:
        raise ValueError(f"unknown grid {name!r}; known: full, ci, smoke")
    return _dedupe(configs)


# ----------------------------------------------------------------------------------------------------
# inputs and the float64 reference
# ----------------------------------------------------------------------------------------------------


def round_to_format(x: np.ndarray, fmt: str) -> np.ndarray:
    """float32 values rounded to nearest even into bf16 / fp16 (fp32: unchanged), returned as float32 (numpy
    only)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if fmt == "fp32":
        return x
    if fmt == "fp16":
        with np.errstate(over="ignore"):  # beyond 65520: inf, as a cast on the GPU
            return x.astype(np.float16).astype(np.float32)
    if fmt == "bf16":
        u = x.view(np.uint32).astype(np.uint64)
        u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000  # finite inputs only
        return u.astype(np.uint32).view(np.float32)
    raise ValueError(f"unknown format {fmt!r}")


def make_inputs(cfg: Config) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """q (``cfg.shape``), k, v (``cfg.kv_shape``): float32 arrays holding values of ``cfg.fmt``, regenerable from
    the seed."""
    rng = np.random.default_rng(cfg.seed)
    q = rng.standard_normal(cfg.shape) * SPREAD
    k = rng.standard_normal(cfg.kv_shape)
    v = rng.standard_normal(cfg.kv_shape)
    return tuple(round_to_format(x.astype(np.float32), cfg.fmt) for x in (q, k, v))  # type: ignore[return-value]


def input_crc(*arrays: np.ndarray) -> int:
    """CRC32 of the arrays' float32 bytes, in order (q, k, v; backward fixtures: q, k, v, dO)."""
    crc = 0
    for x in arrays:
        crc = zlib.crc32(np.ascontiguousarray(x, dtype=np.float32).tobytes(), crc)
    return crc


def reference64(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool) -> np.ndarray:
    """Exact-ish softmax attention in float64 (scale 1/sqrt(head_dim), top-left causal mask)."""
    q64, k64, v64 = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    s = (q64 @ np.swapaxes(k64, -1, -2)) * (1.0 / math.sqrt(q64.shape[-1]))
    if causal:
        i = np.arange(s.shape[-2])[:, None]
        j = np.arange(s.shape[-1])[None, :]
        s = np.where(j > i, -np.inf, s)
    s = s - s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(axis=-1, keepdims=True)
    return p @ v64


# ----------------------------------------------------------------------------------------------------
# backends
# ----------------------------------------------------------------------------------------------------


def _env_interpret() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def resolve_backend(backend: str = "auto") -> str:
    """ "gpu" or "faithful"; prepares TRITON_INTERPRET accordingly (before triton is imported)."""
    if backend == "auto":
        backend = "gpu" if (not _env_interpret() and _cuda_available()) else "faithful"
    if backend not in ("gpu", "faithful"):
        raise ValueError(f"backend must be auto, gpu or faithful, got {backend!r}")
    if backend == "faithful":
        if "triton" in sys.modules and not _env_interpret():
            import triton.language as tl

            if type(tl.standard.sum).__name__ != "InterpretedFunction":
                raise RuntimeError(
                    "the faithful backend needs TRITON_INTERPRET=1 before triton is first "
                    "imported; "
                    "triton is already imported without it in this process (run "
                    "`TRITON_INTERPRET=1 python -m simfloat_gpu.campaign.validate ...`)"
                )
        os.environ["TRITON_INTERPRET"] = "1"
    else:
        if _env_interpret():
            raise RuntimeError("backend 'gpu' but TRITON_INTERPRET is set: unset it to run compiled kernels")
        if not _cuda_available():
            raise RuntimeError("backend 'gpu' needs torch with a CUDA device (torch.cuda.is_available() is False)")
    try:
        import torch  # noqa: F401
        import triton  # noqa: F401
    except ImportError as exc:
        raise RuntimeError(
            f"running the Triton kernels needs torch and triton ({exc}); install the 'gpu' "
            "extra: pip install -e '.[gpu]'"
        ) from exc
    return backend


def _torch_dtype(fmt: str) -> Any:
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[fmt]


@contextlib.contextmanager
def kernel_session(backend: str, fmt: str, *arrays: np.ndarray) -> Iterator[tuple[str, list[Any]]]:
    """The setup every kernel run shares: ``arrays`` as torch tensors of ``fmt`` on the backend's device
    ("cuda" for ``gpu``, else "cpu"), the body run under the faithful interpreter for backend ``faithful``, and
    the GPU synchronized at the end.

    Yields:
        (device, the tensors in the order of ``arrays``).
    """
    import torch

    device = "cuda" if backend == "gpu" else "cpu"
    dt = _torch_dtype(fmt)
    tensors = [torch.from_numpy(np.ascontiguousarray(x)).to(dt).to(device) for x in arrays]
    ctx: Any = contextlib.nullcontext()
    if backend == "faithful":
        from simfloat_gpu.interpreter import faithful

        ctx = faithful()
    with ctx:
        yield device, tensors
    if backend == "gpu":
        torch.cuda.synchronize()


def run_flash(cfg: Config, q: Any, k: Any, v: Any, out_dtype: Any) -> tuple[Any, Any, Any]:
    """The Triton flash kernel on torch tensors under ``cfg``'s tile, mask and dot precision (fp32 inputs:
    ``cfg.precision``; otherwise the kernel's default): (o in ``out_dtype``, m, l)."""
    from simfloat_gpu.kernels.flash_attention import flash_attention

    o, m, l = flash_attention(  # noqa: E741
        q,
        k,
        v,
        causal=cfg.causal,
        block_m=cfg.block_m,
        block_n=cfg.block_n,
        return_stats=True,
        out_dtype=out_dtype,
        input_precision=cfg.precision or None,
    )
    return o, m, l


def run_kernel(
    cfg: Config, q: np.ndarray, k: np.ndarray, v: np.ndarray, *, backend: str, fp32_too: bool = False
) -> dict[str, np.ndarray]:
    """The Triton kernel on the inputs. Returns float32 numpy arrays: ``out`` (in the config's output
    format), ``out32`` (the fp32 output, when ``cfg.out == "fp32"`` or ``fp32_too``), ``m``, ``l``."""
    import torch

    res: dict[str, np.ndarray] = {}

    def host(t: Any) -> np.ndarray:
        return t.float().cpu().numpy()

    with kernel_session(backend, cfg.fmt, q, k, v) as (device, (tq, tk, tv)):
        if cfg.kind == "flash":
            outs = ["fp32"] if cfg.out == "fp32" else (["low", "fp32"] if fp32_too else ["low"])
            for which in outs:
                o, m, l = run_flash(cfg, tq, tk, tv, torch.float32 if which == "fp32" else tq.dtype)  # noqa: E741
                if which == cfg.out:
                    res["out"], res["m"], res["l"] = host(o), host(m), host(l)
                if which == "fp32":
                    res["out32"] = host(o)
        elif cfg.kind == "sage":
            from simfloat.attention import mean_key, quant_plan
            from simfloat_gpu.kernels.sage_attention import sage_attention

            km = mean_key(host(tk), quant_plan(cfg.variant).k_smooth or "float32")  # the emulator's mean key
            o, m, l = sage_attention(  # noqa: E741
                tq,
                tk,
                tv,
                km=torch.from_numpy(km.astype(np.float32)).to(device),
                block_m=cfg.block_m,
                block_n=cfg.block_n,
                causal=cfg.causal,
                return_stats=True,
            )
            res["out"], res["m"], res["l"] = host(o), host(m), host(l)
        else:
            from simfloat_gpu.kernels.int8_attention import int8_attention

            o, m, l = int8_attention(  # noqa: E741
                tq,
                tk,
                tv,
                block_m=cfg.block_m,
                block_n=cfg.block_n,
                causal=cfg.causal,
                variant=cfg.variant,
                row_sum=cfg.row_sum,
                return_stats=True,
            )
            res["out"], res["m"], res["l"] = host(o), host(m), host(l)
    return res


class EmulatorUnavailable(RuntimeError):
    """The emulator has no model for this config (e.g. simfloat.attention.int8_flash does not exist yet)."""


def _int8_emulator() -> Callable[..., Any] | None:
    try:
        import simfloat.attention as A
    except ImportError:
        return None
    fn = getattr(A, "int8_flash", None)
    if fn is None:
        try:
            from simfloat.attention import quantized
        except ImportError:
            return None
        fn = getattr(quantized, "int8_flash", None)
    return fn


def emulator_plan(cfg: Config, family: str = "triton") -> str:
    """The emulator's plan for a config: ``<family>-<fmt>`` (flash; family ``triton`` or ``h200``),
    ``triton-<fmt>@<family>`` for a profile registered by :func:`use_hardware`, or the int8 preset of the
    variant and row sum (int8-reference, int8-consistent, half-int8, half-int8-consistent)."""
    if cfg.kind == "flash":
        if not _known_family(family):
            raise ValueError(f"unknown plan family {family!r}; families: {', '.join(PLAN_FAMILIES + tuple(_PROFILES))}")
        return f"triton-{cfg.fmt}@{family}" if family in _PROFILES else f"{family}-{cfg.fmt}"
    if cfg.kind == "sage":
        return cfg.variant
    return {
        ("int8", "reference"): "int8-reference",
        ("int8", "consistent"): "int8-consistent",
        ("half-int8", "reference"): "half-int8",
        ("half-int8", "consistent"): "half-int8-consistent",
    }[cfg.variant, cfg.row_sum]


def run_emulator(
    cfg: Config,
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    out: str | None = None,
    family: str = "triton",
    *,
    plan: Any = None,
) -> dict[str, np.ndarray]:
    """The emulator with the config's plan (:func:`emulator_plan`): ``out``, ``m``, ``l`` as float64 arrays.
    ``out`` overrides the config's output ("fp32" or "low"). flash: ``simfloat.attention.flash`` with
    ``plan("<family>-<fmt>")`` (its output in float32 for ``out`` "fp32"), or with ``plan`` (a
    :class:`simfloat.attention.Plan`, used as it is) when given; int8 (``family`` and ``plan`` unused):
    ``simfloat.attention.int8_flash`` with the int8 preset (EmulatorUnavailable where it does not exist)."""
    out = cfg.out if out is None else out
    if cfg.kind == "flash":
        import simfloat.attention as A

        if plan is not None:
            pl = plan
        elif family in _PROFILES:
            pl = A.plan(f"triton-{cfg.fmt}", hardware=_PROFILES[family])
        else:
            pl = A.plan(emulator_plan(cfg, family))
        if out == "fp32" and plan is None:
            pl = pl.replace(out="float32")
        o, m, l = A.flash(  # noqa: E741
            q,
            k,
            v,
            plan=pl,
            block_m=cfg.block_m,
            block_n=cfg.block_n,
            causal=cfg.causal,
            return_stats=True,
        )
        return {"out": o, "m": m, "l": l}
    if cfg.kind == "sage":
        import simfloat.attention as A

        o, m, l = A.quant_flash(  # noqa: E741
            q, k, v, plan=cfg.variant, block_m=cfg.block_m, block_n=cfg.block_n, causal=cfg.causal, return_stats=True
        )
        return {"out": o, "m": m, "l": l}
    fn = _int8_emulator()
    if fn is None:
        raise EmulatorUnavailable("simfloat.attention.int8_flash does not exist (yet)")
    import inspect

    wanted = dict(
        plan=emulator_plan(cfg), block_m=cfg.block_m, block_n=cfg.block_n, causal=cfg.causal, return_stats=True
    )
    params = inspect.signature(fn).parameters
    kwargs = {k_: v_ for k_, v_ in wanted.items() if k_ in params}
    r = fn(q, k, v, **kwargs)
    if isinstance(r, tuple) and len(r) >= 3:
        return {
            "out": np.asarray(r[0], dtype=np.float64),
            "m": np.asarray(r[1], dtype=np.float64),
            "l": np.asarray(r[2], dtype=np.float64),
        }
    return {"out": np.asarray(r, dtype=np.float64)}


# ----------------------------------------------------------------------------------------------------
# metrics
# ----------------------------------------------------------------------------------------------------


def ordered_bits(x: np.ndarray, fmt: str) -> np.ndarray:
    """Sign-magnitude bit patterns of ``x`` (values of fmt) mapped to ordered int64: adjacent values of the
    format differ by 1, +0 and -0 both map to 0."""
    x32 = np.ascontiguousarray(np.asarray(x, dtype=np.float64).astype(np.float32))
    if fmt == "fp32":
        b = x32.view(np.uint32).astype(np.int64)
        sign, mag = b >> 31, b & 0x7FFFFFFF
    else:
        if fmt == "bf16":
            b = (x32.view(np.uint32) >> 16).astype(np.int64)
        elif fmt == "fp16":
            b = x32.astype(np.float16).view(np.uint16).astype(np.int64)
        else:
            raise ValueError(f"unknown format {fmt!r}")
        sign, mag = b >> 15, b & 0x7FFF
    return np.where(sign == 1, -mag, mag)


def _raw_bits(x: np.ndarray, fmt: str) -> np.ndarray:
    x32 = np.ascontiguousarray(np.asarray(x, dtype=np.float64).astype(np.float32))
    if fmt == "fp16":
        return x32.astype(np.float16).view(np.uint16).astype(np.uint32)
    if fmt == "bf16":
        return x32.view(np.uint32) >> 16
    return x32.view(np.uint32)


def _from_bits16(bits: np.ndarray, fmt: str) -> np.ndarray:
    bits = np.asarray(bits, dtype=np.uint16)
    if fmt == "fp16":
        return bits.view(np.float16).astype(np.float32)
    return (bits.astype(np.uint32) << 16).view(np.float32)


def agreement(a: np.ndarray, b: np.ndarray, fmt: str) -> tuple[float, int]:
    """(fraction of bitwise-equal elements, NaN == NaN; max distance in units in the last place of fmt)."""
    a = np.asarray(a)
    b = np.asarray(b)
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: {a.shape} vs {b.shape}")
    if a.size == 0:
        return 1.0, 0
    both_nan = np.isnan(a) & np.isnan(b)
    eq = (_raw_bits(a, fmt) == _raw_bits(b, fmt)) | both_nan
    finite = np.isfinite(a) & np.isfinite(b)
    d = np.abs(ordered_bits(np.where(finite, a, 0.0), fmt) - ordered_bits(np.where(finite, b, 0.0), fmt))
    max_ulp = int(d.max()) if d.size else 0
    if np.any((np.isfinite(a) != np.isfinite(b)) | (np.isnan(a) != np.isnan(b))):
        max_ulp = -1  # a non-finite mismatch: no ulp distance
    return float(np.mean(eq)), max_ulp


def error_stats(x: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
    d = np.asarray(x, dtype=np.float64) - ref
    if d.size == 0:
        return 0.0, 0.0
    return float(np.max(np.abs(d))), float(np.sqrt(np.mean(d * d)))


def out_format(cfg: Config, which: str | None = None) -> str:
    which = cfg.out if which is None else which
    return "fp32" if which == "fp32" else cfg.fmt


# ----------------------------------------------------------------------------------------------------
# one config
# ----------------------------------------------------------------------------------------------------


def _record(cfg: Config, backend: str, family: str = "triton", **fields: Any) -> ValidationRecord:
    """The record of ``cfg`` before any comparison: the config, the backend, the emulator plan of ``family``."""
    return ValidationRecord(
        **{**config_columns(cfg, ValidationRecord), "backend": backend, "plan": emulator_plan(cfg, family), **fields}
    )


def config_columns(cfg: Config, record: type[Record]) -> dict[str, Any]:
    """The fields of ``record`` (a :class:`ValidationRecord` or :class:`BackwardRecord`) that ``cfg`` has
    (:meth:`Config.as_dict`: its fields, id and seed), by name."""
    d = cfg.as_dict()
    return {k: d[k] for k in record.csv_fields() if k in d}


def _error_status(exc: BaseException) -> str:
    return f"error: {type(exc).__name__}: {str(exc)[:300]}".replace("\n", " ")


def compare_outputs(cfg: Config, kernel: dict[str, np.ndarray], emu: dict[str, np.ndarray]) -> dict[str, Any]:
    """The agreement fields of a :class:`ValidationRecord` from kernel and emulator outputs: ``out`` in the
    config's output format, then ``out32`` (with its relative difference), ``m`` and ``l`` in fp32 where both
    sides have them."""
    res: dict[str, Any] = {}
    agree, ulp = agreement(kernel["out"], emu["out"], out_format(cfg))
    res["bitwise_agreement"], res["max_ulp"] = round(agree, 6), ulp
    if "out32" in kernel and "out32" in emu:
        a32, u32 = agreement(kernel["out32"], emu["out32"], "fp32")
        res["out32_agreement"], res["out32_max_ulp"] = round(a32, 6), u32
        k32 = np.asarray(kernel["out32"], dtype=np.float64)
        scale = float(np.max(np.abs(k32))) if k32.size else 0.0
        diff = float(np.max(np.abs(k32 - emu["out32"]))) if k32.size else 0.0
        res["out32_rel_diff"] = diff / scale if scale > 0 else diff
    for key in ("m", "l"):
        if key in kernel and key in emu:
            a, u = agreement(kernel[key], emu[key], "fp32")
            res[f"{key}_agreement"], res[f"{key}_max_ulp"] = round(a, 6), u
    return res


def compare_to_emulator(
    rec: ValidationRecord,
    cfg: Config,
    inputs: tuple[np.ndarray, np.ndarray, np.ndarray],
    ref: np.ndarray,
    kernel: dict[str, np.ndarray],
    *,
    family: str = "triton",
    plan: Any = None,
    fp32_too: bool = False,
) -> ValidationRecord:
    """The one comparison of the campaign: a kernel's outputs (a live run, a recorded fixture or a user's
    kernel) against the emulator under a plan family's ``<family>-<fmt>`` preset, or ``plan`` when given
    (int8 configs: the int8 preset).

    Args:
        rec: the config's record so far (:func:`_record`; the kernel's columns filled by the caller).
        cfg: the config.
        inputs: q, k, v, each (batch, heads, seq, head_dim), values of ``cfg.fmt``.
        ref: the float64 attention of the inputs (:func:`reference64`), (batch, heads, seq, head_dim).
        kernel: the kernel's ``out`` (the config's output format), ``m``, ``l`` and, where it has one, the
            fp32 output ``out32``.
        family: the plan family (:data:`PLAN_FAMILIES` or a registered hardware profile's name).
        plan: a :class:`simfloat.attention.Plan` to use instead of the family's preset.
        fp32_too: also run the emulator with a float32 output (flash configs of a low-precision output), so
            that a kernel's ``out32`` is compared too.

    Returns:
        ``rec`` with the emulator's seconds and error, every agreement column and status ``ok``.

    Raises:
        EmulatorUnavailable: the emulator has no model for the config.
    """
    if plan is not None and fp32_too:
        raise ValueError("compare_to_emulator: fp32_too needs a plan family (a given plan is used as it is)")
    q, k, v = inputs
    t0 = time.perf_counter()
    emu = run_emulator(cfg, q, k, v, family=family, plan=plan)
    if cfg.kind == "flash" and cfg.out == "fp32":
        emu["out32"] = emu["out"]
    elif cfg.kind == "flash" and fp32_too:
        emu["out32"] = run_emulator(cfg, q, k, v, out="fp32", family=family, plan=plan)["out"]
    emulator_s = round(time.perf_counter() - t0, 3)
    err_max, err_rms = error_stats(emu["out"], ref)
    return dataclasses.replace(
        rec,
        status="ok",
        emulator_s=emulator_s,
        emulator_err_max=err_max,
        emulator_err_rms=err_rms,
        **compare_outputs(cfg, kernel, emu),
    )


def validate_config(
    cfg: Config, backend: str, *, emulate: bool = True, record: bool = False
) -> tuple[ValidationRecord, dict[str, np.ndarray] | None]:
    """Run one config: kernel, emulator (unless ``emulate`` is False), float64 reference. Returns the record
    and, with ``record``, the kernel's arrays for a fixture (out, out32, m, l as float32)."""
    rec = _record(cfg, backend)
    arrays = None
    try:
        if cfg.kv_heads or cfg.precision:
            raise ValueError(f"{cfg.id}: kv_heads and precision configs are for the backward pass (validate_bwd)")
        q, k, v = make_inputs(cfg)
        t0 = time.perf_counter()
        kern = run_kernel(cfg, q, k, v, backend=backend, fp32_too=record)
        kernel_s = round(time.perf_counter() - t0, 3)
        ref = reference64(q, k, v, cfg.causal)
        err_max, err_rms = error_stats(kern["out"], ref)
        rec = dataclasses.replace(rec, kernel_s=kernel_s, kernel_err_max=err_max, kernel_err_rms=err_rms)
        if record:
            arrays = {
                key: np.asarray(val, dtype=np.float32)
                for key, val in kern.items()
                if not (key == "out32" and cfg.out == "fp32")
            }  # the same launch: stored once
            arrays["crc"] = np.array([input_crc(q, k, v)], dtype=np.uint32)
        rec = dataclasses.replace(rec, status="ok")
        if emulate:
            try:
                rec = compare_to_emulator(rec, cfg, (q, k, v), ref, kern)
            except EmulatorUnavailable as exc:
                rec = dataclasses.replace(rec, status=f"kernel only: {exc}")
    except Exception as exc:  # one failing config must not lose the others
        rec = dataclasses.replace(rec, status=_error_status(exc))
    return rec, arrays


# ----------------------------------------------------------------------------------------------------
# the grid, in parallel
# ----------------------------------------------------------------------------------------------------

_WORKER: dict[str, Any] = {}


def _worker_init(backend: str, numba_threads: int) -> None:
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle: it terminates the workers
    if backend == "faithful":
        os.environ["TRITON_INTERPRET"] = "1"
    _WORKER["backend"] = backend
    if numba_threads > 0:
        with contextlib.suppress(Exception):
            import numba

            numba.set_num_threads(numba_threads)


def _worker_run(
    cfg_dict: dict[str, Any], emulate: bool, record: bool
) -> tuple[ValidationRecord, dict[str, np.ndarray] | None]:
    return validate_config(Config.from_dict(cfg_dict), _WORKER["backend"], emulate=emulate, record=record)


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during :func:`run_grid` or :func:`compare_fixtures` (raised within a fraction of a second).

    Attributes:
        results: what the interrupted function would have returned, the configs not finished marked
            ``skipped: interrupted``: run_grid's ``[(row, arrays)]``, compare_fixtures' ``(env, rows)``.
        finished: the number of configs (compare_fixtures: rows) finished.
    """

    def __init__(self, results: Any, finished: int) -> None:
        super().__init__(f"interrupted after {finished} finished")
        self.results, self.finished = results, finished


def run_grid(
    configs: Sequence[Config],
    backend: str,
    *,
    jobs: int = 1,
    emulate: bool = True,
    record: bool = False,
    deadline: float | None = None,
    log: Callable[[str], None] = print,
) -> list[tuple[ValidationRecord, dict[str, np.ndarray] | None]]:
    """Run every config (``jobs`` worker processes; 1: in this process, on a thread of its own so that Ctrl-C
    is seen at once). Configs not started before ``deadline`` (a time.monotonic() value) are reported as
    skipped. Results come back in config order.

    Raises:
        Interrupted: Ctrl-C (the worker processes are terminated; the finished configs are in its results).
    """
    results: dict[int, tuple[ValidationRecord, dict[str, np.ndarray] | None]] = {}
    try:
        _run_grid(configs, backend, results, jobs=jobs, emulate=emulate, record=record, deadline=deadline, log=log)
    except KeyboardInterrupt:
        raise Interrupted(_in_order(configs, backend, results, "skipped: interrupted"), len(results)) from None
    return _in_order(configs, backend, results, "skipped: time budget")


def _in_order(
    configs: Sequence[Config],
    backend: str,
    results: dict[int, tuple[ValidationRecord, dict[str, np.ndarray] | None]],
    missing: str,
) -> list[tuple[ValidationRecord, dict[str, np.ndarray] | None]]:
    out = []
    for i, cfg in enumerate(configs):
        if i in results:
            out.append(results[i])
        else:
            out.append((_record(cfg, backend, status=missing), None))
    return out


def _run_grid(
    configs: Sequence[Config],
    backend: str,
    results: dict[int, tuple[ValidationRecord, dict[str, np.ndarray] | None]],
    *,
    jobs: int,
    emulate: bool,
    record: bool,
    deadline: float | None,
    log: Callable[[str], None],
) -> None:
    from simfloat._interrupt import call_interruptibly

    n = len(configs)

    def done(i: int, res: tuple[ValidationRecord, dict[str, np.ndarray] | None]) -> None:
        results[i] = res
        rec = res[0]
        log(
            f"[{len(results)}/{n}] {rec.id}: {rec.status}"
            + (
                f", out {rec.bitwise_agreement}, m {_cell(rec.m_agreement)}, l {_cell(rec.l_agreement)}"
                if rec.compared
                else ""
            )
            + f" ({_cell(rec.kernel_s)} s + {rec.emulator_s or 0} s)"
        )

    def over() -> bool:
        return deadline is not None and time.monotonic() > deadline

    if jobs <= 1 or n <= 1:
        for i, cfg in enumerate(configs):
            if over():
                break
            done(i, call_interruptibly(validate_config, cfg, backend, emulate=emulate, record=record))
    else:
        import concurrent.futures as cf
        import multiprocessing as mp

        order = sorted(range(n), key=lambda i: -estimated_cost(configs[i]))  # longest first
        threads = 1 if backend == "faithful" else 0
        ex = cf.ProcessPoolExecutor(
            max_workers=jobs, mp_context=mp.get_context("spawn"), initializer=_worker_init, initargs=(backend, threads)
        )
        stopped = False
        try:
            futs = {ex.submit(_worker_run, configs[i].as_dict(), emulate, record): i for i in order}
            pending = set(futs)
            while pending:
                timeout = 0.5 if deadline is None else min(0.5, max(0.0, deadline - time.monotonic()))
                finished, pending = cf.wait(pending, timeout=timeout, return_when=cf.FIRST_COMPLETED)
                for f in finished:
                    i = futs[f]
                    try:
                        done(i, f.result())
                    except Exception as exc:  # a worker died
                        status = f"error: worker: {type(exc).__name__}: {str(exc)[:200]}"
                        done(i, (_record(configs[i], backend, status=status), None))
                if over() and pending:
                    log(f"time budget reached: {len(pending)} config(s) not finished")
                    break
        except KeyboardInterrupt:
            _stop_pool(ex)
            stopped = True
            raise
        finally:
            if stopped:
                pass
            elif over():
                _stop_pool(ex)
            else:
                ex.shutdown(wait=True)  # reaped: their CPU time shows in RUSAGE_CHILDREN


def _stop_pool(ex: Any) -> None:
    """Cancel what has not started and terminate the workers this module started (still busy)."""
    procs = list((getattr(ex, "_processes", None) or {}).values())
    ex.shutdown(wait=False, cancel_futures=True)
    for p in procs:
        with contextlib.suppress(Exception):
            p.terminate()
    for p in procs:
        with contextlib.suppress(Exception):
            p.join(timeout=2)


# ----------------------------------------------------------------------------------------------------
# a user's kernel against a plan
# ----------------------------------------------------------------------------------------------------

#: columns of :meth:`KernelComparison.table`
KERNEL_COLUMNS = (
    "id",
    "status",
    "bitwise_agreement",
    "max_ulp",
    "m_agreement",
    "l_agreement",
    "kernel_err_max",
    "emulator_err_max",
)


@dataclasses.dataclass
class KernelComparison:
    """What :func:`compare_kernel` found: one record per config."""

    plan: str
    backend: str
    rows: list[ValidationRecord]

    def summary(self) -> dict[str, Any]:
        """Configs compared, and the min and mean bitwise agreement of the output, m_i and l_i over them."""
        done = [r for r in self.rows if r.status == "ok"]
        out: dict[str, Any] = {"configs": len(self.rows), "compared": len(done)}
        for name, field in (("out", "bitwise_agreement"), ("m", "m_agreement"), ("l", "l_agreement")):
            vals = [v for r in done if (v := getattr(r, field)) is not None]
            out[f"{name}_min"] = min(vals) if vals else None
            out[f"{name}_mean"] = float(np.mean(vals)) if vals else None
        return out

    def table(self) -> str:
        """The agreement table: one line per config, then the summary."""
        lines = [" | ".join(KERNEL_COLUMNS)]
        lines += [" | ".join(r.table_cell(c) for c in KERNEL_COLUMNS) for r in self.rows]
        s = self.summary()
        parts = [
            f"{n} min {s[n + '_min']:.6g} mean {s[n + '_mean']:.6g}"
            for n in ("out", "m", "l")
            if s[n + "_min"] is not None
        ]
        lines.append(
            f"{s['compared']} of {s['configs']} configs compared against plan {self.plan} "
            f"({self.backend}): " + "; ".join(parts)
        )
        return "\n".join(lines)


def _out_kind(fmt: str, out_fmt: str) -> str:
    if out_fmt == "float32":
        return "fp32"
    if out_fmt == {"bf16": "bfloat16", "fp16": "float16"}[fmt]:
        return "low"
    raise ValueError(
        f"compare_kernel compares outputs in float32 or the input format; the plan's output "
        f"format is {out_fmt} for {fmt} inputs"
    )


def compare_kernel(
    kernel: Callable[..., Any],
    plan: Any,
    configs: str | Sequence[Config] = "ci",
    *,
    backend: str = "auto",
    faithful_options: dict[str, Any] | None = None,
    log: Callable[[str], None] = print,
) -> KernelComparison:
    """Run a flash-attention kernel of one's own and the emulator under ``plan`` on each config, bit for bit.

    The kernel is called as ``kernel(q, k, v, causal=..., block_m=..., block_n=...)`` with torch tensors of
    shape (batch, heads, seq, head_dim) in the config's format (bf16 / fp16), on the GPU (backend ``gpu``) or
    the CPU, under :func:`simfloat_gpu.interpreter.faithful` (backend ``faithful``); it must use the softmax scale
    1/sqrt(head_dim) and return the output, or ``(out, m, l)`` with the row statistics ((batch, heads, seq),
    in the plan's units: log2 units with ``plan.exp2``) as the emulator's ``return_stats`` gives them. The
    emulator runs ``simfloat.attention.flash(q, k, v, plan=plan, block_m, block_n, causal)``; outputs are
    compared in the plan's output format (float32 or the input format), m and l in float32.

    Args:
        kernel: the kernel's launcher, as above.
        plan: a :class:`simfloat.attention.Plan` or preset name.
        configs: a grid name of :func:`grid` or :class:`Config` objects; int8 configs are left out, and so
            are flash configs of another input format than the plan's (by its name, ``<family>-<fmt>``).
            Each config's ``out`` is set by the plan's output format.
        backend: ``"auto"`` (the GPU if torch sees one), ``"gpu"`` or ``"faithful"``.
        faithful_options: keyword arguments of :func:`simfloat_gpu.interpreter.faithful` (backend ``faithful``).
        log: called with one line per config.

    Returns:
        A :class:`KernelComparison` (``rows``, ``summary()``, ``table()``).

    Raises:
        ValueError: no config left (configs whose input format is not the plan's, or whose output format would
            be neither float32 nor the input format, are left out), or a bad backend.
        RuntimeError: the backend cannot run (see :func:`resolve_backend`).
    """
    import simfloat.attention as A

    pl = A.plan(plan)
    backend = resolve_backend(backend)
    cfgs = grid(configs, int8=False) if isinstance(configs, str) else list(configs)
    family, _, pfmt = pl.name.rstrip("*").partition("@")[0].partition("-")
    chosen = []
    for c in cfgs:
        if c.kind != "flash" or (family in PLAN_FAMILIES and pfmt in FORMATS and c.fmt != pfmt):
            continue
        try:
            chosen.append(dataclasses.replace(c, out=_out_kind(c.fmt, pl.out.fmt.name)))
        except ValueError:  # an output format the kernel could not have for these inputs
            continue
    chosen = _dedupe(chosen)
    if not chosen:
        raise ValueError(
            f"compare_kernel: no flash config of plan {pl.name}'s input format among the configs "
            f"(its output format, {pl.out.fmt.name}, must be float32 or the input format)"
        )
    rows = []
    for cfg in chosen:
        rec = _record(cfg, backend, plan=pl.name)
        try:
            q, k, v = make_inputs(cfg)
            ref = reference64(q, k, v, cfg.causal)
            t0 = time.perf_counter()
            kern = _run_user_kernel(kernel, cfg, q, k, v, backend, faithful_options or {})
            kernel_s = round(time.perf_counter() - t0, 3)
            err_max, err_rms = error_stats(kern["out"], ref)
            rec = dataclasses.replace(rec, kernel_s=kernel_s, kernel_err_max=err_max, kernel_err_rms=err_rms)
            rec = compare_to_emulator(rec, cfg, (q, k, v), ref, kern, plan=pl)
        except Exception as exc:  # one failing config must not lose the others
            rec = dataclasses.replace(rec, status=_error_status(exc))
        rows.append(rec)
        log(
            f"{rec.id}: {rec.status} out {_cell(rec.bitwise_agreement)} m {_cell(rec.m_agreement)} "
            f"l {_cell(rec.l_agreement)}"
        )
    return KernelComparison(pl.name, backend, rows)


def _run_user_kernel(
    kernel: Callable[..., Any],
    cfg: Config,
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    backend: str,
    options: dict[str, Any],
) -> dict[str, np.ndarray]:
    import torch

    device = "cuda" if backend == "gpu" else "cpu"
    dt = _torch_dtype(cfg.fmt)
    tq, tk, tv = (torch.from_numpy(np.ascontiguousarray(x)).to(dt).to(device) for x in (q, k, v))
    ctx: Any = contextlib.nullcontext()
    if backend == "faithful":
        from simfloat_gpu.interpreter import faithful

        ctx = faithful(**options)
    with ctx:
        res = kernel(tq, tk, tv, causal=cfg.causal, block_m=cfg.block_m, block_n=cfg.block_n)
    if backend == "gpu":
        torch.cuda.synchronize()
    parts = res if isinstance(res, tuple) else (res,)
    if len(parts) not in (1, 3):
        raise ValueError(f"the kernel returned {len(parts)} values; expected out or (out, m, l)")
    out = {key: t.float().cpu().numpy() for key, t in zip(("out", "m", "l"), parts, strict=False)}
    if out["out"].shape != q.shape[:-1] + (v.shape[-1],):
        raise ValueError(f"the kernel's output has shape {out['out'].shape}, expected {q.shape}")
    return out


# ----------------------------------------------------------------------------------------------------
# environment and reports
# ----------------------------------------------------------------------------------------------------


def _sha256(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    except OSError:
        return ""


def _driver_version() -> str:
    import shutil
    import subprocess

    if shutil.which("nvidia-smi"):
        try:
            r = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
            )
            if r.returncode == 0 and r.stdout.strip():
                return r.stdout.strip().splitlines()[0]
        except Exception:
            pass
    try:
        import pynvml

        pynvml.nvmlInit()
        v = pynvml.nvmlSystemGetDriverVersion()
        return v.decode() if isinstance(v, bytes) else str(v)
    except Exception:
        return ""


def gpu_slug(name: str) -> str:
    """'NVIDIA H200' -> 'h200', 'NVIDIA H100 80GB HBM3' -> 'h100', 'NVIDIA A100-SXM4-40GB' -> 'a100'."""
    import re

    words = [w for w in re.split(r"[^A-Za-z0-9]+", name.lower()) if w and w not in ("nvidia", "geforce", "tesla")]
    return words[0] if words else "gpu"


def environment(backend: str) -> dict[str, Any]:
    """A JSON-friendly record of where the kernels ran."""
    env: dict[str, Any] = {
        "backend": backend,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "numpy": np.__version__,
        "grid_version": GRID_VERSION,
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    env["kernel_sha256"] = {
        p: _sha256(KERNELS_DIR / p)
        for p in ("flash_attention.py", "flash_attention_bwd.py", "int8_attention.py", "sage_attention.py")
    }
    for mod in ("torch", "triton", "numba"):
        try:
            env[mod] = __import__(mod).__version__
        except Exception:
            env[mod] = None
    if backend == "gpu":
        import torch

        props = torch.cuda.get_device_properties(0)
        env.update(
            gpu=torch.cuda.get_device_name(0),
            gpu_slug=gpu_slug(torch.cuda.get_device_name(0)),
            capability=".".join(map(str, torch.cuda.get_device_capability(0))),
            sm_count=props.multi_processor_count,
            gpu_memory_gib=round(props.total_memory / 2**30, 1),
            cuda=torch.version.cuda,
            driver=_driver_version(),
        )
    return env


def _cpu_seconds() -> float:
    """CPU seconds (user + system) of this process and its reaped children (the worker processes)."""
    try:
        import resource

        me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return round(me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime, 1)
    except Exception:
        return float("nan")


def _cell(v: Any) -> str:
    """A value in a log line: None (not measured) as an empty string."""
    return "" if v is None else str(v)


#: columns of validation.md: those of :meth:`KernelComparison.table` and the seconds
MD_COLUMNS = (*KERNEL_COLUMNS, "kernel_s", "emulator_s")


def summarize(rows: Sequence[ValidationRecord]) -> dict[str, Any]:
    """Counts over records: configs, compared, bitwise identical in every output, kernel only, errors,
    skipped, and the mean bitwise agreement of the output."""
    compared = [r for r in rows if r.bitwise_agreement is not None]
    return {
        "configs": len(rows),
        "compared": len(compared),
        "bitwise_100": sum(r.bitwise for r in compared),
        "kernel_only": sum(1 for r in rows if r.status.startswith("kernel only")),
        "errors": sum(1 for r in rows if r.status.startswith("error")),
        "skipped": sum(1 for r in rows if r.status.startswith("skipped")),
        "mean_out_agreement": (
            float(np.mean([r.bitwise_agreement for r in compared if r.bitwise_agreement is not None]))
            if compared
            else None
        ),
    }


def write_report(
    out_dir: Path,
    rows: Sequence[ValidationRecord],
    env: dict[str, Any],
    config: dict[str, Any] | None,
    *,
    title: str,
    elapsed: float,
    notes: Sequence[str] = (),
) -> None:
    """validation.csv and validation.md."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / "validation.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        for r in rows:
            w.writerow(r.to_csv_row())
    s = summarize(rows)
    lines = [
        f"# {title}",
        "",
        f"{s['configs']} configs in {elapsed:.1f} s: {s['compared']} compared with the emulator, "
        f"{s['bitwise_100']} of them bitwise identical in every output (out, fp32 out, m_i, l_i); "
        f"{s['kernel_only']} kernel only, {s['errors']} errors, {s['skipped']} skipped.",
        "",
    ]
    lines += [f"* {n}" for n in notes]
    if notes:
        lines.append("")
    lines += [
        "Columns: `bitwise_agreement` / `max_ulp`: the config's output (fp32 or the input format) "
        "kernel vs emulator; `m_agreement`, `l_agreement`: the stats m_i, l_i (fp32); `*_err_max`: max "
        "|output - float64 reference|. All columns are in validation.csv.",
        "",
    ]
    lines.append("| " + " | ".join(MD_COLUMNS) + " |")
    lines.append("|" + "---|" * len(MD_COLUMNS))
    for r in rows:
        lines.append("| " + " | ".join(r.table_cell(c) for c in MD_COLUMNS) + " |")
    lines += ["", "## Environment", "", "```json", json.dumps(env, indent=1, default=str), "```"]
    if config is not None:
        lines += ["", "## faithful_config()", "", "```json", json.dumps(config, indent=1, default=str), "```"]
    (out_dir / "validation.md").write_text("\n".join(lines) + "\n")


# ----------------------------------------------------------------------------------------------------
# fixtures
# ----------------------------------------------------------------------------------------------------


def write_fixtures(
    fix_dir: Path,
    results: Sequence[tuple[ValidationRecord, dict[str, np.ndarray] | None]],
    configs: Sequence[Config],
    env: dict[str, Any],
) -> int:
    """Write env.json, configs.json and outputs.npz (compressed) under ``fix_dir``; returns the number of
    configs recorded. Inputs are not stored: they are regenerated from each config's seed (CRC32 checked)."""
    arrays: dict[str, np.ndarray] = {}
    entries = []
    for cfg, (rec, arr) in zip(configs, results, strict=True):
        if arr is None:
            continue
        kernel = dict(arr)
        crc = int(kernel.pop("crc")[0])
        low = {"out"} if cfg.out == "low" else set()  # values of a 16-bit format: stored as their bits
        names = sorted(_add_fixture_arrays(arrays, cfg, kernel, kernel, low))
        entries.append(_fixture_entry(cfg, rec, crc, ("kernel_err_max", "kernel_err_rms"), names))
    _save_fixture_dir(fix_dir, env, entries, arrays)
    return len(entries)


def _add_fixture_arrays(
    arrays: dict[str, np.ndarray],
    cfg: Config,
    kernel: Mapping[str, np.ndarray],
    names: Iterable[str],
    low: Container[str],
) -> list[str]:
    """Add the kernel's arrays ``names`` of one config to a fixture's ``arrays`` as ``<config id>__<key>``: those
    in ``low`` (values of the 16-bit input format) as their bit patterns (uint16, key ``<name>_bits``), the rest
    as float32. Returns the keys, in the order of ``names``; :func:`_load_fixture_dir` reads them back."""
    keys = []
    for name in names:
        if name in low:
            key, value = f"{name}_bits", _raw_bits(kernel[name], cfg.fmt).astype(np.uint16)
        else:
            key, value = name, np.asarray(kernel[name], dtype=np.float32)
        arrays[f"{cfg.id}__{key}"] = value
        keys.append(key)
    return keys


def _fixture_entry(
    cfg: Config, rec: ValidationRecord | BackwardRecord, crc: int, errors: Sequence[str], keys: list[str]
) -> dict[str, Any]:
    """The configs.json entry of one recorded config (forward or backward): the config, the CRC32 of its
    inputs, the kernel's ``errors`` columns as the record's CSV has them (text), its seconds, its array keys."""
    row = rec.to_csv_row()  # configs.json keeps the errors as the text of the CSV
    entry = cfg.as_dict()
    entry.update(input_crc=crc, **{name: row[name] for name in errors}, kernel_s=rec.kernel_s, arrays=keys)
    return entry


def _save_fixture_dir(
    fix_dir: Path, env: dict[str, Any], entries: list[dict[str, Any]], arrays: dict[str, np.ndarray]
) -> None:
    """The three files of a fixture folder (forward, or its ``backward`` subfolder): env.json, configs.json
    (one entry per config, ``arrays`` naming its arrays), outputs.npz (``<config id>__<array>``, compressed)."""
    fix_dir.mkdir(parents=True, exist_ok=True)
    (fix_dir / "env.json").write_text(json.dumps(env, indent=1, default=str) + "\n")
    (fix_dir / "configs.json").write_text(
        json.dumps({"grid_version": GRID_VERSION, "spread": SPREAD, "configs": entries}, indent=1) + "\n"
    )
    np.savez_compressed(fix_dir / "outputs.npz", **arrays)


def _load_fixture_dir(
    fix_dir: Path,
) -> tuple[dict[str, Any], list[tuple[Config, dict[str, Any], dict[str, np.ndarray]]]]:
    """(env, [(config, entry, arrays)]) of a folder :func:`_save_fixture_dir` wrote: arrays stored as bits
    (``<name>_bits``) decoded to float32 values of the config's format under ``<name>``, the rest as stored."""
    env = json.loads((fix_dir / "env.json").read_text())
    meta = json.loads((fix_dir / "configs.json").read_text())
    out = []
    with np.load(fix_dir / "outputs.npz") as z:
        for entry in meta["configs"]:
            cfg = Config.from_dict(entry)
            arrays = {}
            for key in entry["arrays"]:
                a = z[f"{cfg.id}__{key}"]
                if key.endswith("_bits"):
                    arrays[key[: -len("_bits")]] = _from_bits16(a, cfg.fmt)
                else:
                    arrays[key] = a
            out.append((cfg, entry, arrays))
    return env, out


def load_fixtures(fix_dir: Path) -> tuple[dict[str, Any], list[tuple[Config, dict[str, Any], dict[str, np.ndarray]]]]:
    """(env, [(config, entry, arrays)]) from a fixture directory written by :func:`write_fixtures`."""
    env, items = _load_fixture_dir(Path(fix_dir))
    for cfg, _, arrays in items:
        if cfg.out == "fp32" and "out32" not in arrays:
            arrays["out32"] = arrays["out"]
    return env, items


def fixture_dirs(root: Path) -> list[Path]:
    """Subdirectories of ``root`` (tests/fixtures/gpu) holding fixtures."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if (p / "configs.json").is_file() and (p / "outputs.npz").is_file())


def _optional_float(x: Any) -> float | None:
    """A number of configs.json (text such as ``2.393e-03``, or a number): None where it is empty."""
    return None if x is None or x == "" else float(x)


def compare_fixture(
    cfg: Config, entry: dict[str, Any], arrays: dict[str, np.ndarray], backend: str, family: str = "triton"
) -> ValidationRecord:
    """One recorded GPU config against the emulator under the ``<family>-<fmt>`` plan (int8 configs: the int8
    preset, whatever the family): :func:`compare_to_emulator` on the regenerated inputs."""
    kernel = {k: _optional_float(entry.get(k)) for k in ("kernel_err_max", "kernel_err_rms", "kernel_s")}
    rec = _record(cfg, backend, family, **kernel)
    try:
        q, k, v = make_inputs(cfg)
        if input_crc(q, k, v) != int(entry["input_crc"]):
            return dataclasses.replace(rec, status="error: regenerated inputs differ from the recorded ones (CRC32)")
        ref = reference64(q, k, v, cfg.causal)
        return compare_to_emulator(rec, cfg, (q, k, v), ref, arrays, family=family, fp32_too=True)
    except EmulatorUnavailable as exc:
        return dataclasses.replace(rec, status=f"kernel only: {exc}")
    except Exception as exc:
        return dataclasses.replace(rec, status=_error_status(exc))


def compare_fixtures(
    fix_dir: Path,
    *,
    max_cost: float | None = None,
    families: Sequence[str] = ("triton",),
    ids: Sequence[str] | None = None,
    log: Callable[[str], None] = print,
) -> tuple[dict[str, Any], list[ValidationRecord]]:
    """Every fixture config of ``fix_dir`` against the emulator, under each plan family of ``families``
    (flash configs: one row per family, ``<family>-<fmt>``; int8 configs: one row, the int8 preset). Configs
    whose emulator cost estimate (:func:`emulator_cost`) exceeds ``max_cost`` seconds are skipped (reported),
    configs not in ``ids`` (when given) left out. Returns (env, rows); :func:`agreement_table` tabulates them.

    Raises:
        ValueError: an unknown family (known: :data:`PLAN_FAMILIES`) or none.
        Interrupted: Ctrl-C (its results: env and the rows finished).
    """
    families = list(dict.fromkeys(families))
    if not families:
        raise ValueError("compare_fixtures needs at least one plan family")
    for fam in families:
        if not _known_family(fam):
            raise ValueError(f"unknown plan family {fam!r}; families: {', '.join(PLAN_FAMILIES + tuple(_PROFILES))}")
    from simfloat._interrupt import call_interruptibly

    env, items = load_fixtures(fix_dir)
    backend = f"{env.get('gpu_slug') or Path(fix_dir).name} (fixtures)"
    rows: list[ValidationRecord] = []
    for cfg, entry, arrays in items:
        if ids is not None and cfg.id not in ids:
            continue
        for fam in families if cfg.kind == "flash" else families[:1]:
            if max_cost is not None and emulator_cost(cfg) > max_cost:
                row = _record(cfg, backend, fam, status=f"skipped: emulator cost > {max_cost:g} s")
            else:
                try:
                    row = call_interruptibly(compare_fixture, cfg, entry, arrays, backend, fam)
                except KeyboardInterrupt:
                    raise Interrupted((env, rows), len(rows)) from None
            rows.append(row)
            log(
                f"{row.id} {row.plan}: {row.status} out {_cell(row.bitwise_agreement)} out32 "
                f"{_cell(row.out32_agreement)} m {_cell(row.m_agreement)} l {_cell(row.l_agreement)}"
            )
    return env, rows


#: (column suffix, row field) of :func:`agreement_table`: bitwise agreement of the config's output, the fp32
#: output, m_i and l_i
_AGREEMENTS = (("out", "bitwise_agreement"), ("out32", "out32_agreement"), ("m", "m_agreement"), ("l", "l_agreement"))


def _family_of(row: ValidationRecord) -> str:
    if row.kind != "flash":
        return str(row.kind)
    return row.plan.partition("@")[2] if "@" in row.plan else row.plan.rsplit("-", 1)[0]


def pivot(rows: Sequence[ValidationRecord]) -> list[dict[str, Any]]:
    """Rows of :func:`compare_fixtures` as one row per config: ``id, kind, fmt, bm, bn, out_kind`` and, per
    family F (``int8``, ``sage``: the kind of a quantized kernel), ``F:out``, ``F:out32``, ``F:m``, ``F:l``
    (bitwise agreement; "" where not compared)."""
    by_id: dict[str, dict[str, Any]] = {}
    for r in rows:
        p = by_id.setdefault(
            r.id,
            {"id": r.id, "kind": r.kind, "fmt": r.fmt, "bm": r.block_m, "bn": r.block_n, "out_kind": r.out},
        )
        fam = _family_of(r)
        for suffix, field in _AGREEMENTS:
            value = getattr(r, field)
            p[f"{fam}:{suffix}"] = "" if value is None else value
        if r.status != "ok":
            p[f"{fam}:status"] = r.status
    return list(by_id.values())


def agreement_summary(rows: Sequence[ValidationRecord]) -> list[dict[str, Any]]:
    """Per plan family: the number of configs compared and, over them, the min and mean bitwise agreement of
    the low-precision outputs (configs with ``out == "low"``), the fp32 outputs, m_i and l_i."""
    out = []
    for fam in dict.fromkeys(_family_of(r) for r in rows):
        done = [r for r in rows if _family_of(r) == fam and r.status == "ok"]
        item: dict[str, Any] = {"family": fam, "configs": len(done)}
        for name, field, low_only in (
            ("low", "bitwise_agreement", True),
            ("fp32", "out32_agreement", False),
            ("m", "m_agreement", False),
            ("l", "l_agreement", False),
        ):
            vals = [v for r in done if (r.out == "low" or not low_only) and (v := getattr(r, field)) is not None]
            item[f"{name}_min"] = min(vals) if vals else None
            item[f"{name}_mean"] = float(np.mean(vals)) if vals else None
        out.append(item)
    return out


def agreement_table(rows: Sequence[ValidationRecord]) -> str:
    """The per-config table of :func:`compare_fixtures` rows (one line per config, the bitwise agreement of
    out, out32, m and l under each plan family), then the per-family summary (:func:`agreement_summary`):
    what ``simfloat-gpu validate --fixtures DIR --plans ...`` prints and tests/test_gpu_fixtures.py shows."""
    piv = pivot(rows)
    fams = list(dict.fromkeys(_family_of(r) for r in rows))
    cols = ["id"] + [f"{f}:{s}" for f in fams for s, _ in _AGREEMENTS]
    lines = [" | ".join(cols)]
    for p in piv:
        cells = [str(p.get(c, "")) for c in cols]
        notes = [f"{f}: {p[f + ':status']}" for f in fams if f + ":status" in p]
        lines.append(" | ".join(cells) + (f"  ({'; '.join(notes)})" if notes else ""))
    lines += [
        "",
        "family | configs | low-precision output min (mean) | fp32 output min (mean) | m_i min (mean) | l_i min (mean)",
    ]

    def cell(item: dict[str, Any], name: str) -> str:
        lo, mean = item[f"{name}_min"], item[f"{name}_mean"]
        return "-" if lo is None else f"{lo:.4f} ({mean:.4f})"

    for item in agreement_summary(rows):
        lines.append(
            f"{item['family']} | {item['configs']} | " + " | ".join(cell(item, n) for n in ("low", "fp32", "m", "l"))
        )
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------------
# command line
# ----------------------------------------------------------------------------------------------------


def positive_number(text: str, what: str) -> float:
    """A finite number > 0 from an argument's text, or argparse's error ``expected <what>, got <text>``."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text}")
    return value


def positive_seconds(text: str) -> float:
    """argparse type: a finite number of seconds > 0."""
    return positive_number(text, "a positive number of seconds")


def names_of(text: str, known: Sequence[str], what: str) -> set[str]:
    """argparse type helper: the comma-separated names of ``text``, each one of ``known``, or the error
    ``unknown <what>(s) ...; <what>s: <known>``."""
    names = {t.strip() for t in text.split(",") if t.strip()}
    unknown = sorted(names - set(known))
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown {what}(s) {', '.join(unknown)}; {what}s: {', '.join(known)}")
    return names


def plan_families(text: str) -> list[str]:
    """argparse type: comma-separated plan families of :data:`PLAN_FAMILIES`."""
    names = [t.strip() for t in text.split(",") if t.strip()]
    unknown = [n for n in names if n not in PLAN_FAMILIES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"expected plan families of {', '.join(PLAN_FAMILIES)} (comma-separated), got {text!r}"
        )
    return list(dict.fromkeys(names))


_FIXTURE_FILES = ("env.json", "configs.json", "outputs.npz")


def _check_fixture_dir(path: Path) -> None:
    missing = [n for n in _FIXTURE_FILES if not (path / n).is_file()]
    if not missing:
        return
    if not path.is_dir():
        raise ValueError(f"--fixtures {path}: no such folder")
    inside = fixture_dirs(path)
    hint = f"; fixture folders inside it: {', '.join(map(str, inside))}" if inside else ""
    raise ValueError(f"--fixtures {path}: not a fixture folder (missing {', '.join(missing)}){hint}")


def check_args(args: argparse.Namespace) -> None:
    """What :func:`run` checks before any work: options that would be ignored, the fixtures to read, and
    the folders to write (created here).

    Raises:
        ValueError: naming the option.
    """
    if args.fixtures is not None:
        if args.record_fixtures is not None:
            raise ValueError("--record-fixtures cannot be combined with --fixtures (no kernel runs then)")
        if args.no_emulator:
            raise ValueError("--no-emulator cannot be combined with --fixtures (it compares the emulator)")
        _check_fixture_dir(Path(args.fixtures))
    else:
        if args.max_cost is not None:
            raise ValueError("--max-cost applies only with --fixtures")
        if getattr(args, "hardware", None) is not None:
            raise ValueError("--hardware applies only with --fixtures (it adds a plan family to compare)")
        if getattr(args, "plans", None) is not None:
            raise ValueError(
                "--plans applies only with --fixtures (against the interpreter only the "
                "triton-<fmt> plans are the kernel's model)"
            )
    writable_dir(Path(args.out), "--out")
    if args.record_fixtures is not None:
        writable_dir(Path(args.record_fixtures), "--record-fixtures")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, type=Path, help="output directory (validation.csv, validation.md)")
    p.add_argument("--grid", default="full", choices=("full", "ci", "smoke"), help="config grid (default full)")
    p.add_argument(
        "--backend",
        default="auto",
        choices=("auto", "gpu", "faithful"),
        help="auto: the GPU if torch sees CUDA (and TRITON_INTERPRET is unset), else the faithful CPU interpreter",
    )
    p.add_argument(
        "--jobs",
        type=positive_int,
        default=None,
        help="worker processes (default: CPU count, at most 8 on the interpreter, 12 on a GPU)",
    )
    p.add_argument("--no-int8", action="store_true", help="leave out the int8 configs")
    p.add_argument(
        "--pass",
        dest="passes",
        default="forward",
        choices=("forward", "backward", "both"),
        help="forward kernels (default), the backward kernels (validate_bwd: backward.csv/md) or both",
    )
    p.add_argument("--no-emulator", action="store_true", help="run the kernels only (GPU fixture recording)")
    p.add_argument(
        "--record-fixtures",
        type=Path,
        metavar="DIR",
        help="also write fixtures (configs, seeds, kernel outputs, m_i, l_i, env) into DIR",
    )
    p.add_argument(
        "--fixtures",
        type=Path,
        metavar="DIR",
        help="compare the emulator against recorded GPU fixtures in DIR (no kernel runs)",
    )
    p.add_argument(
        "--plans",
        type=plan_families,
        default=None,
        metavar="FAMILY[,FAMILY...]",
        help="with --fixtures: emulator plan families to compare, comma-separated: triton "
        "(triton-<fmt>: sm90 dot models, correctly rounded exp2, sequential row sums), h200 "
        "(h200-<fmt>: + the H200's measured ex2.approx and tl.sum order); default triton",
    )
    p.add_argument(
        "--hardware",
        type=Path,
        metavar="FILE",
        default=None,
        help="with --fixtures: also compare under plan('triton-<fmt>', hardware=FILE), a hardware profile "
        "(simfloat-gpu fit --profile; or a shipped name such as h200), as the family named by the profile",
    )
    p.add_argument(
        "--max-cost",
        type=positive_seconds,
        default=None,
        help="with --fixtures: skip configs whose emulator cost estimate exceeds this (seconds)",
    )
    p.add_argument(
        "--budget-s",
        type=positive_seconds,
        default=None,
        help="time budget in seconds; configs not started by then are reported as skipped",
    )


def _profile_arg(value: Path) -> str | Path:
    """A --hardware value: a file, else (no such file) a shipped profile's name."""
    return value if value.is_file() else str(value)


def run(args: argparse.Namespace, log: Callable[[str], None] = print) -> int:
    """Run the command parsed by :func:`add_arguments`: options and paths are checked (and the output folders
    created) before any work; returns the exit status (2: bad arguments)."""
    start = time.monotonic()
    try:
        check_args(args)
    except ValueError as err:
        print(f"validate: error: {err}", file=sys.stderr)
        return 2
    out_dir: Path = args.out
    if args.fixtures is not None:
        import simfloat

        families = list(args.plans or ["triton"])
        if getattr(args, "hardware", None) is not None:
            try:
                families = list(dict.fromkeys([*families, use_hardware(_profile_arg(args.hardware))]))
            except ValueError as err:
                print(f"validate: error: --hardware: {err}", file=sys.stderr)
                return 2
        stop = None
        try:
            env, rows = compare_fixtures(args.fixtures, max_cost=args.max_cost, families=families, log=log)
        except Interrupted as exc:
            stop = exc
            env, rows = exc.results
        env = dict(env, compared_on=environment("cpu"), simfloat=simfloat.__version__)
        table = agreement_table(rows)
        names = ", ".join(f"{f}-<fmt>" for f in families)
        write_report(
            out_dir,
            rows,
            env,
            None,
            elapsed=time.monotonic() - start,
            title=f"Emulator ({names} plans) vs recorded {Path(args.fixtures).name} kernel outputs",
            notes=[
                "triton-<fmt>: sm90 tensor-core model, correctly rounded exp2, sequential row "
                "sums: known inexact on a GPU in exp2 (ex2.approx.ftz.f32 is not correctly "
                "rounded) and the row sum l_ij (a layout-dependent tree); m_i depends on the QK^T "
                "model alone. h200-<fmt>: the same with the H200's measured ex2.approx and tl.sum "
                "order."
            ],
        )
        with open(out_dir / "validation.md", "a") as f:
            f.write(f"\n## Bitwise agreement per config and plan family\n\n```\n{table}\n```\n")
        log(table)
        if stop is None:  # backward fixtures (the fixture folder's backward/): the same families, flash_backward
            from simfloat_gpu.campaign import validate_bwd

            bwd_rows = validate_bwd.compare_backward_fixtures(
                args.fixtures, families=[f for f in families if f in PLAN_FAMILIES], log=log
            )
            if bwd_rows:
                bwd_table = validate_bwd.write_backward_report(
                    out_dir,
                    bwd_rows,
                    f"Emulator flash_backward vs recorded {Path(args.fixtures).name} backward kernel outputs",
                    elapsed=time.monotonic() - start,
                    unit="(config, plan) rows",
                )
                with open(out_dir / "validation.md", "a") as f:
                    f.write(f"\n## Backward: bitwise agreement per config and plan\n\n{bwd_table}")
                log(bwd_table)
        if stop is not None:
            print(
                f"validate: interrupted after {time.monotonic() - start:.1f} s: {len(rows)} comparisons "
                f"finished, kept in {out_dir / 'validation.csv'} and validation.md",
                file=sys.stderr,
            )
            return 130
        log(f"wrote {out_dir / 'validation.csv'} and validation.md")
        return 0
    backend = resolve_backend(args.backend)
    bwd_failed = False
    if getattr(args, "passes", "forward") in ("backward", "both"):
        from simfloat_gpu.campaign.validate_bwd import run_backward

        bwd_deadline = None if args.budget_s is None else start + float(args.budget_s)
        bwd_rows = run_backward(
            out_dir, args.grid, backend, emulate=not args.no_emulator, deadline=bwd_deadline, log=log
        )
        bwd_failed = backend == "faithful" and not args.no_emulator and any(r.status != "bitwise" for r in bwd_rows)
        log(
            f"backward: {sum(r.status == 'bitwise' for r in bwd_rows)}/{len(bwd_rows)} bitwise; wrote "
            f"{out_dir / 'backward.csv'}"
        )
        if args.passes == "backward":
            return 1 if bwd_failed else 0
    configs = grid(args.grid, int8=not args.no_int8)
    jobs = args.jobs
    if jobs is None:
        jobs = min(os.cpu_count() or 1, 8 if backend == "faithful" else 12)
    deadline = None if args.budget_s is None else start + float(args.budget_s)
    emulate = not args.no_emulator
    if emulate:
        import simfloat  # noqa: F401  (fail early and clearly if it is not importable)
    log(f"validate: {len(configs)} configs ({args.grid} grid), backend {backend}, {jobs} job(s)")
    stop = None
    try:
        results = run_grid(
            configs,
            backend,
            jobs=jobs,
            emulate=emulate,
            record=args.record_fixtures is not None,
            deadline=deadline,
            log=log,
        )
    except Interrupted as exc:
        stop = exc
        results = exc.results
    rows = [r for r, _ in results]
    env = environment(backend)
    config = None
    if backend == "faithful" and stop is None:  # an interrupted config may still be inside faithful()
        from simfloat_gpu.interpreter import faithful, faithful_config

        with faithful():
            config = faithful_config()
    elapsed = time.monotonic() - start
    env["elapsed_s"] = round(elapsed, 1)
    env["jobs"] = jobs
    env["cpu_s"] = _cpu_seconds()
    with contextlib.suppress(Exception):
        env["load_average"] = [round(x, 2) for x in os.getloadavg()]
    if args.record_fixtures is not None:
        n = write_fixtures(args.record_fixtures, results, configs, env)
        log(f"recorded {n} fixture configs in {args.record_fixtures}")
    where = "GPU" if backend == "gpu" else "faithful CPU interpreter"
    write_report(
        out_dir,
        rows,
        env,
        config,
        elapsed=elapsed,
        title=f"Triton kernels ({where}) vs simfloat emulator, {args.grid} grid",
    )
    s = summarize(rows)
    if stop is not None:
        print(
            f"validate: interrupted after {elapsed:.1f} s: {stop.finished} of {len(configs)} configs finished "
            f"({s['bitwise_100']}/{s['compared']} compared bitwise identical), kept in "
            f"{out_dir / 'validation.csv'} and validation.md"
            + (f" and the fixtures in {args.record_fixtures}" if args.record_fixtures is not None else ""),
            file=sys.stderr,
        )
        return 130
    log(
        f"{s['configs']} configs in {elapsed:.1f} s ({env['cpu_s']} CPU s): "
        f"{s['bitwise_100']}/{s['compared']} "
        f"bitwise identical, "
        f"{s['kernel_only']} kernel only, {s['errors']} errors, {s['skipped']} skipped; wrote {out_dir}"
    )
    if backend == "faithful" and emulate and (s["bitwise_100"] != s["compared"] or s["errors"]):
        return 1
    return 1 if bwd_failed else 0


def main(argv: Sequence[str] | None = None, prog: str = "simfloat-gpu validate") -> int:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    add_arguments(p)
    args = p.parse_args(argv)
    try:
        return run(args)
    except RuntimeError as exc:  # no triton / no CUDA / TRITON_INTERPRET set too late: say what to do
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
