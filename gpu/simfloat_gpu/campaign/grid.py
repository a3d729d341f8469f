"""The validation grid: a config (:class:`Config`), the grids of configs (:func:`grid`) and each config's inputs
and float64 reference.

Grid design (``grid("full")``): the dimensions are format {bf16, fp16} x BLOCK_M x BLOCK_N {16, 32, 64, 128} x
seq {64, 97, 256, 1000} x head_dim {16, 64, 128} x causal {off, on} x output {fp32, input format}: 1536
points, far too many for the interpreter. Three parts:

1. a cost-weighted greedy **all-pairs** covering array (:func:`all_pairs`): every pair of values of any two
   dimensions occurs in at least one config (186 pairs, 25 configs); the greedy picks, at each step, the config
   covering the most uncovered pairs per estimated second of interpreter + emulator time;
2. the **full factorial** format x BLOCK_M x BLOCK_N x causal (64 configs) at seq 97 (a partial last tile
   for every block size), head_dim 16, the output alternating fp32 / input format;
3. two **stress** configs (seq 256 with 16 x 16 tiles and head_dim 128; seq 1000, head_dim 64);

Why these shapes: seq 97 (prime) and 1000 are multiples of no block size, so the last query and key tiles are
partial and a kernel's masking of ragged tiles is exercised (a kernel without masks reads and writes past the
ends: the interpreter may fault); seq 64 and 256 are whole tiles. Block sizes run from 16 to 128 on both axes,
BLOCK_M < BLOCK_N included, and block 128 goes with head dim 16 and 64 too, so tiles larger than the sequence
or than the head dim occur: the project's kernel masks every load and store and takes any of them. Head dims
16, 64, 128 are the powers of two ``tl.arange`` needs.

Many kernels written for speed (Triton's fused-attention tutorial) take only some of these: no masks (seq a
multiple of the blocks), BLOCK_M a multiple of BLOCK_N for their causal stages, head dim 64 or more. The
**tiles** grid (``grid("tiles")``, flash only) is for them: seq {128, 256, 512}, head dim {64, 128}, (BLOCK_M,
BLOCK_N) in {(64, 32), (64, 64), (128, 64), (128, 128)} (TILE_BLOCKS), every seq a multiple of both blocks,
each value of every dimension at least once (as "ci"), cheapest first.

plus int8 configs (INT-FlashAttention "int8" and "half-int8", both row sums, seq 64..1000) and sage configs
(SageAttention2-style INT8 QK^T / FP8 P.V, seq 97..1000; the ci grid: seq 40). Queries are
standard normal x 1.5, keys and values standard normal (numpy ``default_rng(seed)``), rounded to the format
(round to nearest even); seq_q = seq_k = seq, batch 1, 2 heads (1 at seq 1000), scale 1/sqrt(head_dim).
The backward grids (:func:`simfloat_gpu.campaign.validate_bwd.backward_grid`) are built from the same parts.

Imports only numpy and the standard library.
"""

from __future__ import annotations

import dataclasses
import itertools
import zlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from simfloat_gpu.campaign.kinds import KINDS, SAGE_VARIANTS

