"""experiments/bounds_tightness.py: the smoke run writes its CSV with one row per configuration."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pd = pytest.importorskip("pandas")

SCRIPT = Path(__file__).resolve().parents[2] / "experiments" / "bounds_tightness.py"


def test_smoke_run(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("bounds_tightness", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--smoke", "--out", str(tmp_path)]) == 0
    assert "wall time" in capsys.readouterr().out
    df = pd.read_csv(tmp_path / "bounds_tightness.csv")
    assert len(df) == len(mod.SMOKE["placements"]) * len(mod.SMOKE["seqs"]) * len(mod.SMOKE["block_ns"])
    assert (df["exceeded"] == 0).all()
    assert (df["tight_worst_max"] >= 1).all() and (df["prob_max"] <= df["worst_max"]).all()
    shares = df[[f"share_{t}" for t in mod.TERMS]].sum(axis=1)
    assert ((shares - 1).abs() < 1e-3).all()  # the CSV keeps 4 significant digits
