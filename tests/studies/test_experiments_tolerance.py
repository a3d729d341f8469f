"""experiments/tolerance_coverage.py: the smoke run writes its CSV, one row per case, every fresh output inside."""

from __future__ import annotations

import csv
import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "experiments" / "tolerance_coverage.py"


def test_smoke_run(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("tolerance_coverage", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--smoke", "--out", str(tmp_path)]) == 0
    assert "wall time" in capsys.readouterr().out
    rows = list(csv.DictReader((tmp_path / "tolerance_coverage.csv").open()))
    assert len(rows) == 2  # one plan, causal or not, one sample count
    for r in rows:
        assert r["outside"] == "0" and 0 < float(r["largest_ratio"]) <= 1, r
