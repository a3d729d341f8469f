"""``simfloat-gpu validate --pass backward``: the backward kernels under the faithful interpreter against the
emulator's triton-<fmt> backward plans, on the smoke grid (bit for bit on dQ, dK, dV, delta and lse)."""

import csv
import dataclasses
import os

os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402

pytest.importorskip("torch")
pytest.importorskip("triton")

from simfloat_gpu.campaign import validate  # noqa: E402
from simfloat_gpu.campaign.records import BackwardRecord  # noqa: E402
from simfloat_gpu.campaign.validate_bwd import GROUPS, backward_grid, emulator_plan  # noqa: E402

pytestmark = pytest.mark.triton


def test_backward_smoke_grid_is_bitwise(tmp_path):
    rc = validate.main(["--pass", "backward", "--grid", "smoke", "--backend", "faithful", "--out", str(tmp_path)])
    rows = list(csv.DictReader(open(tmp_path / "backward.csv")))
    assert len(rows) == len(backward_grid("smoke")) == 3
    assert {r["out"] for r in rows} == {"low", "fp32"}  # delta from O in the input format and from fp32 O
    assert sorted(int(r["kv_heads"]) for r in rows) == [1, 2, 2]  # one multi-query config (2 query heads)
    for r in rows:
        assert r["status"] == "bitwise", r
        assert float(r["dq_err"]) < 0.05 and float(r["emulator_dq_err"]) < 0.05
    assert rc == 0
    assert "3/3 configs bitwise identical" in (tmp_path / "backward.md").read_text()


def test_backward_grids_cover_every_value():
    ci = backward_grid("ci")
    for attr, values in (
        ("fmt", validate.FORMATS + ("fp32",)),
        ("block_m", validate.BLOCKS),
        ("block_n", validate.BLOCKS),
        ("seq", validate.SEQS),
        ("head_dim", validate.HEAD_DIMS),
        ("causal", validate.CAUSAL),
        ("out", validate.OUTS),
    ):
        assert {getattr(c, attr) for c in ci} >= set(values), attr  # GQA configs add head dim 32
    for grid in (ci, backward_grid("full")):
        assert {(c.heads, c.kv_heads) for c in grid if c.kv_heads} == set(GROUPS)
        assert {c.precision for c in grid if c.fmt == "fp32"} == set(validate.PRECISIONS)
        assert {emulator_plan(c) for c in grid if c.fmt == "fp32"} == {"triton-tf32", "triton-fp32"}
        assert len({c.id for c in grid}) == len(grid)
    with pytest.raises(ValueError, match="unknown grid"):
        backward_grid("huge")


def test_old_backward_csv_rows_still_load():
    """kv_heads, precision and plan are the last columns: a row written before them loads (None, "", "")."""
    row = BackwardRecord(
        "bwd-x", "bf16", 64, 16, 2, 16, 16, False, "low", "faithful", kv_heads=1, precision="", plan="triton-bf16"
    )
    cells = row.to_csv_row()
    assert list(cells)[-3:] == ["kv_heads", "precision", "plan"]
    old = {k: v for k, v in cells.items() if k not in ("kv_heads", "precision", "plan")}
    assert BackwardRecord.from_csv_row(old) == dataclasses.replace(row, kv_heads=None, plan="")
    assert BackwardRecord.from_csv_row(cells) == row


def test_config_kv_heads_and_precision():
    old = validate.Config("flash", "bf16", 64, 16, 16, 16, False, "low")
    assert old.id == "flash-bf16-s64-d16-m16n16-full-low-h2"  # ids, and so seeds, of older configs unchanged
    gqa = validate.Config("flash", "bf16", 64, 16, 16, 16, False, "low", heads=4, kv_heads=2)
    assert gqa.id.endswith("-h4-kv2") and gqa.kv_shape == (1, 2, 64, 16)
    q, k, v = validate.make_inputs(gqa)
    assert q.shape == (1, 4, 64, 16) and k.shape == v.shape == (1, 2, 64, 16)
    with pytest.raises(ValueError, match="kv_heads must divide"):
        validate.Config("flash", "bf16", 64, 16, 16, 16, False, "low", heads=4, kv_heads=3)
    with pytest.raises(ValueError, match="precision must be one of"):
        validate.Config("flash", "fp32", 64, 16, 16, 16, False, "fp32")
    with pytest.raises(ValueError, match="precision is for fp32 inputs only"):
        validate.Config("flash", "bf16", 64, 16, 16, 16, False, "low", precision="tf32")
