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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="simfloat", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="round a value in every format and mode; a dot product under several "
                                       "accumulation models")
    demo.add_argument("--value", type=float, default=0.1, help="value to round (default 0.1)")
    demo.add_argument("--k", type=int, default=4096, help="dot-product length (default 4096)")
    demo.add_argument("--seed", type=int, default=0)
    demo.set_defaults(func=_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``simfloat`` console script."""
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
