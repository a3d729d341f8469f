"""Command line: ``simfloat demo | attribute | validate``. Each subcommand lives in its own module and is
imported only when run, so ``simfloat --help`` stays fast."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

__all__ = ["main"]


def _demo(args: argparse.Namespace) -> int:
    from simfloat.demo import run_demo

    print(run_demo(args.value, args.k, args.seed))
    return 0


def _validate(args: argparse.Namespace) -> int:
    try:
        from gpu import validate
    except ImportError as exc:
        print("simfloat validate: needs the gpu/ package of the simfloat source tree (run it from a "
              f"checkout, e.g. `pip install -e '.[gpu]'`), and torch + triton to run the kernels: {exc}",
              file=sys.stderr)
        return 2
    try:
        return validate.run(args)
    except RuntimeError as exc:  # no triton / no CUDA / TRITON_INTERPRET set too late: say what to do
        print(f"simfloat validate: {exc}", file=sys.stderr)
        return 2


def _add_validate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "validate", help="cross-validate the Triton kernels (GPU, or the faithful CPU interpreter) against "
                         "the emulator over a grid of configs; validation.csv + validation.md",
        description="Run gpu/flash_attention.py (and the int8 kernels) on the GPU if torch sees one, else "
                    "under gpu.interpreter.faithful() on the CPU, and the emulator with the matching "
                    "triton-<fmt> plan, config by config; report bitwise agreement, ulp distances and errors "
                    "vs float64. "
                    "--fixtures DIR compares the emulator with recorded GPU outputs instead.")
    try:  # gpu.validate imports only numpy + stdlib; torch, triton, the kernels load when the command runs
        from gpu.validate import add_arguments
    except ImportError:  # reported by _validate when run
        p.add_argument("--out")
        for flag in ("--grid", "--backend", "--jobs", "--record-fixtures", "--fixtures", "--max-cost",
                     "--budget-s"):
            p.add_argument(flag)
        for flag in ("--no-int8", "--no-emulator"):
            p.add_argument(flag, action="store_true")
    else:
        add_arguments(p)
    p.set_defaults(func=_validate)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="simfloat", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="round a value in every format and mode; a dot product under several "
                                       "accumulation models")
    demo.add_argument("--value", type=float, default=0.1, help="value to round (default 0.1)")
    demo.add_argument("--k", type=int, default=4096, help="dot-product length (default 4096)")
    demo.add_argument("--seed", type=int, default=0)
    demo.set_defaults(func=_demo)
    _add_validate(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``simfloat`` console script."""
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
