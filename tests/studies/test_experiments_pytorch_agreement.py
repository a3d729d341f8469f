"""experiments/pytorch_eager_agreement.py: the smoke run writes its CSV, and the opmath plans agree with torch's
eager attention at least as often as the scale rounded into the format (strictly more at head dims 96, 128)."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "experiments"))

import pytorch_eager_agreement  # noqa: E402


def test_smoke(tmp_path):
    assert pytorch_eager_agreement.main(["--smoke", "--out", str(tmp_path)]) == 0
    with open(tmp_path / "pytorch_eager_agreement.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 6 and {r["format"] for r in rows} == {"bf16", "fp16"}
    for r in rows:
        new, old = float(r["equal_opmath"]), float(r["equal_scale_in_format"])
        assert new >= 0.98
        assert new > old if r["head_dim"] != "64" else new == old
