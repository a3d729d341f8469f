"""Does flash attention's numeric deviation change training? Golden et al.'s weight-divergence study (their Figs.
7 and 8) on a CPU, with every attention run through the emulator (``simfloat.torch``), forward and backward.

A small decoder-only transformer (pre-LN, learned positions, causal attention through
``torch.nn.functional.scaled_dot_product_attention`` routed by :func:`simfloat.torch.emulate_sdpa`) is trained
from identical seeds on identical batches in several runs that differ only in the attention numerics:

* ``fp64-attn``: the reference: attention under the ``fp64`` plan (the baseline kernel, float64 throughout: Golden
  et al.'s golden attention), the rest fp32;
* ``baseline-bf16``: q, k, v cast to bf16, torch's eager attention under ``pytorch-bf16``;
* ``flash-bf16``: q, k, v cast to bf16, the Triton flash kernel under ``triton-bf16`` (fp32 state);
* ``flash-bf16-state``: the same kernel with its state (m_i, l_i, alpha, acc) stored in bf16 (``state-bf16``);
* yardsticks: ``other-init`` (the reference with another initialization seed) and ``bf16-model`` (the whole model
  under ``torch.autocast`` bf16: every matmul in bf16, fp32 master weights, attention ``pytorch-bf16``).

The task is synthetic (no text to ship): token sequences over a small vocabulary from a fixed sparse Markov chain
in which random earlier spans recur verbatim (induction copies), so next-token prediction needs both local
statistics and attention that finds the earlier occurrence, sharp attention rows of the kind where the softmax's
rounding matters. Batches are drawn from a generator seeded by (data seed, step): every run sees the same data.

Every ``Size.record`` steps (5 by default), per layer group (``embed``, ``block0``.., ``head``) and per pair
(a run against the reference, and flash against the baseline as in the paper): ``max_abs_dw`` = max
|w_run - w_other| over the group's weights, ``wasserstein`` = scipy.stats.wasserstein_distance between the two
runs' weight values, and both losses. Rows are appended to ``training_divergence.csv`` as they come and a checkpoint
(``training_divergence.ckpt``) is written with them: a killed or interrupted run (Ctrl-C: the step under way is
finished first) resumes from it with ``--resume``. ``training_divergence.png``: max |dw| and W1 per layer over the
steps and the loss curves; ``training_divergence_time.csv``: the time per step and where it goes.

    python experiments/training_divergence.py [--smoke] [--steps N] [--resume] [--out DIR]
"""

from __future__ import annotations

import argparse
import csv
import os
import signal
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

SEED = 0
DATA_SEED = 1234
OTHER_INIT_SEED = 1


@dataclass(frozen=True)
class Size:
    """Model, data and schedule of one study."""

    layers: int
    d_model: int
    heads: int
    seq: int
    batch: int
    vocab: int
    steps: int
    record: int
    lr: float
    block: int


DEFAULT = Size(layers=2, d_model=64, heads=4, seq=256, batch=2, vocab=32, steps=50, record=5, lr=3e-3, block=64)
SMOKE = Size(layers=2, d_model=16, heads=2, seq=24, batch=2, vocab=8, steps=4, record=2, lr=3e-3, block=8)


@dataclass(frozen=True)
class Run:
    """One training run: its attention numerics, initialization seed, and whether the model runs in bf16."""

    name: str
    plan: str
    kernel: str
    attn_dtype: str  # q, k, v cast to this dtype before the attention ("float32": as they are)
    init_seed: int = SEED
    autocast: bool = False


RUNS = (
    Run("fp64-attn", "fp64", "baseline", "float32"),
    Run("baseline-bf16", "pytorch-bf16", "baseline", "bfloat16"),
    Run("flash-bf16", "triton-bf16", "flash", "bfloat16"),
    Run("flash-bf16-state", "state-bf16", "flash", "bfloat16"),
    Run("other-init", "fp64", "baseline", "float32", init_seed=OTHER_INIT_SEED),
    Run("bf16-model", "pytorch-bf16", "baseline", "bfloat16", autocast=True),
)
REFERENCE = "fp64-attn"
#: (run, against): every run against the reference, and the paper's flash-vs-baseline pair
PAIRS = tuple((r.name, REFERENCE) for r in RUNS if r.name != REFERENCE) + (("flash-bf16", "baseline-bf16"),)


