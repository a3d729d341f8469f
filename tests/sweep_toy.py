"""A toy sweep kind for the sweep tests: cheap, deterministic metrics of its config, with switches to sleep,
raise, or kill its worker process once (guarded by a marker file)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any


def run(config: dict[str, Any]) -> dict[str, float | int | str]:
    """``y = a * x + seed`` and friends; ``sleep`` seconds first; ``fail``: raise; ``crash_marker``: if that
    file does not exist, create it and end the process at once (``os._exit``), as a killed worker would."""
    marker = config.get("crash_marker")
    if marker is not None and not Path(marker).exists():
        Path(marker).write_text("crashed once\n")
        os._exit(3)
    time.sleep(float(config.get("sleep", 0.0)))
    if config.get("fail"):
        raise RuntimeError(f"toy failure for x={config.get('x')}")
    x, a, seed = float(config.get("x", 0)), float(config.get("a", 1)), int(config.get("seed", 0))
    return {"y": a * x + seed, "y2": (a * x) ** 2, "label": f"x{config.get('x')}", "pid": os.getpid()}


def validate(config: dict[str, Any]) -> None:
    """Refuse configs with a negative ``x`` (the sweep calls this on every config before running any)."""
    if float(config.get("x", 0)) < 0:
        raise ValueError(f"x must be >= 0, got {config['x']}")
