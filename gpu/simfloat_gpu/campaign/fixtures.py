"""GPU fixtures: a GPU run's kernel outputs recorded with the configs and the environment, and the emulator
compared against them with no kernel run.

A fixture folder holds ``configs.json`` (the configs with their input seeds: inputs are regenerated from seed
+ shape + dtype and checked by CRC32, never stored), ``outputs.npz`` (compressed: the kernel's fp32 output and
its low-precision output, m_i and l_i) and ``env.json``. A ``backward/`` subfolder of the same layout (written
by ``simfloat-gpu run``: the backward kernels' dq, dk, dv, delta, lse, o, m, l) is read by
:func:`simfloat_gpu.campaign.validate_bwd.compare_backward_fixtures`, through the folder helpers of this module
(:func:`add_fixture_arrays`, :func:`fixture_entry`, :func:`save_fixture_dir`, :func:`load_fixture_dir`).

Imports only numpy and the standard library at import time: simfloat is loaded where used.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from simfloat_gpu.campaign.compare import compare_to_emulator, error_status, from_bits16, new_record, raw_bits
from simfloat_gpu.campaign.grid import GRID_VERSION, SPREAD, Config, emulator_cost, input_crc, make_inputs, reference64
from simfloat_gpu.campaign.kinds import family_names, kind_of, known_family
from simfloat_gpu.campaign.records import BackwardRecord, ValidationRecord
from simfloat_gpu.campaign.report import cell
from simfloat_gpu.campaign.running import Interrupted, Result

__all__ = [
    "FIXTURE_FILES",
    "add_fixture_arrays",
    "check_fixture_dir",
    "compare_fixture",
    "compare_fixtures",
    "fixture_dirs",
    "fixture_entry",
    "load_fixture_dir",
    "load_fixtures",
    "optional_float",
    "save_fixture_dir",
    "write_fixtures",
]

#: the files of a fixture folder
FIXTURE_FILES = ("env.json", "configs.json", "outputs.npz")


def write_fixtures(
    fix_dir: Path,
    results: Sequence[Result],
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
        names = sorted(add_fixture_arrays(arrays, cfg, kernel, kernel, low))
        entries.append(fixture_entry(cfg, rec, crc, ("kernel_err_max", "kernel_err_rms"), names))
    save_fixture_dir(fix_dir, env, entries, arrays)
    return len(entries)


def add_fixture_arrays(
    arrays: dict[str, np.ndarray],
    cfg: Config,
    kernel: Mapping[str, np.ndarray],
    names: Iterable[str],
    low: Container[str],
) -> list[str]:
    """Add the kernel's arrays ``names`` of one config to a fixture's ``arrays`` as ``<config id>__<key>``: those
    in ``low`` (values of the 16-bit input format) as their bit patterns (uint16, key ``<name>_bits``), the rest
    as float32. Returns the keys, in the order of ``names``; :func:`load_fixture_dir` reads them back."""
    keys = []
    for name in names:
        if name in low:
            key, value = f"{name}_bits", raw_bits(kernel[name], cfg.fmt).astype(np.uint16)
        else:
            key, value = name, np.asarray(kernel[name], dtype=np.float32)
        arrays[f"{cfg.id}__{key}"] = value
        keys.append(key)
    return keys


def fixture_entry(
    cfg: Config, rec: ValidationRecord | BackwardRecord, crc: int, errors: Sequence[str], keys: list[str]
) -> dict[str, Any]:
    """The configs.json entry of one recorded config (forward or backward): the config, the CRC32 of its
    inputs, the kernel's ``errors`` columns as the record's CSV has them (text), its seconds, its array keys."""
    row = rec.to_csv_row()  # configs.json keeps the errors as the text of the CSV
    entry = cfg.as_dict()
    entry.update(input_crc=crc, **{name: row[name] for name in errors}, kernel_s=rec.kernel_s, arrays=keys)
    return entry


def save_fixture_dir(
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


def load_fixture_dir(
    fix_dir: Path,
) -> tuple[dict[str, Any], list[tuple[Config, dict[str, Any], dict[str, np.ndarray]]]]:
    """(env, [(config, entry, arrays)]) of a folder :func:`save_fixture_dir` wrote: arrays stored as bits
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
                    arrays[key[: -len("_bits")]] = from_bits16(a, cfg.fmt)
                else:
                    arrays[key] = a
            out.append((cfg, entry, arrays))
    return env, out


