"""simfloat_gpu/campaign/records.py: the typed result records of the campaign, their CSV and JSON forms (round
trips, the unchanged validation.csv / backward.csv columns), and every committed record file still loading.
No triton, no kernels: records and files only."""

import csv
import io
import json
import math
import subprocess
from pathlib import Path

import pytest

from simfloat_gpu.campaign import validate as V
from simfloat_gpu.campaign import validate_bwd as B
from simfloat_gpu.campaign.compare import new_record
from simfloat_gpu.campaign.fixtures import optional_float
from simfloat_gpu.campaign.records import CONFIG_FIELDS, BackwardRecord, ValidationRecord

ROOT = Path(__file__).resolve().parents[2]

#: the columns validation.csv had before the record (files written since must read the same)
OLD_FIELDS = (
    "id kind fmt variant row_sum seq head_dim heads block_m block_n causal out seed backend plan status "
    "bitwise_agreement max_ulp out32_agreement out32_max_ulp out32_rel_diff m_agreement m_max_ulp l_agreement "
    "l_max_ulp kernel_err_max kernel_err_rms emulator_err_max emulator_err_rms kernel_s emulator_s"
).split()
OLD_BWD_FIELDS = (
    "id fmt seq head_dim heads block_m block_n causal out backend status lse_equal dq_agreement dk_agreement "
    "dv_agreement delta_agreement dq_err dk_err dv_err emulator_dq_err emulator_dk_err emulator_dv_err kernel_s "
    "emulator_s"
).split()


def _compared() -> ValidationRecord:
    cfg = V.Config("flash", "bf16", 97, 16, 32, 16, True, "low")
    return new_record(
        cfg,
        "faithful",
        "h200",
        status="ok",
        bitwise_agreement=0.998047,
        max_ulp=1,
        out32_agreement=1.0,
        out32_max_ulp=0,
        out32_rel_diff=1.2345678e-4,
        m_agreement=1.0,
        m_max_ulp=0,
        l_agreement=0.5,
        l_max_ulp=-1,
        kernel_err_max=2.3931234e-3,
        kernel_err_rms=3.726e-4,
        emulator_err_max=math.inf,
        emulator_err_rms=math.nan,
        kernel_s=5.975,
        emulator_s=0.0,
    )


def _via_csv(rows, fields):
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=fields)
    w.writeheader()
    w.writerows(r.to_csv_row() for r in rows)
    buf.seek(0)
    return list(csv.DictReader(buf))


def _same(a, b) -> bool:
    """Records equal field by field, NaN equal to NaN."""
    fa, fb = a.to_json(), b.to_json()
    return type(a) is type(b) and fa == fb


def test_columns_are_the_old_ones():
    assert list(V.FIELDS) == OLD_FIELDS
    # backward.csv gained kv_heads, precision (GQA and fp32 configs) and plan at the end: the old columns are a prefix
    assert list(B.BWD_FIELDS) == OLD_BWD_FIELDS + ["kv_heads", "precision", "plan"]


def test_both_records_declare_the_config_fields_in_one_order_and_type():
    """Both records carry records.CONFIG_FIELDS, in its order and with its types, where their CSVs always had
    them (after ``row_sum`` in the forward record, after ``fmt`` in the backward one)."""
    names = list(CONFIG_FIELDS)
    for record, after in ((ValidationRecord, "row_sum"), (BackwardRecord, "fmt")):
        cols = list(record.csv_fields())
        i = cols.index(after) + 1
        assert cols[i : i + len(names)] == names
        assert {n: record._field_types()[n][0].__name__ for n in names} == CONFIG_FIELDS


def test_csv_round_trip_is_exact_at_the_edge():
    rec = _compared()
    empty = new_record(V.Config("int8", "fp16", 64, 64, 64, 64, False, "low", "half-int8", "consistent"), "gpu")
    text = _via_csv([rec, empty], V.FIELDS)
    assert text[0]["kernel_err_max"] == "2.393e-03" and text[0]["out32_rel_diff"] == "1.235e-04"
    assert text[0]["bitwise_agreement"] == "0.998047" and text[0]["causal"] == "True"
    assert text[0]["emulator_err_max"] == "inf" and text[0]["emulator_err_rms"] == "nan"
    assert text[1]["bitwise_agreement"] == "" and text[1]["plan"] == "half-int8-consistent"
    back = [ValidationRecord.from_csv_row(t) for t in text]
    # errors come back with the four digits the CSV keeps; everything else exactly
    assert back[0].kernel_err_max == 2.393e-3 and back[0].out32_rel_diff == 1.235e-4
    assert back[0].bitwise_agreement == rec.bitwise_agreement and back[0].max_ulp == 1 and back[0].l_max_ulp == -1
    assert back[0].causal is True and back[0].seed == rec.seed and math.isnan(back[0].emulator_err_rms)
    assert _same(back[1], empty) and back[1].compared is False
    # and the text is a fixed point
    assert [b.to_csv_row() for b in back] == text


