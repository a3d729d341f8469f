"""experiments/golden_flash_vs_baseline.py: the smoke run writes its CSVs and PNG with the expected rows."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pd = pytest.importorskip("pandas")
pytest.importorskip("matplotlib")

SCRIPT = Path(__file__).resolve().parents[2] / "experiments" / "golden_flash_vs_baseline.py"


def _module():
    spec = importlib.util.spec_from_file_location("golden_flash_vs_baseline", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_smoke_run(tmp_path, capsys):
    mod = _module()
    assert mod.main(["--smoke", "--out", str(tmp_path)]) == 0
    assert "wall time" in capsys.readouterr().out
    seq = pd.read_csv(tmp_path / "golden_flash_vs_baseline.csv")
    tiles = pd.read_csv(tmp_path / "golden_tiles.csv")
    assert (tmp_path / "golden_flash_vs_baseline.png").read_bytes()[:4] == b"\x89PNG"
    # bf16: all, state, triton; fp32: all, triton (state-fp32 is triton-fp32) -- per sequence length
    assert len(seq) == 5 * len(mod.SMOKE["seqs"])
    assert set(seq["placement"]) == {"all", "state", "triton"}
    assert set(seq[seq["format"] == "fp32"]["placement"]) == {"all", "triton"}
    pairs = set(zip(seq["flash_plan"], seq["baseline_plan"], strict=True))
    want = {("all-bf16", "all-bf16"), ("triton-bf16", "pytorch-bf16"), ("state-bf16", "pytorch-bf16")}
    assert want <= pairs
    for col in ("flash_max_abs", "baseline_max_abs", "flash_rms", "ratio_max", "ratio_rms"):
        assert (seq[col] > 0).all(), col
    assert (seq["ratio_max"] == seq["flash_max_abs"] / seq["baseline_max_abs"]).all()
    # fp32 deviates far less than bf16
    fp32, bf16 = (seq[seq["format"] == f]["flash_max_abs"] for f in ("fp32", "bf16"))
    assert fp32.max() < 1e-3 < bf16.min()
    assert len(tiles) == 3 * len(mod.SMOKE["tiles"])


def test_state_placement_differs_from_triton_only_in_the_state():
    mod = _module()
    state, base = mod.plans("state", "bf16")
    tri, _ = mod.plans("triton", "bf16")
    assert base.name == "pytorch-bf16"
    for op in ("qk", "scale", "exp", "p", "normalize", "out"):
        assert getattr(state, op) == getattr(tri, op)
    for op in ("m_i", "l_i", "alpha", "acc"):
        assert str(getattr(state, op)) == "bfloat16"
    assert state.pv.outer_fmt.name == "bfloat16" and state.pv.inner == tri.pv
    assert mod.plans("state", "fp32")[0].pv == mod.plans("triton", "fp32")[0].pv
