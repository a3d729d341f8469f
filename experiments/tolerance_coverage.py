"""Does :func:`simfloat.tolerance` hold what it states? Fresh outputs of the plan against its tolerance.

For each plan, mask and number of samples: the tolerance at confidence 0.99 (``samples`` draws, seed 0), then
``--draws`` fresh input draws (seeds 10000 + i: never those of the tolerance) through the emulator under the
same plan, each output compared with the float64 attention of its inputs. The statement is that an output has
an element outside with probability at most 1 - 0.99; the CSV has how many did and the largest
``|out - ref| / (atol + rtol |ref|)`` seen (below 1: every element inside).

Inputs N(0, 1) rounded to the plan's input format, shape (1, 2, 97, 16), tiles 32 x 32.

Writes ``tolerance_coverage.csv`` into ``--out`` (default experiments/results/). ``--smoke``: a tiny run.
``--fixtures``: instead, every flash config of the recorded H200 fixtures (tests/fixtures/gpu/h200, read with
the GPU package's ``load_fixture_dir``) against the tolerance of its ``h200-<fmt>`` and ``triton-<fmt>`` plans
(samples 3, input_std (1.5, 1, 1) as the fixtures' inputs were drawn): ``tolerance_fixtures.csv``.
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
SHAPE = (1, 2, 97, 16)
TILES = dict(block_m=32, block_n=32)
#: (label, preset, output float32, input format)
PLANS = (
    ("triton-bf16, fp32 out", "triton-bf16", True, "bf16"),
    ("triton-bf16", "triton-bf16", False, "bf16"),
    ("h200-fp16, fp32 out", "h200-fp16", True, "fp16"),
    ("triton-fp32", "triton-fp32", False, "fp32"),
)
FIELDS = ("plan", "causal", "samples", "rtol", "atol", "draws", "outside", "largest_ratio", "seconds")


def run(draws: int, samples: Sequence[int], plans: Sequence[tuple[str, str, bool, str]]) -> list[dict]:
    import simfloat
    from simfloat.attention import flash, plan
    from simfloat.tolerances import reference64

    rows = []
    for label, name, f32_out, fmt in plans:
        pl = plan(name).replace(out="float32") if f32_out else plan(name)
        for causal in (False, True):
            for n in samples:
                t0 = time.perf_counter()
                tol = simfloat.tolerance(pl, SHAPE, causal=causal, samples=n, **TILES)
                outside, worst = 0, 0.0
                for i in range(draws):
                    rng = np.random.default_rng(10_000 + i)
                    q, k, v = (simfloat.round(rng.standard_normal(SHAPE).astype(np.float32), fmt) for _ in range(3))
                    ref = reference64(q, k, v, causal=causal)
                    out = flash(q, k, v, plan=pl, causal=causal, **TILES)
                    r = float(np.max(np.abs(out - ref) / (tol.atol + tol.rtol * np.abs(ref))))
                    worst = max(worst, r)
                    outside += r > 1
                row = dict(
                    plan=label,
                    causal=causal,
                    samples=n,
                    rtol=f"{tol.rtol:.3g}",
                    atol=f"{tol.atol:.3g}",
                    draws=draws,
                    outside=outside,
                    largest_ratio=f"{worst:.3f}",
                    seconds=f"{time.perf_counter() - t0:.0f}",
                )
                print(" ".join(f"{k}={v}" for k, v in row.items()), flush=True)
                rows.append(row)
    return rows


def fixtures(root: Path) -> list[dict]:
    import simfloat
    from simfloat.attention import plan
    from simfloat.tolerances import reference64
    from simfloat_gpu.campaign.fixtures import load_fixture_dir
    from simfloat_gpu.campaign.grid import SPREAD, make_inputs

    _, items = load_fixture_dir(root)
    rows = []
    for cfg, _, arrays in items:
        if cfg.kind != "flash":
            continue
        for family in ("h200", "triton"):
            pl = plan(f"{family}-{cfg.fmt}")
            if cfg.out == "fp32":
                pl = pl.replace(out="float32")
            tol = simfloat.tolerance(
                pl,
                cfg.shape,
                cfg.kv_shape,
                causal=cfg.causal,
                block_m=cfg.block_m,
                block_n=cfg.block_n,
                input_std=(SPREAD, 1.0, 1.0),
                samples=3,
            )
            q, k, v = make_inputs(cfg)
            ref = reference64(q, k, v, causal=cfg.causal)
            ratio = float(np.max(np.abs(arrays["out"] - ref) / (tol.atol + tol.rtol * np.abs(ref))))
            rows.append(
                dict(id=cfg.id, plan=pl.name, rtol=f"{tol.rtol:.3g}", atol=f"{tol.atol:.3g}", ratio=f"{ratio:.3f}")
            )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], prog="tolerance_coverage.py")
    ap.add_argument("--smoke", action="store_true", help="tiny run (seconds after compile), for the test suite")
    ap.add_argument("--out", type=Path, default=HERE / "results", help="output folder")
    ap.add_argument("--draws", type=int, default=300, help="fresh draws per case (default 300)")
    ap.add_argument("--fixtures", action="store_true", help="the recorded H200 outputs against their tolerances")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    if args.fixtures:
        fx = fixtures(HERE.parent / "tests" / "fixtures" / "gpu" / "h200")
        args.out.mkdir(parents=True, exist_ok=True)
        with open(args.out / "tolerance_fixtures.csv", "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=("id", "plan", "rtol", "atol", "ratio"))
            w.writeheader()
            w.writerows(fx)
        for fam in ("h200", "triton"):
            mine = [r for r in fx if r["plan"].startswith(fam)]
            n_out = sum(float(r["ratio"]) > 1 for r in mine)
            top = max(float(r["ratio"]) for r in mine) if mine else float("nan")
            print(f"{fam}-<fmt>: {len(mine)} fixture configs, {n_out} outside, largest ratio {top:.3f}")
        print(f"wall time {time.perf_counter() - t0:.0f} s")
        return 0
    if args.smoke:
        rows = run(3, (2,), PLANS[:1])
    else:
        rows = run(args.draws, (2, 8), PLANS)
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "tolerance_coverage.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(rows)
    total = sum(int(r["outside"]) for r in rows)
    n = sum(int(r["draws"]) for r in rows)
    print(f"{total} of {n} fresh outputs had an element outside; wall time {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