def test_json_round_trip_is_exact():
    rec = _compared()
    data = json.loads(json.dumps(rec.to_json()))
    assert data["emulator_err_max"] == "inf" and data["max_ulp"] == 1 and data["bitwise_agreement"] == 0.998047
    back = ValidationRecord.from_json(data)
    assert _same(back, rec) and back.kernel_err_max == rec.kernel_err_max
    bwd = BackwardRecord("bwd-x", "fp16", 33, 16, 2, 32, 16, False, "fp32", "faithful", "bitwise", True, 1.0)
    assert BackwardRecord.from_json(json.loads(json.dumps(bwd.to_json()))) == bwd
    text = _via_csv([bwd], B.BWD_FIELDS)
    assert text[0]["lse_equal"] == "True" and text[0]["dk_agreement"] == ""
    assert BackwardRecord.from_csv_row(text[0]) == bwd


def test_bitwise_and_compared():
    rec = _compared()
    assert rec.compared and not rec.bitwise
    import dataclasses

    same = dataclasses.replace(rec, bitwise_agreement=1.0, l_agreement=1.0)
    assert same.bitwise


def test_fields_are_type_checked_with_the_field_named():
    rec = _compared()
    import dataclasses

    import numpy as np

    with pytest.raises(TypeError, match=r"ValidationRecord.max_ulp must be int or None"):
        dataclasses.replace(rec, max_ulp=1.5)
    with pytest.raises(TypeError, match=r"ValidationRecord.causal must be bool"):
        dataclasses.replace(rec, causal=np.bool_(True))
    with pytest.raises(TypeError, match=r"ValidationRecord.seq must be int"):
        dataclasses.replace(rec, seq=True)
    with pytest.raises(TypeError, match=r"BackwardRecord.lse_equal must be bool or None"):
        BackwardRecord("x", "fp16", 1, 16, 1, 16, 16, False, "low", "gpu", lse_equal="yes")
    assert dataclasses.replace(rec, bitwise_agreement=1).bitwise_agreement == 1.0  # an int agreement is a float
    with pytest.raises(dataclasses.FrozenInstanceError):
        rec.status = "changed"


def test_bad_cells_name_the_column():
    row = _compared().to_csv_row()
    with pytest.raises(ValueError, match=r"column 'max_ulp' must be int, got '1.5'"):
        ValidationRecord.from_csv_row(dict(row, max_ulp="1.5"))
    with pytest.raises(ValueError, match=r"column 'causal' must be bool"):
        ValidationRecord.from_csv_row(dict(row, causal="yes"))
    with pytest.raises(ValueError, match=r"column 'seq' is missing or empty"):
        ValidationRecord.from_csv_row({k: v for k, v in row.items() if k != "seq"})


def _committed(pattern: str) -> list[Path]:
    out = subprocess.run(["git", "ls-files", pattern], cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:  # not a git checkout (an sdist): every file under the tree
        return sorted(p for p in ROOT.rglob(pattern.replace("**/", "")) if ".git" not in p.parts)
    return [ROOT / line for line in out.stdout.splitlines()]


def test_every_committed_record_file_loads():
    """Fixture configs (their kernel columns), the GPU job's summary.json rows, and any committed
    validation.csv / backward.csv read as records."""
    loaded = 0
    for fix in V.fixture_dirs(ROOT / "tests" / "fixtures" / "gpu"):
        _, items = V.load_fixtures(fix)
        assert items
        for cfg, entry, _ in items:
            rec = new_record(
                cfg, "fixtures", **{k: optional_float(entry.get(k)) for k in ("kernel_err_max", "kernel_s")}
            )
            assert rec.to_csv_row()["kernel_err_max"] == entry["kernel_err_max"]  # the text survives the record
            loaded += 1
    for path in _committed("**/summary.json"):
        rows = json.loads(path.read_text()).get("parts", {}).get("fixtures", {}).get("rows", [])
        for row in rows:
            rec = ValidationRecord.from_json(row)
            assert rec.id == row["id"] and rec.kernel_s == row["kernel_s"]
            loaded += 1
    for name, cls in (("validation.csv", ValidationRecord), ("backward.csv", BackwardRecord)):
        for path in _committed(f"**/{name}"):
            with open(path, newline="") as f:
                for row in csv.DictReader(f):
                    cls.from_csv_row(row)
                    loaded += 1
    assert loaded > 0
