"""Command line of the validation campaign: ``simfloat-gpu validate | run | probe | fit | attribute``.

Each subcommand is one module of :mod:`simfloat_gpu.campaign` with its own ``main(argv, prog)``; it is imported
only when run, so that ``TRITON_INTERPRET`` can still be set before any kernel module is imported and
``simfloat-gpu --help`` stays fast.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

from simfloat._interrupt import run_command

__all__ = ["COMMANDS", "main"]

#: subcommand -> (module of simfloat_gpu.campaign, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "validate": (
        "validate",
        "the Triton kernels (GPU, or the faithful CPU interpreter) against the emulator over a grid of "
        "configs, or the emulator against recorded GPU fixtures (--fixtures); validation.csv + validation.md",
    ),
    "run": ("gpu_run", "the one GPU job: fixtures, probes, speed, environment, in a time budget"),
    "probe": ("probes", "one hardware probe (isa, dot, exp, sum) on its own"),
    "fit": ("fit_cli", "fit the emulator's hardware models to probe results and report how well each fits"),
    "attribute": (
        "attribute",
        "error attribution of any Triton kernel by source line (faithful interpreter: isolation and ablation "
        "of each floating-point op against the float64 golden run)",
    ),
}


def _usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {text}" for name, (_, text) in COMMANDS.items()]
    return (
        "usage: simfloat-gpu {" + ",".join(COMMANDS) + "} ...\n\n" + __doc__.splitlines()[0] + "\n\n" + "\n".join(lines)
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``simfloat-gpu`` console script: the subcommand's exit status (2: bad arguments,
    130 after Ctrl-C, with what was finished kept on disk)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(_usage(), file=sys.stdout if args else sys.stderr)
        return 0 if args else 2
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(f"{_usage()}\n\nsimfloat-gpu: error: unknown command {name!r}", file=sys.stderr)
        return 2
    module = importlib.import_module(f"simfloat_gpu.campaign.{COMMANDS[name][0]}")
    return run_command(lambda: module.main(rest, prog=f"simfloat-gpu {name}"), f"simfloat-gpu {name}")


if __name__ == "__main__":
    sys.exit(main())
