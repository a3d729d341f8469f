"""How often ``pytorch-<fmt>`` baselines give torch's eager attention bit for bit.

torch's eager ``softmax((q @ k^T) * scale, dim=-1) @ v`` on CPU bf16 / fp16 tensors against
:func:`simfloat.attention.baseline` under ``pytorch-<fmt>``, with ``Plan.opmath`` (the scale and its product in
float32, then the cast, as torch's ``tensor * float`` computes) and without it (the scale rounded into the
format). Head dims 64 (scale 1/8, exact in every format), 96 and 128; four (seq_q, seq_k) shapes each; two lead
entries; inputs N(0, 1) rounded to the format, seeded per shape.

Writes ``pytorch_eager_agreement.csv`` (format, head dim, seq_q, seq_k, share of outputs equal with and without
opmath) into ``--out`` (default experiments/results/) and prints each format's and head dim's range.
``--smoke``: one shape per head dim.
"""

from __future__ import annotations

import argparse
import csv
import math
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
SHAPES = ((64, 96), (97, 33), (128, 128), (33, 257))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=HERE / "results")
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args(argv)
    import torch

    import simfloat as sf
    from simfloat.attention import baseline, plan

    rows = []
    for fmt, dt in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        p = plan(f"pytorch-{fmt}")
        for d in (64, 96, 128):
            for sq, sk in SHAPES[:1] if args.smoke else SHAPES:
                g = np.random.default_rng(d + sq)
                q, k, v = (sf.round(g.standard_normal((2, sq if i == 0 else sk, d)), fmt) for i in range(3))
                tq, tk, tv = (torch.from_numpy(x).to(dt) for x in (q, k, v))
                t = (torch.softmax((tq @ tk.transpose(-1, -2)) * (1 / math.sqrt(d)), dim=-1) @ tv).double().numpy()
                new = float(np.mean(baseline(q, k, v, plan=p) == t))
                old = float(np.mean(baseline(q, k, v, plan=p.replace(opmath=None)) == t))
                rows.append((fmt, d, sq, sk, new, old))
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "pytorch_eager_agreement.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["format", "head_dim", "seq_q", "seq_k", "equal_opmath", "equal_scale_in_format"])
        w.writerows(rows)
    for fmt in ("bf16", "fp16"):
        for d in (64, 96, 128):
            a = [r for r in rows if r[0] == fmt and r[1] == d]
            print(
                f"{fmt} d={d}: opmath {min(r[4] for r in a):.4f}-{max(r[4] for r in a):.4f}, "
                f"scale in {fmt} {min(r[5] for r in a):.4f}-{max(r[5] for r in a):.4f}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
