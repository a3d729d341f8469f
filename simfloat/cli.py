"""Command line: ``simfloat demo | attribute | explain | sweep | report``. Each subcommand lives in its own module
and is imported only when run, so ``simfloat --help`` stays fast (``sweep`` and ``report`` declare their options
in :mod:`simfloat.sweep.cli`, which imports the standard library and :mod:`simfloat._args` only; the argument
types live there, re-exported here for ``simfloat-gpu``)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from simfloat._args import int_at_least, positive_int, writable_dir
from simfloat._interrupt import run_command

if TYPE_CHECKING:
    import numpy as np

__all__ = ["main", "positive_int", "writable_dir"]

_positive = positive_int


def _demo(args: argparse.Namespace) -> int:
    from simfloat.demo import run_demo

    print(run_demo(args.value, args.k, args.seed))
    return 0


def _tile_sweep(args: argparse.Namespace) -> int:
    """``simfloat attribute --tile-sweep``: the error per key-length residue modulo the key tile."""
    from simfloat.attribution.residues import format_tile_sweep, tile_sweep

    plan = args.plan[0] if args.plan else f"triton-{args.format or 'bf16'}"
    heads = int(args.heads[0]) if args.heads else 1
    try:
        rows = tile_sweep(
            plan,
            block_n=args.block_n or 64,
            base=args.seq_k or 128,
            residues=args.residues,
            seq_q=args.seq or 1,
            heads=heads,
            kv_heads=args.kv_heads,
            head_dim=args.head_dim or 64,
            page_size=args.page_size,
            num_splits=args.num_splits,
            combine=args.combine,
            fmt=args.format,
            dist=args.dist,
            seed=args.seed,
            block_m=args.block_m,
        )
    except (ValueError, TypeError) as err:
        print(f"simfloat attribute: error: {err}", file=sys.stderr)
        return 2
    print(
        f"simfloat attribute --tile-sweep: {plan}, decode of {args.seq or 1} query row(s), {heads} head(s), "
        f"block_n {args.block_n or 64}, kv length {args.seq_k or 128} + residue"
        + (f", pages of {args.page_size}" if args.page_size else "")
        + (f", {args.num_splits} splits ({args.combine})" if args.num_splits != 1 else "")
        + "; error against float64 attention"
    )
    print(format_tile_sweep(rows))
    return 0


def _attribute(args: argparse.Namespace) -> int:
    from simfloat.attribution.cli import run

    if getattr(args, "tile_sweep", False):
        return _tile_sweep(args)
    passes = getattr(args, "passes", "forward")
    if getattr(args, "estimate", False) and passes != "forward":
        print("simfloat attribute: error: --estimate covers the forward pass's runs (--pass forward)", file=sys.stderr)
        return 2
    rc = run(args) if passes in ("forward", "both") else 0
    if passes in ("backward", "both") and rc == 0:
        from simfloat.attribution.backward import run_cli

        try:
            rc = run_cli(args)
        except (ValueError, NotImplementedError) as err:
            print(f"simfloat attribute: error: {err}", file=sys.stderr)
            return 2
    return rc


def _tile(text: str) -> tuple[int, int] | str:
    if text.lower().startswith("fa1:"):  # a tile rule, resolved for the inputs' head dim
        from simfloat.attention.tiling import resolve_tiles

        try:
            resolve_tiles(text, 1)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None
        return text
    parts = text.lower().split("x")
    if len(parts) != 2:
        raise argparse.ArgumentTypeError(f"a tile is BLOCK_MxBLOCK_N (e.g. 64x64) or fa1:M=<elements>, got {text!r}")
    return _positive(parts[0]), _positive(parts[1])


def _nonnegative(text: str) -> int:
    return int_at_least(text, 0, "non-negative")


def _trace_rows(text: str) -> int | None:
    r = _rows(text)
    return None if r == "all" else int(r)


def _rows(text: str) -> int | str:
    return "all" if text == "all" else _positive(text)


def _add_attribute(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "attribute",
        help="the main job: where flash attention's deviation from fp64 comes from (per op, per "
        "tile size, per rescaling step; flash vs baseline); table + PNG + CSVs",
        description="Attribute flash attention's deviation from the fp64 golden output (fp64 baseline "
        "attention) to ops (isolation: only that op low-precision; ablation: only that op fp64), "
        "tile sizes and rescaling steps, and compare flash with baseline attention. Default: seq "
        "2048, head dim 128, N(0,1) inputs rounded to bf16, plans triton-bf16 and all-bf16, every "
        "query row.",
    )
    p.add_argument("--seq", type=_positive, help="query sequence length (default 2048)")
    p.add_argument("--seq-k", type=_positive, help="key sequence length (default: --seq)")
    p.add_argument("--head-dim", type=_positive, help="head dimension (default 128)")
    p.add_argument("--batch", type=_positive, help="batch size (default 1)")
    p.add_argument(
        "--heads",
        type=_nonnegative,
        nargs="+",
        metavar="N|H",
        help="heads (default 1); with --inputs: the query heads of the recorded call to attribute, by index "
        "(e.g. --heads 0 3; default all)",
    )
    p.add_argument(
        "--inputs",
        metavar="FILE",
        help="attribute a model's own attention: a file of simfloat.torch.capture_sdpa (its q, k, v, causal mask "
        "and scale; --pass backward: its dO too) instead of seeded inputs; --format then picks the plans "
        "(default: the recorded dtype's)",
    )
    p.add_argument("--call", type=_nonnegative, metavar="N", help="with --inputs: the recorded call (default 0)")
    p.add_argument(
        "--kv-heads",
        type=_positive,
        help="key/value heads, dividing --heads (grouped-query "
        "attention: query head h reads kv head h // (heads // kv_heads); default --heads)",
    )
    p.add_argument(
        "--format",
        choices=("bf16", "fp16", "fp32", "e4m3", "e5m2"),
        help="input format (the seeded inputs are rounded into it); default plans triton-<format> "
        "and all-<format> (fp8: triton-<format> against pytorch-fp16); default: the --plan "
        "presets' own input format, else bf16. A plan whose input format does not hold the "
        "inputs is warned about",
    )
    p.add_argument(
        "--plan",
        action="append",
        metavar="PLAN",
        help="flash plan preset (repeatable; default triton-<format> and all-<format>)",
    )
    p.add_argument(
        "--hardware",
        metavar="FILE",
        help="hardware profile (simfloat-gpu fit --profile, or a shipped name: h200, a100, ada, blackwell): "
        "every triton-<format> plan becomes plan('triton-<format>', hardware=FILE), named "
        "triton-<format>@<profile> (a name --plan takes back), "
        "paired with triton-<format>'s baseline",
    )
    p.add_argument(
        "--baseline",
        action="append",
        metavar="[PLAN=]BASELINE",
        help="baseline plan for the comparison: one for all plans, or PLAN=BASELINE (repeatable); "
        "default triton-<f> and h200-<f> -> pytorch-<f>, all-<f> -> all-<f>",
    )
    p.add_argument("--block-m", type=_positive, help="query rows per tile (default 64)")
    p.add_argument("--block-n", type=_positive, help="keys per tile (default 64)")
    p.add_argument(
        "--tiles",
        type=_tile,
        nargs="+",
        metavar="MxN|fa1:M=ELEMS",
        help="tile study grid: MxN pairs or FlashAttention-1's rule fa1:M=<SRAM elements> (block_n = ceil(M/4d), "
        "block_m = min(block_n, d)); default 32x64 128x64 64x128 128x128",
    )
    p.add_argument(
        "--block-ns",
        type=_positive,
        nargs="+",
        metavar="N",
        help="block_n values of the rescaling-steps study, forward and backward (default 16 32 64 128 256 and seq_k)",
    )
    p.add_argument(
        "--seqs",
        type=_positive,
        nargs="+",
        metavar="N",
        help="--pass backward: lengths of the gradient-vs-rescaling-steps length sweep at --block-m x --block-n "
        "(first N queries and keys; default block_n times powers of two, and the full length)",
    )
    p.add_argument("--rows", type=_rows, metavar="R|all", help="query rows evaluated, evenly spaced (default: all)")
    p.add_argument(
        "--trace-rows",
        type=_trace_rows,
        default=64,
        metavar="R|all",
        help="query rows of the traced run (per-kv-block tables; the scalar reference engine): R "
        "evenly spaced of the evaluated rows, the first R with --causal (default 64)",
    )
    p.add_argument(
        "--dist",
        choices=("normal", "uniform", "outlier"),
        default="normal",
        help="inputs: N(0,1); U[0,1); N(0,1)+N(0,100)*Bernoulli(0.001) (default normal)",
    )
    p.add_argument("--seed", type=_nonnegative, default=0, help="input seed (default 0)")
    p.add_argument("--out", default="simfloat-out", help="output folder (default ./simfloat-out)")
    p.add_argument("--causal", action="store_true", help="top-left aligned causal mask")
    p.add_argument("--quick", action="store_true", help="small sizes (seq 80, head dim 16, 2 heads): seconds")
    p.add_argument(
        "--pass",
        dest="passes",
        choices=("forward", "backward", "both"),
        default="forward",
        help="attribute the forward output (default), the backward's gradients dQ/dK/dV "
        "(simfloat.attribution.backward: per backward op, the forward's share, vs tiles and vs rescaling steps) "
        "or both",
    )
    p.add_argument(
        "--estimate",
        action="store_true",
        help="time each kind of kernel run on a small slice of the inputs, print how long the job would take (and "
        "the --rows that fits in ten minutes), and run nothing (every job prints this estimate before it starts)",
    )
    p.add_argument(
        "--bounds",
        action="store_true",
        help="add the error bounds (simfloat.bounds) next to the measured errors: bounds.csv",
    )
    p.add_argument(
        "--tile-sweep",
        action="store_true",
        help="instead of the attribution: the tile-boundary sweep (simfloat.attribution.residues): decode at kv "
        "lengths --seq-k + r (default 128 + r) for every residue r modulo --block-n (default 64), printing the "
        "error per residue against float64 and the reported residue classes (flash-attention #2577, PyTorch "
        "#196678, #191937); --seq is the query rows (default 1), --plan the plan (first one)",
    )
    p.add_argument("--residues", type=_nonnegative, nargs="+", metavar="R", help="--tile-sweep: these residues only")
    p.add_argument("--page-size", type=_positive, help="--tile-sweep: a paged KV cache of this page size")
    p.add_argument(
        "--num-splits", type=_positive, default=1, help="--tile-sweep: split-KV into this many splits (default 1)"
    )
    p.add_argument(
        "--combine",
        choices=("flash-attn", "divide"),
        default="flash-attn",
        help="--tile-sweep: the split-KV combine (default flash-attn)",
    )
    p.set_defaults(func=_attribute)


def _load_array(path: str, names: tuple[str, ...], what: str) -> np.ndarray:
    """One array of a .npy file, or of a .npz file: its only array, else the first of ``names`` it holds."""
    import numpy as np

    try:
        data = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as err:
        raise ValueError(f"{what} {path}: cannot read it as .npy / .npz ({err})") from None
    if isinstance(data, np.ndarray):
        return data
    with data:
        keys = list(data.files)
        if len(keys) == 1:
            return np.asarray(data[keys[0]])
        for n in names:
            if n in keys:
                return np.asarray(data[n])
    raise ValueError(
        f"{what} {path}: holds {', '.join(keys) or 'no arrays'}; expected one array or one named {' or '.join(names)}"
    )


def _explain(args: argparse.Namespace) -> int:
    from simfloat.explanation import explain

    try:
        out = _load_array(args.out_file, ("out",), "OUT")
        ref = _load_array(args.ref_file, ("ref",), "REF")
        if args.inputs is not None:
            if any(x is not None for x in (args.q, args.k, args.v)):
                raise ValueError("give the inputs as --inputs FILE.npz or as --q --k --v, not both")
            q, k, v = (_load_array(args.inputs, (n,), f"--inputs ({n})") for n in ("q", "k", "v"))
        elif args.q is None or args.k is None or args.v is None:
            raise ValueError("the inputs are needed: --q Q --k K --v V (.npy / .npz each), or --inputs QKV.npz")
        else:
            q, k, v = (_load_array(p, (n,), f"--{n}") for p, n in ((args.q, "q"), (args.k, "k"), (args.v, "v")))
        res = explain(
            out,
            ref,
            q,
            k,
            v,
            plan=args.plan,
            causal=args.causal,
            scale=args.scale,
            block_m=args.block_m,
            block_n=args.block_n,
            layout=args.layout,
            confidence=args.confidence,
        )
    except (ValueError, TypeError, KeyError) as err:
        print(f"simfloat explain: error: {err}", file=sys.stderr)
        return 2
    print(res)
    return 0 if res.explained else 1


def _add_explain(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "explain",
        help="is a kernel's difference from a reference what the plan's numerics produce? if not, where and what "
        "kind (tile, NaN rows, layout, heads, mask, ties); exit 0 explained, 1 not, 2 bad input",
        description="Compare a kernel's attention output OUT with a reference output REF on the same inputs: "
        "inside the band of the plan's numerics (the emulator's own error on these inputs) or not, and if not, "
        "which heads, rows and query tiles, and what kind of difference (simfloat.explain). Exit status: 0 "
        "explained (bitwise equal to the emulator, or inside the band), 1 not explained, 2 bad input.",
    )
    p.add_argument("out_file", metavar="OUT", help="the kernel's output (.npy, or .npz with one array or 'out')")
    p.add_argument("ref_file", metavar="REF", help="the reference output (.npy, or .npz with one array or 'ref')")
    p.add_argument("--plan", required=True, help="the plan of the kernel's numerics (preset name, e.g. h200-bf16)")
    p.add_argument("--q", help="q (.npy / .npz)")
    p.add_argument("--k", help="k (.npy / .npz)")
    p.add_argument("--v", help="v (.npy / .npz)")
    p.add_argument("--inputs", metavar="QKV.npz", help="one .npz holding q, k and v (instead of --q --k --v)")
    p.add_argument("--causal", action="store_true", help="top-left aligned causal mask")
    p.add_argument("--scale", type=float, help="softmax scale (default 1/sqrt(head_dim))")
    p.add_argument("--block-m", type=_positive, default=64, help="query rows per tile (default 64)")
    p.add_argument("--block-n", type=_positive, default=64, help="keys per tile (default 64)")
    p.add_argument("--layout", choices=("bhsd", "bshd"), default="bhsd", help="layout of the arrays (default bhsd)")
    p.add_argument(
        "--confidence", type=float, default=0.99, help="confidence of the plan's band, in (0, 1) (default 0.99)"
    )
    p.set_defaults(func=_explain)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="simfloat", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser(
        "demo", help="round a value in every format and mode; a dot product under several accumulation models"
    )
    demo.add_argument("--value", type=float, default=0.1, help="value to round (default 0.1)")
    demo.add_argument("--k", type=_positive, default=4096, help="dot-product length (default 4096)")
    demo.add_argument("--seed", type=_nonnegative, default=0, help="seed of the dot product's inputs (default 0)")
    demo.set_defaults(func=_demo)
    _add_attribute(sub)
    _add_explain(sub)
    from simfloat.sweep.cli import add_report, add_sweep

    add_sweep(sub)
    add_report(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``simfloat`` console script: the subcommand's exit status (130 after Ctrl-C, which
    ``attribute`` answers within a second or two, keeping what was finished on disk)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["validate"]:  # the validation campaign is its own package, which simfloat never imports
        print(
            "simfloat validate: moved to `simfloat-gpu validate` (same options; the validation campaign lives "
            "in the simfloat_gpu package, installed with the gpu extra)",
            file=sys.stderr,
        )
        return 2
    args = build_parser().parse_args(argv)
    return run_command(lambda: args.func(args), f"simfloat {args.command}")


if __name__ == "__main__":
    sys.exit(main())
