"""Stress run in the spirit of arXiv 2510.04212 ("Why Low-Precision Transformer Training Fails"): a model state
with tied row maxima, trained with low-precision flash attention; are there loss spikes, and does computing delta
from an fp32 O remove them?

The model of ``training_divergence.py`` without position embeddings (NoPE: with a causal mask it still knows
order), trained on data in which one "sink" token fills about a third of every sequence (the rest: the Markov
chain of that study). In the first layer identical tokens have bitwise identical keys, so every query's scores
against the sink's occurrences are exactly equal; where the sink holds a row's maximum, that maximum is tied
many times over and P is exactly 1 at each tie, the condition under which the paper finds BF16's rounding of O
biased and the bias fed into every gradient through delta = rowsum(dO * O). The learning rate is raised to
bring training nearer to instability. Runs, from one initialization and one data order:

* ``fp64-attn``: the reference (fp64 plan);
* ``flash-bf16``: ``triton-bf16`` forward and backward (O stored in bf16, delta from it);
* ``flash-o32``: the same forward with O stored in fp32 for the backward ("delta from fp32 O", the remedy the
  emulator's plans offer; the paper's max-shift of the softmax is not a plan option and is not run).

Records as ``training_divergence.py`` (``training_tied_maxima.csv``, checkpoint, ``--resume``) plus, per
recorded step, the fraction of first-layer attention rows whose maximum score is tied (``ties.csv``), and the
loss spikes (a recorded loss above 1.5x the run's lowest loss so far). ``training_tied_maxima.png``: losses,
max |dw| and W1 per layer.

    python experiments/training_tied_maxima.py [--smoke] [--steps N] [--resume] [--out DIR]
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))


def _study():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("training_divergence", HERE / "training_divergence.py")
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules.setdefault("training_divergence", mod)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


td = _study()
SINK = 0
SINK_RATE = 0.35
DEFAULT = replace(td.DEFAULT, lr=1e-2, steps=50)
SMOKE = td.SMOKE
RUNS = (
    td.Run("fp64-attn", "fp64", "baseline", "float32"),
    td.Run("flash-bf16", "triton-bf16", "flash", "bfloat16"),
    td.Run("flash-o32", "triton-bf16-o32", "flash", "bfloat16"),
)
PAIRS = (("flash-bf16", "fp64-attn"), ("flash-o32", "fp64-attn"))


def sink_batch(step: int, size, table: np.ndarray) -> np.ndarray:  # type: ignore[no-untyped-def]
    """(batch, seq + 1) tokens: the Markov chain with the sink token at about SINK_RATE of the positions."""
    g = np.random.default_rng([td.DATA_SEED, 2, step])
    out = np.empty((size.batch, size.seq + 1), dtype=np.int64)
    cum = np.cumsum(table, axis=1)
    for b in range(size.batch):
        prev = int(g.integers(1, size.vocab))
        for i in range(size.seq + 1):
            if g.random() < SINK_RATE:
                out[b, i] = SINK
            else:
                prev = min(int(np.searchsorted(cum[prev], g.random())), size.vocab - 1)
                out[b, i] = prev
    return out


def tied_fraction(model, tokens, heads: int) -> float:  # type: ignore[no-untyped-def]
    """Fraction of the first layer's (batch, head, query) rows whose causal maximum score occurs twice or more
    (scores of the fp32 q, k, compared exactly)."""
    import torch

    blk = model.blocks[0]
    with torch.no_grad():
        x = model.embed(tokens)
        bsz, seq, dm = x.shape
        h = heads
        qkv = blk.qkv(blk.ln1(x)).view(bsz, seq, 3, h, dm // h).permute(2, 0, 3, 1, 4)
        s = qkv[0] @ qkv[1].transpose(-1, -2)
        mask = torch.ones(seq, seq, dtype=torch.bool).tril()
        s = s.masked_fill(~mask, float("-inf"))
        ties = (s == s.amax(-1, keepdim=True)).sum(-1)
    return float((ties[..., 1:] >= 2).float().mean())  # row 0 sees one key


def spikes(path: Path, factor: float = 1.5) -> list[tuple[str, int, float, float]]:
    """(run, step, loss, lowest loss before) of each recorded loss above ``factor`` x the run's lowest so far."""
    import pandas as pd

    df = pd.read_csv(path)
    first = df[df["group"] == df["group"].iloc[0]]
    out = []
    series = {"fp64-attn": first.drop_duplicates("step")[["step", "loss_against"]].to_numpy()}
    for run, d in first.groupby("run", sort=False):
        series[run] = d[["step", "loss"]].to_numpy()
    for run, arr in series.items():
        low = np.inf
        for step, loss in arr:
            if loss > factor * low:
                out.append((run, int(step), float(loss), float(low)))
            low = min(low, loss)
    return out


def main(argv: list[str] | None = None) -> int:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="a tiny run (seconds)")
    ap.add_argument("--steps", type=int, help="training steps")
    ap.add_argument("--resume", action="store_true", help="continue from the checkpoint in --out")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--out", type=Path, default=HERE / "results")
    a = ap.parse_args(argv)
    size = SMOKE if a.smoke else DEFAULT
    if a.steps is not None:
        if a.steps < 1:
            ap.error(f"--steps must be >= 1, got {a.steps}")
        size = replace(size, steps=a.steps)
    t0 = time.perf_counter()
    stem = "training_tied_maxima"
    path, done = td.train(
        size, a.out, stem=stem, runs=RUNS, pairs=PAIRS, positions=False, data=sink_batch, resume=a.resume,
        progress=not a.no_progress,
    )  # fmt: skip
    # the tie diagnostic on the trained reference model (fresh model state at step 0 for comparison)
    table = td.markov_table(size.vocab)
    tokens = torch.from_numpy(sink_batch(0, size, table))[:, :-1]
    ckpt = torch.load(a.out / f"{stem}.ckpt", weights_only=False)
    rows = []
    for run in RUNS:
        m = td.build_model(size, run.init_seed, positions=False)
        rows.append((run.name, 0, tied_fraction(m, tokens, size.heads)))
        m.load_state_dict(ckpt["models"][run.name])
        rows.append((run.name, int(ckpt["step"]), tied_fraction(m, tokens, size.heads)))
    with (a.out / f"{stem}_ties.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["run", "step", "tied_row_max_fraction_layer0"])
        w.writerows(rows)
    td.plot(path, a.out / f"{stem}.png", "tied maxima (NoPE, sink token): " + td._title(size), reference="fp64-attn")
    for r in rows:
        print(f"{r[0]} step {r[1]}: fraction of layer-0 rows with a tied maximum {r[2]:.3f}")
    found = spikes(path)
    print(f"loss spikes (> 1.5x the lowest recorded loss so far): {found if found else 'none'}")
    for line in td.summary(path):
        print(line)
    print(f"{'finished' if done else 'stopped early'}; wall time {time.perf_counter() - t0:.1f} s; {path.name}")
    return 0 if done else 130


if __name__ == "__main__":
    raise SystemExit(main())
