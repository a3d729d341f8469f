"""The analysis extra (pandas, matplotlib, tqdm), loaded when a result is tabulated or drawn: one line saying what
to install when a module is missing, and the one way figures are saved."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

__all__ = ["need", "pyplot", "save_figure"]


def need(module: str, what: str) -> Any:
    """Import an optional dependency of the analysis extra, or say in one line what to install.

    Raises:
        ImportError: ``module`` is missing; the message names ``what`` needs it and the extra to install.
    """
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ImportError(f"{what} needs {module}: pip install 'simfloat-emu[analysis]'") from None


def pyplot(what: str) -> Any:
    """matplotlib.pyplot on the Agg backend (files only), or the ImportError of :func:`need` naming ``what``."""
    need("matplotlib", what).use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(plt: Any, fig: Any, path: Path, dpi: int) -> Path:
    """``fig`` laid out, saved as ``path`` (its folder created) at ``dpi`` and closed; returns ``path``."""
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path
