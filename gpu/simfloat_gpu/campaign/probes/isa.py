"""Probe 3, **isa**: PTX and SASS of the flash kernels and the instruction facts read from them (see
:mod:`simfloat_gpu.campaign.probes`)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# ----------------------------------------------------------------------------------------------------
# 3. isa
# ----------------------------------------------------------------------------------------------------

#: (label, kind, fmt, block_m, block_n, head_dim)
ISA_SPECS = (
    ("flash_bf16_b64", "flash", "bf16", 64, 64, 64),
    ("flash_bf16_b32", "flash", "bf16", 32, 32, 64),
    ("flash_fp16_b16", "flash", "fp16", 16, 16, 16),
    ("int8_b64", "int8", "int8", 64, 64, 64),
)


def _cuobjdump() -> str | None:
    path = shutil.which("cuobjdump")
    if path:
        return path
    try:
        import triton

        cand = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
        return str(cand) if cand.exists() else None
    except Exception:
        return None


def sass_of(cubin: bytes) -> str:
    """SASS text of a cubin via cuobjdump ("" if it is not available)."""
    tool = _cuobjdump()
    if tool is None:
        return ""
    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / "k.cubin"
        p.write_bytes(cubin)
        r = subprocess.run([tool, "-sass", str(p)], capture_output=True, text=True, timeout=120)
        return r.stdout if r.returncode == 0 else f"// cuobjdump failed: {r.stderr[-500:]}"


def _ptx_defs(ptx: str) -> dict[str, str]:
    """PTX register -> the instruction (opcode) that last defines it (straight-line approximation)."""
    defs: dict[str, str] = {}
    for line in ptx.splitlines():
        m = re.match(r"\s*(?:@%p\d+\s+)?([a-z][\w.]*)\s+(%[\w]+)\s*,", line)
        if m:
            defs[m.group(2)] = m.group(1)
    return defs


def isa_facts(ptx: str, sass: str) -> dict[str, Any]:
    """Facts read from a kernel's PTX and SASS."""

    def count(pat: str, text: str) -> int:
        return len(re.findall(pat, text))

    defs = _ptx_defs(ptx)
    ex2_src = []
    for m in re.finditer(r"ex2\.approx[\w.]*\s+%\w+\s*,\s*(%\w+)", ptx):
        ex2_src.append(defs.get(m.group(1), "?"))
    facts: dict[str, Any] = {
        "ptx": {
            "ex2.approx.ftz.f32": count(r"ex2\.approx\.ftz\.f32", ptx),
            "ex2.approx.f32": count(r"ex2\.approx\.f32", ptx),
            "div.rn.f32": count(r"div\.rn\.f32", ptx),
            "div.full.f32": count(r"div\.full\.f32", ptx),
            "div.approx.f32": count(r"div\.approx(\.ftz)?\.f32", ptx),
            "rcp": count(r"\brcp\.", ptx),
            "fma.rn.f32": count(r"fma\.rn\.f32", ptx),
            "mul.f32": count(r"\bmul(\.rn)?\.f32", ptx),
            "add.f32": count(r"\badd(\.rn)?\.f32", ptx),
            "shfl.sync.bfly": count(r"shfl\.sync\.bfly", ptx),
            "cvt.rn.bf16x2.f32": count(r"cvt\.rn\.bf16x2\.f32", ptx),
            "cvt.rn.f16x2.f32": count(r"cvt\.rn\.f16x2\.f32", ptx),
            "mma": sorted(set(re.findall(r"\b(wgmma\.mma_async[\w.]*|mma\.sync[\w.]*)", ptx))),
        },
        "ex2_input_defined_by": {op: ex2_src.count(op) for op in sorted(set(ex2_src))},
    }
    if sass:
        ops = re.findall(r"^\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", sass, flags=re.M)
        hist: dict[str, int] = {}
        for op in ops:
            hist[op] = hist.get(op, 0) + 1
        # what feeds each MUFU.EX2: the last earlier instruction writing its source register
        lines = [ln for ln in sass.splitlines() if re.match(r"^\s*/\*[0-9a-f]+\*/", ln)]
        feeders: dict[str, int] = {}
        for i, ln in enumerate(lines):
            m = re.search(r"MUFU\.EX2\s+R\d+,\s*(-?\|?R\d+)", ln)
            if not m:
                continue
            src = m.group(1).strip("-|")
            for prev in reversed(lines[max(0, i - 40) : i]):
                pm = re.search(r"\s([A-Z][A-Z0-9_.]*)\s+(R\d+)\s*,", prev)
                if pm and pm.group(2) == src:
                    feeders[pm.group(1)] = feeders.get(pm.group(1), 0) + 1
                    break
        facts["sass"] = {
            "MUFU.EX2": hist.get("MUFU.EX2", 0),
            "MUFU.RCP": hist.get("MUFU.RCP", 0),
            "FFMA": sum(v for k, v in hist.items() if k.startswith("FFMA")),
            "FMUL": sum(v for k, v in hist.items() if k.startswith("FMUL")),
            "FADD": sum(v for k, v in hist.items() if k.startswith("FADD")),
            "HGMMA": sum(v for k, v in hist.items() if k.startswith("HGMMA")),
            "HMMA": sum(v for k, v in hist.items() if k.startswith("HMMA")),
            "IMMA": sum(v for k, v in hist.items() if k.startswith("IMMA")),
            "IGMMA": sum(v for k, v in hist.items() if k.startswith("IGMMA")),
            "SHFL.BFLY": sum(v for k, v in hist.items() if k.startswith("SHFL.BFLY")),
            "ex2_input_defined_by": feeders,
            "opcodes": dict(sorted(hist.items(), key=lambda kv: -kv[1])[:40]),
        }
    p = facts["ptx"]
    facts["summary"] = {
        "exp2_instruction": (
            "ex2.approx.ftz.f32" if p["ex2.approx.ftz.f32"] else "ex2.approx.f32" if p["ex2.approx.f32"] else "none"
        ),
        "qk_scale_minus_m_is_fma": bool(facts["ex2_input_defined_by"].get("fma.rn.f32", 0)),
        "division": (
            "div.rn.f32"
            if p["div.rn.f32"]
            else "div.full.f32"
            if p["div.full.f32"]
            else "div.approx"
            if p["div.approx.f32"]
            else "none"
        ),
        "mma": "wgmma" if any(s.startswith("wgmma") for s in p["mma"]) else ("mma.sync" if p["mma"] else "none"),
    }
    return facts