__all__ = [
    "BLOCKS",
    "CAUSAL",
    "Config",
    "FORMATS",
    "GRID_VERSION",
    "HEAD_DIMS",
    "OUTS",
    "PRECISIONS",
    "SEQS",
    "SPREAD",
    "TILE_BLOCKS",
    "TILE_HEAD_DIMS",
    "TILE_SEQS",
    "all_pairs",
    "all_values",
    "dedupe",
    "emulator_cost",
    "estimated_cost",
    "flash_config",
    "grid",
    "input_crc",
    "make_inputs",
    "reference64",
    "round_to_format",
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
#: the "tiles" grid: (BLOCK_M, BLOCK_N) pairs common in fast kernels (BLOCK_M a multiple of BLOCK_N), sequence
#: lengths that are multiples of every block (no ragged tile: kernels without masks take them), head dims
TILE_BLOCKS = ((64, 32), (64, 64), (128, 64), (128, 128))
TILE_SEQS = (128, 256, 512)
TILE_HEAD_DIMS = (64, 128)
#: queries are N(0, SPREAD^2): sharper softmax rows than N(0, 1), so that max / rescale paths are exercised
SPREAD = 1.5
#: bump when the grid or the input generation changes (recorded in fixtures)
GRID_VERSION = 1


# ----------------------------------------------------------------------------------------------------
# configs and the grid
# ----------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Config:
    """One validation point. ``out`` is "fp32" or "low" (the input format; int8 kernels write fp16)."""

    kind: str  # a kind of simfloat_gpu.campaign.kinds.KINDS: "flash" | "int8" | "sage"
    fmt: str  # input format: "bf16" | "fp16"
    seq: int
    head_dim: int
    block_m: int
    block_n: int
    causal: bool
    out: str
    variant: str = ""  # int8: an INT8_VARIANTS entry; sage: a SAGE_VARIANTS preset
    row_sum: str = ""  # int8: "reference" | "consistent"
    heads: int = 2
    batch: int = 1
    kv_heads: int = 0  # key/value heads (grouped-query attention); 0: as many as heads. Backward grids only
    precision: str = ""  # fmt "fp32": a PRECISIONS entry (the dots' input_precision). Backward grids only

    def __post_init__(self) -> None:
        kind = KINDS.get(self.kind)
        if kind is None:
            raise ValueError(f"Config.kind must be one of {', '.join(map(repr, KINDS))}, got {self.kind!r}")
        if self.fmt == "fp32" and kind.fp32_inputs:
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
        if kind.variants and (self.variant not in kind.variants or self.out != "low"):
            raise ValueError(kind.requirement)

    @property
    def id(self) -> str:
        return (
            f"{KINDS[self.kind].label(self)}-{self.fmt}-s{self.seq}-d{self.head_dim}-m{self.block_m}n{self.block_n}-"
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


def flash_config(fmt: str, bm: int, bn: int, seq: int, d: int, causal: bool, out: str) -> Config:
    """A flash config of the grids: batch 1, 2 heads (1 at seq >= 1000)."""
    return Config("flash", fmt, seq, d, bm, bn, causal, out, heads=_heads(seq))


def all_pairs(dims: Sequence[Sequence[Any]], make: Callable[..., Config]) -> list[Config]:
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


def all_values(dims: Sequence[Sequence[Any]], make: Callable[..., Config]) -> list[Config]:
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


def dedupe(configs: Iterable[Config]) -> list[Config]:
    seen: set[str] = set()
    out = []
    for c in configs:
        if c.id not in seen:
            seen.add(c.id)
            out.append(c)
    return out


def grid(name: str = "full", *, int8: bool = True) -> list[Config]:
    """The validation grid: "full" (see the module docstring: seq 64, 97, 256, 1000 (97 and 1000 leave a partial
    last tile), head dim 16, 64, 128, blocks 16..128), "ci" (every value of every dimension at least once,
    cheapest first: the CI test's subset), "smoke" (three tiny configs) or "tiles" (flash only: seq 128, 256,
    512, head dim 64, 128, blocks :data:`TILE_BLOCKS`: whole tiles only, for kernels without masks; every value
    at least once).

    Raises:
        ValueError: an unknown name.
    """
    dims = (FORMATS, BLOCKS, BLOCKS, SEQS, HEAD_DIMS, CAUSAL, OUTS)
    if name == "full":
        pairs = all_pairs(dims, flash_config)
        factorial = [
            flash_config(f, bm, bn, 97, 16, c, OUTS[(i + j + int(c)) % 2])
            for f in FORMATS
            for i, bm in enumerate(BLOCKS)
            for j, bn in enumerate(BLOCKS)
            for c in CAUSAL
        ]
        stress = [
            flash_config("fp16", 16, 16, 256, 128, True, "fp32"),
            flash_config("bf16", 64, 32, 1000, 64, True, "low"),
        ]
        configs = pairs + factorial + stress + (_int8_configs(False) + _sage_configs(False) if int8 else [])
    elif name == "ci":
        configs = all_values(dims, flash_config) + [flash_config("fp16", 32, 16, 97, 64, True, "fp32")]
        configs += _int8_configs(True) + _sage_configs(True) if int8 else []
    elif name == "smoke":
        configs = [
            flash_config("bf16", 16, 16, 40, 16, True, "fp32"),
            flash_config("fp16", 32, 16, 33, 16, False, "low"),
        ]
        configs += (
            [Config("int8", "fp16", 40, 32, 16, 32, False, "low", variant="int8", row_sum="reference")] if int8 else []
        )
    elif name == "tiles":

        def tiles(f: str, blocks: tuple[int, int], seq: int, d: int, causal: bool, out: str) -> Config:
            return flash_config(f, blocks[0], blocks[1], seq, d, causal, out)

        configs = all_values((FORMATS, TILE_BLOCKS, TILE_SEQS, TILE_HEAD_DIMS, CAUSAL, OUTS), tiles)
    else:
        raise ValueError(f"unknown grid {name!r}; known: full, ci, smoke, tiles")
    return dedupe(configs)


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
    """Exact-ish softmax attention in float64 (scale 1/sqrt(head_dim), top-left causal mask):
    :func:`simfloat.tolerances.reference64`."""
    from simfloat.tolerances import reference64 as attention64

    return attention64(q, k, v, causal=causal)
