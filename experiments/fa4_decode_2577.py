"""FlashAttention-4's FP8 decode around kv length 128 (flash-attention #2577).

The report (B300): FP8 e4m3 decode, 6 query heads on 1 KV head, head dim 128, page 128, rescale threshold 4 and
max offset 8: cosine similarity to the bf16 reference 0.9987 at kv length 127, 0.863 at 128, about 0.95 at
129-130; recovered with threshold 0 (PR #2578, the preset ``fa4-e4m3``). The mechanism: a lazily kept running max
lets ``P = 2**(x + 8)`` reach up to ``2**12`` and saturate at 448 in e4m3 while the fp32 row sum counts the
unclamped value.

Here: ``fa4-e4m3`` (always rescales) and the same with ``lazy_threshold=4``, decode of one query row per query
head over a paged cache (page 128 = the key tile, walked last first as the kernel), e4m3 inputs (N(0, 1) rounded;
one key draw, every length a prefix of it), at every kv length ``--base + r`` for ``r`` in ``0 .. --span - 1``;
the cosine similarity of each output row to the float64 attention of the same values (the worst of the 6 rows).
A partial key tile walked first holds few keys; the full tile after it usually has a larger maximum, which the
lazy rule keeps out of the running max when it grew by less than 4 (log2 units): there P saturates.

Writes ``fa4_decode_2577.csv`` and ``fa4_decode_2577.png`` into ``--out`` (default experiments/results/).

    python experiments/fa4_decode_2577.py [--base 120] [--span 16] [--seeds 4] [--out DIR]
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from simfloat.attention import plan  # noqa: E402
from simfloat.attribution.residues import tile_sweep  # noqa: E402


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", type=int, default=120)
    ap.add_argument("--span", type=int, default=16)
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--out", type=Path, default=HERE / "results")
    return ap.parse_args()


def main() -> None:
    a = _args()
    a.out.mkdir(parents=True, exist_ok=True)
    base = plan("fa4-e4m3")
    variants = {"threshold 4 (the report)": base.replace(lazy_threshold=4.0), "threshold 0 (fa4-e4m3)": base}
    rows = []
    for seed in range(a.seeds):
        for name, pl in variants.items():
            res = tile_sweep(
                pl,
                block_n=128,
                base=a.base,
                residues=list(range(a.span)),
                heads=6,
                kv_heads=1,
                head_dim=128,
                page_size=128,
                seed=seed,
            )
            for r in res:
                cos = float(min(r["cos_sim"])) if hasattr(r["cos_sim"], "__len__") else float(r["cos_sim"])
                rows.append({"seed": seed, "variant": name, "kv_len": r["kv_len"], "min_cos_sim": cos})
                print(f"seed {seed} {name:26s} kv {r['kv_len']:4d} min cos {cos:.5f}", flush=True)
    with open(a.out / "fa4_decode_2577.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for name in variants:
        lens = sorted({r["kv_len"] for r in rows})
        worst = [min(r["min_cos_sim"] for r in rows if r["variant"] == name and r["kv_len"] == n) for n in lens]
        ax.plot(lens, worst, marker="o", label=f"{name}, worst of {a.seeds} seeds")
    ax.scatter([127, 128, 129, 130], [0.9987, 0.863, 0.95, 0.95], marker="x", c="k", label="#2577 (B300, threshold 4)")
    ax.set_xlabel("kv length")
    ax.set_ylabel("cosine similarity (worst row)")
    ax.set_title("fa4-e4m3 decode, 6 q heads on 1 kv head, d 128, page 128")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(a.out / "fa4_decode_2577.png", dpi=120)


if __name__ == "__main__":
    main()