def plans(name: str):  # type: ignore[no-untyped-def]
    """(forward plan, backward plan) of a run's plan name; ``state-bf16``: triton-bf16 with the state in bf16."""
    from simfloat.accumulate import Chunked
    from simfloat.attention import plan

    if name == "state-bf16":
        tri = plan("triton-bf16")
        f = tri.p.fmt
        pv = Chunked(1 << 40, tri.pv, outer_fmt=f)  # each tile's P.V (fp32 in the MMA) stored into a bf16 acc
        return tri.replace(name="state-bf16", m_i=f, l_i=f, alpha=f, acc=f, pv=pv), "triton-bf16"
    if name == "triton-bf16-o32":  # delta from fp32 O: the forward stores O in fp32 for the backward
        return plan("triton-bf16").replace(name="triton-bf16-o32", out="float32"), "triton-bf16"
    return plan(name), name


# -- data ------------------------------------------------------------------------------------------------------


def markov_table(vocab: int, seed: int = DATA_SEED) -> np.ndarray:
    """(vocab, vocab) transition probabilities: each token has a few likely successors."""
    g = np.random.default_rng([seed, 0])
    logits = g.standard_normal((vocab, vocab)) * 2.5
    p = np.exp(logits - logits.max(1, keepdims=True))
    return p / p.sum(1, keepdims=True)


def batch(step: int, size: Size, table: np.ndarray, seed: int = DATA_SEED) -> np.ndarray:
    """(batch, seq + 1) int64 tokens of a step: Markov text with earlier spans copied verbatim."""
    g = np.random.default_rng([seed, 1, step])
    n = size.seq + 1
    out = np.empty((size.batch, n), dtype=np.int64)
    cum = np.cumsum(table, axis=1)
    for b in range(size.batch):
        x = out[b]
        x[0] = g.integers(size.vocab)
        i = 1
        while i < n:
            if i >= 16 and g.random() < 0.08:  # an induction copy of an earlier span
                length = int(g.integers(4, 17))
                src = int(g.integers(0, i - length + 1)) if i - length > 0 else 0
                for j in range(length):
                    if i >= n:
                        break
                    x[i] = x[src + j]
                    i += 1
            else:
                x[i] = min(int(np.searchsorted(cum[x[i - 1]], g.random())), size.vocab - 1)
                i += 1
    return out


# -- model -----------------------------------------------------------------------------------------------------


