"""experiments/backward_mechanisms.py: the smoke run writes both CSVs and the figure; the tied-maxima study
has a row per number of ties and forward variant (the max-shift fix among them), and the fix leaves the rows
of one maximum as they are."""

from __future__ import annotations

import csv
import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

SCRIPT = Path(__file__).resolve().parents[2] / "experiments" / "backward_mechanisms.py"


def test_smoke_run(tmp_path):
    spec = importlib.util.spec_from_file_location("backward_mechanisms", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.main(["--smoke", "--out", str(tmp_path)])
    assert (tmp_path / "backward_mechanisms.png").stat().st_size > 0
    with open(tmp_path / "backward_ties.csv") as fh:
        ties = list(csv.DictReader(fh))
    variants = [v for v, _, _ in mod.VARIANTS]
    want = [(t, v) for t in mod.TIES if t < 64 for v in variants]  # the smoke run has 64 keys
    assert [(int(r["ties"]), r["variant"]) for r in ties] == want
    by = {(int(r["ties"]), r["variant"]): r for r in ties}
    # one maximum per row: the fix has nothing to shift, so the same bits as the plain bf16 forward
    assert by[(1, "max-shift fix, bf16 O")]["delta_bias"] == by[(1, "delta from bf16 O")]["delta_bias"]
    assert by[(8, "max-shift fix, bf16 O")]["delta_bias"] != by[(8, "delta from bf16 O")]["delta_bias"]
    with open(tmp_path / "backward_leak.csv") as fh:
        assert len(list(csv.DictReader(fh))) == 6