def _cache_artifacts(cache: Path, name: str, seen: set[Path]) -> tuple[str, bytes] | None:
    new = [p for p in cache.rglob(f"{name}.ptx") if p not in seen]
    if not new:
        return None
    p = max(new, key=lambda q: q.stat().st_mtime)
    seen.add(p)
    cubin = p.with_suffix(".cubin")
    return p.read_text(), (cubin.read_bytes() if cubin.exists() else b"")


def _launch_spec(spec: tuple) -> str:
    """Launch one ISA spec on the GPU (small inputs); returns the kernel's function name."""
    import torch

    _, kind, fmt, bm, bn, d = spec
    g = torch.Generator().manual_seed(0)
    shape = (1, 1, 2 * max(bm, bn), d)
    if kind == "flash":
        from simfloat_gpu.kernels.flash_attention import flash_attention

        dt = torch.bfloat16 if fmt == "bf16" else torch.float16
        q, k, v = (torch.randn(shape, generator=g).to(dt).cuda() for _ in range(3))
        flash_attention(q, k, v, block_m=bm, block_n=bn)
        return "_attn_fwd"
    from simfloat_gpu.kernels.int8_attention import int8_attention

    q, k, v = (torch.randn(shape, generator=g).half().cuda() for _ in range(3))
    int8_attention(q, k, v, block_m=bm, block_n=bn, variant="int8")
    return "_int8_attn_fwd"