def build_model(size: Size, seed: int, *, positions: bool = True):  # type: ignore[no-untyped-def]
    """The decoder-only transformer (torch.nn.Module), initialized from ``seed``."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(size.d_model), nn.LayerNorm(size.d_model)
            self.qkv = nn.Linear(size.d_model, 3 * size.d_model)
            self.proj = nn.Linear(size.d_model, size.d_model)
            self.fc1, self.fc2 = nn.Linear(size.d_model, 4 * size.d_model), nn.Linear(4 * size.d_model, size.d_model)
            self.attn_dtype = torch.float32

        def forward(self, x):  # type: ignore[no-untyped-def]
            bsz, seq, dm = x.shape
            h = size.heads
            qkv = self.qkv(self.ln1(x)).view(bsz, seq, 3, h, dm // h).permute(2, 0, 3, 1, 4)
            q, k, v = (t.to(self.attn_dtype) for t in qkv)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            a = a.to(x.dtype).transpose(1, 2).reshape(bsz, seq, dm)
            x = x + self.proj(a)
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(size.vocab, size.d_model)
            self.pos = nn.Parameter(0.02 * torch.randn(size.seq, size.d_model)) if positions else None
            self.blocks = nn.ModuleList(Block() for _ in range(size.layers))
            self.ln = nn.LayerNorm(size.d_model)
            self.head = nn.Linear(size.d_model, size.vocab)

        def forward(self, tokens):  # type: ignore[no-untyped-def]
            x = self.embed(tokens)
            if self.pos is not None:
                x = x + self.pos[: tokens.shape[1]]
            for blk in self.blocks:
                x = blk(x)
            return self.head(self.ln(x))

    torch.manual_seed(seed)
    return Model()


def layer_groups(model) -> dict[str, list]:  # type: ignore[no-untyped-def]
    """Parameters by layer: ``embed`` (token + position embeddings), ``block<i>``, ``head`` (final norm + head)."""
    groups: dict[str, list] = {}
    for name, p in model.named_parameters():
        if name.startswith("blocks."):
            g = "block" + name.split(".")[1]
        elif name.startswith(("embed", "pos")):
            g = "embed"
        else:
            g = "head"
        groups.setdefault(g, []).append(p)
    return groups


def divergence(a, b) -> list[tuple[str, float, float]]:  # type: ignore[no-untyped-def]
    """Per layer group of two models: (group, max |w_a - w_b|, Wasserstein-1 distance of the weight values)."""
    import torch
    from scipy.stats import wasserstein_distance

    out = []
    ga, gb = layer_groups(a), layer_groups(b)
    for g in ga:
        wa = torch.cat([p.detach().reshape(-1) for p in ga[g]]).double().numpy()
        wb = torch.cat([p.detach().reshape(-1) for p in gb[g]]).double().numpy()
        out.append((g, float(np.max(np.abs(wa - wb))), float(wasserstein_distance(wa, wb))))
    return out


# -- training --------------------------------------------------------------------------------------------------


class Trainer:
    """The runs in lockstep: every run takes step s before any takes s + 1."""

    def __init__(self, size: Size, runs: tuple[Run, ...], *, positions: bool = True, data=None) -> None:  # type: ignore[no-untyped-def]
        import torch

        self.size, self.runs = size, runs
        self.data = batch if data is None else data
        self.models = {r.name: build_model(size, r.init_seed, positions=positions) for r in runs}
        self.opts = {n: torch.optim.Adam(m.parameters(), lr=size.lr) for n, m in self.models.items()}
        self.table = markov_table(size.vocab)
        self.step = 0
        self.time = {"forward_emulation": 0.0, "backward_emulation": 0.0, "rest": 0.0}

    def state(self) -> dict:
        return {
            "step": self.step,
            "size": asdict(self.size),
            "models": {n: m.state_dict() for n, m in self.models.items()},
            "opts": {n: o.state_dict() for n, o in self.opts.items()},
            "time": dict(self.time),
        }

    def load(self, st: dict) -> None:
        mine, theirs = asdict(self.size), dict(st["size"])
        mine.pop("steps"), theirs.pop("steps")  # a run may be resumed to more steps
        if theirs != mine:
            raise ValueError(f"checkpoint is of another size {st['size']}, not {asdict(self.size)}")
        for n in self.models:
            self.models[n].load_state_dict(st["models"][n])
            self.opts[n].load_state_dict(st["opts"][n])
        self.step, self.time = int(st["step"]), dict(st["time"])

    def train_step(self) -> dict[str, float]:
        """One step of every run on the same batch; returns each run's loss (before the update)."""
        import torch
        from torch.nn import functional as F

        import simfloat.torch as st

        tokens = torch.from_numpy(self.data(self.step, self.size, self.table))
        x, y = tokens[:, :-1], tokens[:, 1:]
        losses = {}
        for r in self.runs:
            model, opt = self.models[r.name], self.opts[r.name]
            fwd, bwd = plans(r.plan)
            for blk in model.blocks:
                blk.attn_dtype = getattr(torch, r.attn_dtype)
            t0 = time.perf_counter()
            st.timings(reset=True)
            with st.emulate_sdpa(plan=fwd, backward_plan=bwd, kernel=r.kernel, block_m=self.size.block,
                                 block_n=self.size.block):  # fmt: skip
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=r.autocast):
                    logits = model(x)
                    loss = F.cross_entropy(logits.float().reshape(-1, self.size.vocab), y.reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            tm = st.timings()
            total = time.perf_counter() - t0
            self.time["forward_emulation"] += tm["forward_s"]
            self.time["backward_emulation"] += tm["backward_s"]
            self.time["rest"] += total - tm["forward_s"] - tm["backward_s"]
            losses[r.name] = float(loss.detach())
        self.step += 1
        return losses


FIELDS = ("step", "run", "against", "group", "max_abs_dw", "wasserstein", "loss", "loss_against")


def records(tr: Trainer, losses: dict[str, float], pairs: tuple[tuple[str, str], ...] = PAIRS) -> list[dict]:
    """The rows of the current step: per pair and layer group, the divergence and both losses."""
    rows = []
    names = set(tr.models)
    for a, b in pairs:
        if a not in names or b not in names:
            continue
        for g, mx, w1 in divergence(tr.models[a], tr.models[b]):
            rows.append(dict(zip(FIELDS, (tr.step, a, b, g, mx, w1, losses[a], losses[b]), strict=True)))
    return rows


def _truncate_csv(path: Path, step: int) -> None:
    """Keep the rows of steps <= step (those a checkpoint covers)."""
    if not path.exists():
        return
    with path.open() as f:
        rows = [r for r in csv.DictReader(f) if int(r["step"]) <= step]
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(rows)


def _save(obj: dict, path: Path) -> None:
    import torch

    tmp = path.with_suffix(".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def train(
    size: Size,
    out: Path,
    *,
    stem: str = "training_divergence",
    runs: tuple[Run, ...] = RUNS,
    pairs: tuple[tuple[str, str], ...] = PAIRS,
    positions: bool = True,
    data=None,  # type: ignore[no-untyped-def]
    resume: bool = False,
    progress: bool = True,
) -> tuple[Path, bool]:
    """Train the runs in lockstep, appending the records as they come.

    Args:
        size: the study's size. out: results folder. stem: file names. runs, pairs: what is trained and compared.
        positions: learned position embeddings (False: NoPE, identical tokens give identical keys).
        data: ``f(step, size, table) -> (batch, seq + 1)`` tokens (default :func:`batch`).
        resume: continue from ``<stem>.ckpt``. progress: show the progress bar.

    Returns:
        (CSV path, whether every step ran).
    """
    import torch

    torch.set_num_threads(1)  # the emulator takes the cores; torch's part is small and then deterministic
    out.mkdir(parents=True, exist_ok=True)
    path, ckpt = out / f"{stem}.csv", out / f"{stem}.ckpt"
    tr = Trainer(size, runs, positions=positions, data=data)
    if resume and ckpt.exists():
        tr.load(torch.load(ckpt, weights_only=False))
        _truncate_csv(path, tr.step)
    else:
        with path.open("w", newline="") as f:
            csv.DictWriter(f, fieldnames=FIELDS).writeheader()
    stop = {"flag": False}

    def on_sigint(signum, frame):  # type: ignore[no-untyped-def]
        if stop["flag"]:
            raise KeyboardInterrupt
        stop["flag"] = True
        print("\ninterrupted: finishing the step under way, then saving (Ctrl-C again to abort)", flush=True)

    old = signal.signal(signal.SIGINT, on_sigint) if _main_thread() else None
    bar = _bar(size.steps, tr.step, progress)
    try:
        while tr.step < size.steps and not stop["flag"]:
            t0 = time.perf_counter()
            losses = tr.train_step()
            bar.update(1)
            bar.set_postfix(step_s=f"{time.perf_counter() - t0:.1f}", loss=f"{losses[runs[0].name]:.3f}")
            if tr.step % size.record == 0 or tr.step == size.steps:
                with path.open("a", newline="") as f:
                    csv.DictWriter(f, fieldnames=FIELDS).writerows(records(tr, losses, pairs))
                _save(tr.state(), ckpt)
    finally:
        bar.close()
        if old is not None:
            signal.signal(signal.SIGINT, old)
    with (out / f"{stem}_time.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["steps", "runs", "part", "seconds", "seconds_per_step_per_run"])
        n = max(tr.step, 1) * len(runs)
        for part, s in tr.time.items():
            w.writerow([tr.step, len(runs), part, f"{s:.3f}", f"{s / n:.4f}"])
    return path, tr.step >= size.steps


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def _bar(total: int, done: int, enabled: bool):  # type: ignore[no-untyped-def]
    from tqdm import tqdm

    return tqdm(total=total, initial=done, disable=not enabled, desc="steps", unit="step")


# -- figures ---------------------------------------------------------------------------------------------------

COLORS = {
    "baseline-bf16": "tab:orange",
    "flash-bf16": "tab:blue",
    "flash-bf16-state": "tab:green",
    "other-init": "tab:gray",
    "bf16-model": "tab:red",
    "flash-o32": "tab:purple",
}


def plot(path: Path, png: Path, title: str, reference: str = REFERENCE) -> None:
    """Figs. 7/8-like: max |dw| and W1 per layer group over the steps (log scale), and the losses."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    df = pd.read_csv(path)
    groups = list(dict.fromkeys(df["group"]))
    fig, axes = plt.subplots(3, len(groups), figsize=(3.6 * len(groups), 8.5), squeeze=False)
    for j, g in enumerate(groups):
        for i, (col, label) in enumerate((("max_abs_dw", "max |dw|"), ("wasserstein", "Wasserstein"))):
            ax = axes[i, j]
            for (a, b), d in df[df["group"] == g].groupby(["run", "against"], sort=False):
                d = d[d[col] > 0]
                if len(d):
                    style = "--" if b != reference else "-"
                    ax.plot(d["step"], d[col], style, color=COLORS.get(a, None), label=f"{a} vs {b}")
            ax.set_yscale("log")
            ax.set_title(f"{g}: {label}", fontsize=9)
            ax.set_xlabel("step")
    ax = axes[2, 0]
    first = df[df["group"] == groups[0]]
    ref = first[first["against"] == reference].drop_duplicates("step")
    ax.plot(ref["step"], ref["loss_against"], color="black", label=reference)
    for a, d in first[first["against"] == reference].groupby("run", sort=False):
        ax.plot(d["step"], d["loss"], color=COLORS.get(a, None), label=a, alpha=0.8)
    ax.set_title("loss (training batch)", fontsize=9)
    ax.set_xlabel("step")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    axes[2, 1 if len(groups) > 1 else 0].legend(handles, labels, fontsize=7, loc="center")
    for j in range(1, len(groups)):
        axes[2, j].axis("off")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def summary(path: Path) -> list[str]:
    """Per layer group at the last recorded step: each pair's max |dw| and W1, and the ratios
    low-precision-training / flash (the paper's "flash drifts 2-5x less")."""
    import pandas as pd

    df = pd.read_csv(path)
    last = df[df["step"] == df["step"].max()]
    lines = [f"step {int(last['step'].iloc[0])}"]
    piv = last.pivot_table(index=["run", "against"], columns="group", values=["max_abs_dw", "wasserstein"])
    lines.append(piv.to_string(float_format=lambda x: f"{x:.3g}"))
    key = ("bf16-model", REFERENCE)
    for flash_pair in (("flash-bf16", REFERENCE), ("flash-bf16", "baseline-bf16"), ("flash-bf16-state", REFERENCE)):
        if key in piv.index and flash_pair in piv.index:
            for col in ("max_abs_dw", "wasserstein"):
                ratio = piv.loc[key, col] / piv.loc[flash_pair, col]
                vals = ", ".join(f"{g} {v:.2f}" for g, v in ratio.items())
                lines.append(f"{col}: (bf16-model vs {REFERENCE}) / ({flash_pair[0]} vs {flash_pair[1]}): {vals}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="a tiny run (seconds)")
    ap.add_argument("--steps", type=int, help="training steps (default: the size's)")
    ap.add_argument("--batch", type=int, help="sequences per batch")
    ap.add_argument("--seq", type=int, help="sequence length")
    ap.add_argument("--resume", action="store_true", help="continue from the checkpoint in --out")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--out", type=Path, default=HERE / "results")
    a = ap.parse_args(argv)
    size = SMOKE if a.smoke else DEFAULT
    for field in ("steps", "batch", "seq"):
        value = getattr(a, field)
        if value is not None:
            if value < 1:
                ap.error(f"--{field} must be >= 1, got {value}")
            size = replace(size, **{field: value})
    t0 = time.perf_counter()
    path, done = train(size, a.out, resume=a.resume, progress=not a.no_progress)
    plot(path, a.out / "training_divergence.png", _title(size))
    for line in summary(path):
        print(line)
    print(f"{'finished' if done else 'stopped early'}; wall time {time.perf_counter() - t0:.1f} s; {path.name}")
    return 0 if done else 130


def _title(size: Size) -> str:
    return (
        f"weight divergence vs {REFERENCE}: {size.layers} layers, d_model {size.d_model}, {size.heads} heads, "
        f"seq {size.seq}, batch {size.batch}, lr {size.lr}"
    )


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["DEFAULT", "PAIRS", "RUNS", "SMOKE", "Run", "Size", "batch", "build_model", "main", "plans", "train"]