def load_fixtures(fix_dir: Path) -> tuple[dict[str, Any], list[tuple[Config, dict[str, Any], dict[str, np.ndarray]]]]:
    """(env, [(config, entry, arrays)]) from a fixture directory written by :func:`write_fixtures`."""
    env, items = load_fixture_dir(Path(fix_dir))
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


def optional_float(x: Any) -> float | None:
    """A number of configs.json (text such as ``2.393e-03``, or a number): None where it is empty."""
    return None if x is None or x == "" else float(x)


def compare_fixture(
    cfg: Config, entry: dict[str, Any], arrays: dict[str, np.ndarray], backend: str, family: str = "triton"
) -> ValidationRecord:
    """One recorded GPU config against the emulator under the ``<family>-<fmt>`` plan (int8 configs: the int8
    preset, whatever the family): :func:`compare_to_emulator` on the regenerated inputs."""
    kernel = {k: optional_float(entry.get(k)) for k in ("kernel_err_max", "kernel_err_rms", "kernel_s")}
    rec = new_record(cfg, backend, family, **kernel)
    try:
        q, k, v = make_inputs(cfg)
        if input_crc(q, k, v) != int(entry["input_crc"]):
            return dataclasses.replace(rec, status="error: regenerated inputs differ from the recorded ones (CRC32)")
        ref = reference64(q, k, v, cfg.causal)
        return compare_to_emulator(rec, cfg, (q, k, v), ref, arrays, family=family, fp32_too=True)
    except Exception as exc:
        return dataclasses.replace(rec, status=error_status(exc))


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
        ValueError: an unknown family (known: :func:`simfloat_gpu.campaign.kinds.family_names`) or none.
        Interrupted: Ctrl-C (its results: env and the rows finished).
    """
    families = list(dict.fromkeys(families))
    if not families:
        raise ValueError("compare_fixtures needs at least one plan family")
    for fam in families:
        if not known_family(fam):
            raise ValueError(f"unknown plan family {fam!r}; families: {', '.join(family_names())}")
    from simfloat._interrupt import call_interruptibly

    env, items = load_fixtures(fix_dir)
    backend = f"{env.get('gpu_slug') or Path(fix_dir).name} (fixtures)"
    rows: list[ValidationRecord] = []
    for cfg, entry, arrays in items:
        if ids is not None and cfg.id not in ids:
            continue
        for fam in families if kind_of(cfg).every_family else families[:1]:
            if max_cost is not None and emulator_cost(cfg) > max_cost:
                row = new_record(cfg, backend, fam, status=f"skipped: emulator cost > {max_cost:g} s")
            else:
                try:
                    row = call_interruptibly(compare_fixture, cfg, entry, arrays, backend, fam)
                except KeyboardInterrupt:
                    raise Interrupted((env, rows), len(rows)) from None
            rows.append(row)
            log(
                f"{row.id} {row.plan}: {row.status} out {cell(row.bitwise_agreement)} out32 "
                f"{cell(row.out32_agreement)} m {cell(row.m_agreement)} l {cell(row.l_agreement)}"
            )
    return env, rows


def check_fixture_dir(path: Path) -> None:
    """Raises ValueError naming what is missing when ``path`` is not a fixture folder (``--fixtures``), and the
    fixture folders inside it if any."""
    missing = [n for n in FIXTURE_FILES if not (path / n).is_file()]
    if not missing:
        return
    if not path.is_dir():
        raise ValueError(f"--fixtures {path}: no such folder")
    inside = fixture_dirs(path)
    hint = f"; fixture folders inside it: {', '.join(map(str, inside))}" if inside else ""
    raise ValueError(f"--fixtures {path}: not a fixture folder (missing {', '.join(missing)}){hint}")
