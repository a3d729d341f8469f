"""``simfloat-gpu validate --pass backward``: the backward kernels under the faithful interpreter against the
emulator's triton-<fmt> backward plans, on the smoke grid (bit for bit on dQ, dK, dV, delta and lse)."""

import csv
import os

os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402

pytest.importorskip("torch")
pytest.importorskip("triton")

from simfloat_gpu.campaign import validate  # noqa: E402
from simfloat_gpu.campaign.validate_bwd import backward_grid  # noqa: E402

pytestmark = pytest.mark.triton


def test_backward_smoke_grid_is_bitwise(tmp_path):
    rc = validate.main(["--pass", "backward", "--grid", "smoke", "--backend", "faithful", "--out", str(tmp_path)])
    rows = list(csv.DictReader(open(tmp_path / "backward.csv")))
    assert len(rows) == len(backward_grid("smoke")) == 2
    assert {r["out"] for r in rows} == {"low", "fp32"}  # delta from O in the input format and from fp32 O
    for r in rows:
        assert r["status"] == "bitwise", r
        assert float(r["dq_err"]) < 0.05 and float(r["emulator_dq_err"]) < 0.05
    assert rc == 0
    assert "2/2 configs bitwise identical" in (tmp_path / "backward.md").read_text()


def test_backward_grids_cover_every_value():
    ci = backward_grid("ci")
    for attr, values in (
        ("fmt", validate.FORMATS),
        ("block_m", validate.BLOCKS),
        ("block_n", validate.BLOCKS),
        ("seq", validate.SEQS),
        ("head_dim", validate.HEAD_DIMS),
        ("causal", validate.CAUSAL),
        ("out", validate.OUTS),
    ):
        assert {getattr(c, attr) for c in ci} == set(values), attr
    with pytest.raises(ValueError, match="unknown grid"):
        backward_grid("huge")
