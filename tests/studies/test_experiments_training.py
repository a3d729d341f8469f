"""experiments/training_divergence.py and training_tied_maxima.py: smoke runs, determinism, resume."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import replace
from pathlib import Path

import pytest

pd = pytest.importorskip("pandas")
pytest.importorskip("torch")
pytest.importorskip("scipy")
pytest.importorskip("matplotlib")
pytest.importorskip("tqdm")

HERE = Path(__file__).resolve().parents[2] / "experiments"


def _module(name):
    spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(name, mod)
    spec.loader.exec_module(mod)
    return mod


td = _module("training_divergence")


def test_smoke_run_writes_every_pair_and_layer(tmp_path, capsys):
    assert td.main(["--smoke", "--no-progress", "--out", str(tmp_path)]) == 0
    assert "wall time" in capsys.readouterr().out
    df = pd.read_csv(tmp_path / "training_divergence.csv")
    groups = {"embed", "head"} | {f"block{i}" for i in range(td.SMOKE.layers)}
    assert set(df["group"]) == groups
    assert sorted(set(df["step"])) == list(range(td.SMOKE.record, td.SMOKE.steps + 1, td.SMOKE.record))
    assert set(zip(df["run"], df["against"], strict=True)) == set(td.PAIRS)
    assert len(df) == len(td.PAIRS) * len(groups) * td.SMOKE.steps // td.SMOKE.record
    # every run differs from the reference (the numerics differ), and W1 <= max |dw| (a coupling bound)
    assert (df["max_abs_dw"] > 0).all() and (df["wasserstein"] <= df["max_abs_dw"] + 1e-15).all()
    assert (tmp_path / "training_divergence.png").read_bytes()[:4] == b"\x89PNG"
    parts = pd.read_csv(tmp_path / "training_divergence_time.csv")
    assert set(parts["part"]) == {"forward_emulation", "backward_emulation", "rest"}
    assert (parts["seconds"] > 0).all()


def test_identical_runs_do_not_diverge_and_resume_gives_the_same_records(tmp_path):
    size = replace(td.SMOKE, steps=4, record=1)
    runs = (td.RUNS[0], replace(td.RUNS[0], name="again"), td.RUNS[2])
    pairs = (("again", td.REFERENCE), ("flash-bf16", td.REFERENCE))
    whole, _ = td.train(size, tmp_path / "a", runs=runs, pairs=pairs, progress=False)
    td.train(replace(size, steps=2), tmp_path / "b", runs=runs, pairs=pairs, progress=False)
    resumed, done = td.train(size, tmp_path / "b", runs=runs, pairs=pairs, resume=True, progress=False)
    a, b = pd.read_csv(whole), pd.read_csv(resumed)
    assert done and (a[a["run"] == "again"]["max_abs_dw"] == 0).all()
    assert (a[a["run"] == "flash-bf16"]["max_abs_dw"] > 0).all()
    pd.testing.assert_frame_equal(a, b)


def test_tied_maxima_smoke(tmp_path, capsys):
    tm = _module("training_tied_maxima")
    assert tm.main(["--smoke", "--no-progress", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "loss spikes" in out
    ties = pd.read_csv(tmp_path / "training_tied_maxima_ties.csv")
    assert set(ties["run"]) == {r.name for r in tm.RUNS}
    assert (ties["tied_row_max_fraction_layer0"] > 0).any()  # the sink token does tie maxima
    df = pd.read_csv(tmp_path / "training_tied_maxima.csv")
    assert set(df["run"]) == {"flash-bf16", "flash-o32"}
