"""Command line of the fits: ``simfloat-gpu fit`` (CPU side, after ``simfloat-gpu run``).

    simfloat-gpu fit OUT/probes.npz OUT/exp2.npz [OUT/exp2_binades.npz] [OUT/isa.tar.xz] [--save-ex2 ex2.npz]
        [--report R] [--profile OUT.json [--name NAME]]
    python -m simfloat_gpu.campaign.fit_cli ...                (the same)

Each input is fitted by :mod:`simfloat_gpu.campaign.fit` (inputs are recognised by their keys: probes.npz, the
exp2 segments, isa.tar.xz; see there). With ``--profile``, every part is fitted into a hardware profile
(:mod:`simfloat_gpu.campaign.fit_profile`, :mod:`simfloat.profiles`) written to OUT.json, with its exp2 table
next to it, and the report gives, per part and probe, the count of bit-exact outputs.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tarfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from simfloat_gpu.campaign.arguments import names_of, positive_int
from simfloat_gpu.campaign.fit import fit_dot, fit_exp, fit_sum, probe_variants

__all__ = ["main"]


# ----------------------------------------------------------------------------------------------------
# command line
# ----------------------------------------------------------------------------------------------------


_FITS = ("dot", "sum", "exp")


def _fits(text: str) -> set[str]:
    """argparse type of --only: comma-separated names of :data:`_FITS`."""
    return names_of(text, _FITS, "fit")


def main(argv: Sequence[str] | None = None, prog: str = "simfloat-gpu fit") -> int:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    p.add_argument(
        "inputs", nargs="+", type=Path, help="probes.npz, exp2*.npz, isa.tar.xz (of simfloat_gpu.campaign.gpu_run)"
    )
    p.add_argument("--save-ex2", type=Path, help="write the fitted ex2 model (npz) here")
    p.add_argument("--report", type=Path, help="write the results as JSON here")
    p.add_argument(
        "--profile",
        type=Path,
        metavar="OUT.json",
        help="write a hardware profile (simfloat.profiles) fitted from the inputs here, its exp2 table next to it",
    )
    p.add_argument("--name", help="the profile's name (default: the GPU's slug recorded by the run)")
    p.add_argument("--coarse-rows", type=positive_int, default=768, help="rows of the coarse dot-model search")
    p.add_argument(
        "--only",
        type=_fits,
        default=set(),
        metavar="FIT[,FIT...]",
        help=f"comma-separated: {','.join(_FITS)} (default all)",
    )
    args = p.parse_args(argv)
    only = args.only or set(_FITS)
    for path in args.inputs:
        if not path.is_file():
            p.error(f"{path}: no such file")
    if args.profile is not None:
        return _write_profile(args, p)
    report: dict[str, Any] = {}
    exp_files = []
    for path in args.inputs:
        if path.suffixes[-2:] == [".tar", ".xz"]:
            with tarfile.open(path) as t:
                member = next((m for m in t.getmembers() if m.name.endswith("isa.json")), None)
                if member is None:
                    p.error(f"{path}: no isa.json inside (not an isa.tar.xz of simfloat_gpu.campaign.gpu_run)")
                facts = json.load(io.TextIOWrapper(t.extractfile(member)))  # type: ignore[arg-type]
                report["isa"] = {k: v.get("summary", v.get("error")) for k, v in facts["kernels"].items()}
                print("isa:", json.dumps(report["isa"], indent=1))
            continue
        z = np.load(path)
        dots, sums = (any(f.startswith(f"{kind}_") for f in z.files) for kind in ("dot", "sum"))
        exp = "segments" in z.files or any(f.endswith("_off") for f in z.files)
        if not (dots or sums or exp):
            p.error(f"{path}: neither probes (dot_*, sum_*) nor exp2 segments: not an output of `simfloat-gpu run`")
        if dots and "dot" in only:
            report["dot"] = [
                fit_dot(name, v, coarse_rows=args.coarse_rows) for name, v in probe_variants(z, "dot").items()
            ]
        if sums and "sum" in only:
            report["sum"] = [fit_sum(name, v) for name, v in probe_variants(z, "sum").items()]
        if exp:
            exp_files.append(z)
    if exp_files and "exp" in only:
        report["exp"] = fit_exp(exp_files, save=args.save_ex2)
    if args.report:
        args.report.write_text(json.dumps(report, indent=1, default=str) + "\n")
    return 0


def _write_profile(args: argparse.Namespace, p: argparse.ArgumentParser) -> int:
    from simfloat.profiles import save_profile
    from simfloat_gpu.campaign.fit_profile import fit_profile

    if args.only:
        p.error("--profile fits every part; it does not take --only")
    if args.name is not None and (not args.name or "-" in args.name):
        p.error(f"--name must be a non-empty name without '-', got {args.name!r}")
    try:
        profile, table, rows = fit_profile(args.inputs, name=args.name)
    except ValueError as exc:
        p.error(str(exc))
    args.profile.parent.mkdir(parents=True, exist_ok=True)
    save_profile(profile, args.profile, table=table)
    print(profile.report())
    inexact = [label for label, ok in profile.exact().items() if not ok]
    exact = f" (not bit-exact: {', '.join(inexact)})" if inexact else " (every part bit-exact)"
    print(f"wrote {args.profile}{exact}")
    if args.report:
        args.report.write_text(json.dumps({"profile": profile.to_json(), "probes": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
