"""The reports of the validation campaign: where the kernels ran (:func:`environment`), validation.csv and
validation.md (:func:`write_report`), and the tables of fixture comparisons under several plan families
(:func:`pivot`, :func:`agreement_summary`, :func:`agreement_table`).

Imports only numpy and the standard library at import time.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import platform
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from simfloat_gpu.campaign.grid import GRID_VERSION
from simfloat_gpu.campaign.kinds import KINDS
from simfloat_gpu.campaign.records import ValidationRecord

__all__ = [
    "FIELDS",
    "KERNELS_DIR",
    "KERNEL_COLUMNS",
    "MD_COLUMNS",
    "agreement_summary",
    "agreement_table",
    "cell",
    "cpu_seconds",
    "environment",
    "family_of",
    "file_sha256",
    "gpu_slug",
    "pivot",
    "summarize",
    "write_report",
]

#: where the kernel sources are (their hashes go into every fixture record)
KERNELS_DIR = Path(__file__).resolve().parents[1] / "kernels"
#: the columns of validation.csv: the fields of :class:`ValidationRecord`
FIELDS = ValidationRecord.csv_fields()

#: columns of :meth:`simfloat_gpu.campaign.user_kernel.KernelComparison.table`
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


# ----------------------------------------------------------------------------------------------------
# environment and reports
# ----------------------------------------------------------------------------------------------------


def file_sha256(path: Path) -> str:
    """The first 16 hex digits of a file's SHA-256 ("" where it cannot be read)."""
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
        p: file_sha256(KERNELS_DIR / p)
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


def cpu_seconds() -> float:
    """CPU seconds (user + system) of this process and its reaped children (the worker processes)."""
    try:
        import resource

        me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return round(me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime, 1)
    except Exception:
        return float("nan")


def cell(v: Any) -> str:
    """A value in a log line: None (not measured) as an empty string."""
    return "" if v is None else str(v)


#: columns of validation.md: those of :data:`KERNEL_COLUMNS` and the seconds
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
# fixture comparisons under several plan families
# ----------------------------------------------------------------------------------------------------

#: (column suffix, row field) of :func:`agreement_table`: bitwise agreement of the config's output, the fp32
#: output, m_i and l_i
_AGREEMENTS = (("out", "bitwise_agreement"), ("out32", "out32_agreement"), ("m", "m_agreement"), ("l", "l_agreement"))


def family_of(row: ValidationRecord) -> str:
    """The plan family of a row: the family of its plan (``<family>-<fmt>``, ``triton-<fmt>@<family>``), or
    the kind of a kernel compared under its own preset only (``int8``, ``sage``)."""
    if not KINDS[str(row.kind)].every_family:
        return str(row.kind)
    return row.plan.partition("@")[2] if "@" in row.plan else row.plan.rsplit("-", 1)[0]


def pivot(rows: Sequence[ValidationRecord]) -> list[dict[str, Any]]:
    """Rows of :func:`simfloat_gpu.campaign.fixtures.compare_fixtures` as one row per config: ``id, kind, fmt,
    bm, bn, out_kind`` and, per family F (``int8``, ``sage``: the kind of a quantized kernel), ``F:out``,
    ``F:out32``, ``F:m``, ``F:l`` (bitwise agreement; "" where not compared)."""
    by_id: dict[str, dict[str, Any]] = {}
    for r in rows:
        p = by_id.setdefault(
            r.id,
            {"id": r.id, "kind": r.kind, "fmt": r.fmt, "bm": r.block_m, "bn": r.block_n, "out_kind": r.out},
        )
        fam = family_of(r)
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
    for fam in dict.fromkeys(family_of(r) for r in rows):
        done = [r for r in rows if family_of(r) == fam and r.status == "ok"]
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
    """The per-config table of :func:`simfloat_gpu.campaign.fixtures.compare_fixtures` rows (one line per
    config, the bitwise agreement of out, out32, m and l under each plan family), then the per-family summary
    (:func:`agreement_summary`): what ``simfloat-gpu validate --fixtures DIR --plans ...`` prints and
    tests/gpu/test_gpu_fixtures.py shows."""
    piv = pivot(rows)
    fams = list(dict.fromkeys(family_of(r) for r in rows))
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