def _compile_spec(spec: tuple, capability: int = 90) -> tuple[str, bytes]:
    """Cross-compile one ISA spec for sm_<capability> without a GPU (ptx, cubin)."""
    import inspect

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    _, kind, fmt, bm, bn, d = spec
    if kind == "flash":
        import simfloat_gpu.kernels.flash_attention as fa

        fn = fa._attn_fwd
        ptrs = {"Q": f"*{fmt}", "K": f"*{fmt}", "V": f"*{fmt}", "Out": f"*{fmt}", "M": "*fp32", "L": "*fp32"}
        consts = dict(
            HEAD_DIM=d,
            BLOCK_M=bm,
            BLOCK_N=bn,
            IS_CAUSAL=False,
            INPUT_PRECISION="ieee",
            LAZY_RESCALE=False,
            RESCALE_THRESHOLD=0.0,
        )
    else:
        import simfloat_gpu.kernels.int8_attention as ia

        fn = ia._int8_attn_fwd
        ptrs = {
            "Q": "*i8",
            "QS": "*fp32",
            "K": "*i8",
            "KS": "*fp32",
            "V": "*i8",
            "VS": "*fp32",
            "Out": "*fp16",
            "M": "*fp32",
            "L": "*fp32",
        }
        consts = dict(HEAD_DIM=d, BLOCK_M=bm, BLOCK_N=bn, IS_CAUSAL=False, FULL_INT8=True, ROW_SUM_QUANTIZED=False)
    sig = {}
    for name in inspect.signature(fn.fn).parameters:
        if name in consts:
            sig[name] = "constexpr"
        elif name in ptrs:
            sig[name] = ptrs[name]
        elif name == "qk_scale":
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
    kernel = triton.compile(
        ASTSource(fn, sig, constexprs=consts),
        target=GPUTarget("cuda", capability, 32),
        options=dict(num_warps=4, num_stages=2),
    )
    return kernel.asm["ptx"], kernel.asm.get("cubin", b"")


def isa_probe(
    out_dir: Path,
    *,
    compile_only: bool | None = None,
    deadline: float | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """PTX/SASS of :data:`ISA_SPECS` into ``out_dir`` (``<label>.ptx``, ``<label>.sass``) and the facts
    (returned and written as ``isa.json``). Must run in a process where TRITON_INTERPRET is unset and
    TRITON_CACHE_DIR points to a fresh directory (the GPU path reads the compiled kernels back from it)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    import torch
    import triton

    gpu = torch.cuda.is_available() if compile_only is None else not compile_only
    cache = Path(os.environ.get("TRITON_CACHE_DIR", Path.home() / ".triton" / "cache"))
    seen: set[Path] = set(cache.rglob("*.ptx")) if cache.exists() else set()
    result: dict[str, Any] = {
        "triton": triton.__version__,
        "mode": "launch" if gpu else "cross-compile sm_90",
        "kernels": {},
    }
    for spec in ISA_SPECS:
        label = spec[0]
        if deadline is not None and time.monotonic() > deadline:
            result["kernels"][label] = {"error": "skipped: time budget"}
            continue
        t0 = time.perf_counter()
        try:
            if gpu:
                name = _launch_spec(spec)
                art = _cache_artifacts(cache, name, seen)
                if art is None:
                    raise RuntimeError(f"no {name}.ptx appeared in TRITON_CACHE_DIR={cache}")
                ptx, cubin = art
            else:
                ptx, cubin = _compile_spec(spec)
            sass = sass_of(cubin) if cubin else ""
            (out_dir / f"{label}.ptx").write_text(ptx)
            if sass:
                (out_dir / f"{label}.sass").write_text(sass)
            facts = isa_facts(ptx, sass)
            facts["spec"] = dict(zip(("label", "kind", "fmt", "block_m", "block_n", "head_dim"), spec, strict=True))
            result["kernels"][label] = facts
            log(f"isa {label}: {facts['summary']} ({time.perf_counter() - t0:.1f} s)")
        except Exception as exc:
            result["kernels"][label] = {"error": f"{type(exc).__name__}: {str(exc)[:500]}"}
            log(f"isa {label}: failed: {type(exc).__name__}: {exc}")
    (out_dir / "isa.json").write_text(json.dumps(result, indent=1) + "\n")
    return result
