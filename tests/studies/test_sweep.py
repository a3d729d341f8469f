"""simfloat.sweep: SPEC checks and grid expansion, the SQLite store, runs on a local Dask cluster (rerun skips,
a worker that dies is retried, a client killed with SIGKILL resumes with one row per config), the report, and
the built-in ``attribute`` kind. The runs use the toy kind of ``tests/sweep_toy.py`` on tiny grids."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sigint

from simfloat.sweep import SpecError, config_hash, load, load_spec, report, run_sweep
from simfloat.sweep.spec import expand

ROOT = Path(__file__).resolve().parents[2]
TESTS = Path(__file__).resolve().parents[1]
TOY = "sweep_toy:run"

distributed = pytest.importorskip("distributed")


def _spec(grid: dict, **sweep: object) -> dict:
    return {"sweep": {"name": "toy", "kind": TOY, **sweep}, "grid": grid}


# -- the SPEC -------------------------------------------------------------------------------------------------


def test_grid_expansion_with_exclude_include_and_seeds(tmp_path: Path) -> None:
    raw = {
        "sweep": {"name": "t", "kind": TOY, "seeds": [3, 5]},
        "grid": {"x": [1, 2, 3], "a": [1, 2], "tag": "fixed"},
        "exclude": [{"x": 2, "a": 1}, {"x": [3], "a": 2}],
        "include": [{"x": 9, "a": [5, 6]}, {"x": 1, "a": 1}],  # the second is already in the grid
    }
    configs, axes = expand(raw)
    base = [(1, 1), (1, 2), (2, 2), (3, 1), (9, 5), (9, 6)]
    want = [{"x": x, "a": a, "tag": "fixed", "seed": s} for x, a in base for s in (3, 5)]
    assert configs == want
    assert axes == ("x", "a", "seed")
    # the same SPEC as a TOML file
    path = tmp_path / "s.toml"
    path.write_text(
        '[sweep]\nname = "t"\nkind = "sweep_toy:run"\nseeds = [3, 5]\n'
        '[grid]\nx = [1, 2, 3]\na = [1, 2]\ntag = "fixed"\n'
        "[[exclude]]\nx = 2\na = 1\n[[exclude]]\nx = [3]\na = 2\n"
        "[[include]]\nx = 9\na = [5, 6]\n[[include]]\nx = 1\na = 1\n"
    )
    spec = load_spec(path)
    assert list(spec.configs) == want and spec.name == "t" and spec.target == TOY
    assert len(set(spec.hashes())) == len(want)
    # seeds as a count; scalars only: one config
    assert [c["seed"] for c in expand(_spec({"x": 1}, seeds=3))[0]] == [0, 1, 2]
    assert expand(_spec({"x": 1, "a": 2})) == ([{"x": 1, "a": 2}], ())
    # an include takes the grid's fixed values and one-value axes (a list value is written as a list of lists)
    raw = {**_spec({"x": [1, 2], "ops": [["exp", "l_i"]], "b": 0}), "include": [{"x": 5}]}
    assert expand(raw) == ([{"x": x, "ops": ["exp", "l_i"], "b": 0} for x in (1, 2, 5)], ("x",))


def test_config_hash_is_canonical() -> None:
    a = config_hash(TOY, {"x": 1, "tiles": [[64, 64]], "plan": "triton-bf16"})
    b = config_hash(TOY, {"plan": "triton-bf16", "tiles": [[64, 64]], "x": 1})
    assert a == b and len(a) == 64
    assert config_hash("attribute", {"x": 1}) != config_hash(TOY, {"x": 1})
    assert config_hash(TOY, {"x": 1}) != config_hash(TOY, {"x": 1.5})


@pytest.mark.parametrize(
    ("raw", "named"),
    [
        ({"sweep": {"name": "t", "kind": TOY, "seed": 3}, "grid": {"x": 1}}, "'seed'"),
        ({"sweep": {"name": "t", "kind": TOY}, "grid": {"x": 1}, "grids": {}}, "'grids'"),
        ({"sweep": {"kind": TOY}, "grid": {"x": 1}}, "name"),
        ({"sweep": {"name": "t"}, "grid": {"x": 1}}, "kind"),
        (_spec({"x": []}), "x is an empty list"),
        (_spec({}), r"\[grid\] is empty"),
        ({"sweep": {"name": "t", "kind": "no_such_module_here:run"}, "grid": {"x": 1}}, "kind"),
        ({"sweep": {"name": "t", "kind": "sweep_toy:nothing"}, "grid": {"x": 1}}, "nothing"),
        ({"sweep": {"name": "t", "kind": "attributes"}, "grid": {"x": 1}}, "attributes"),
        (_spec({"x": [1, -2]}), "x must be >= 0"),  # the toy kind's validate()
        ({**_spec({"x": [1, 2]}), "exclude": [{"y": 1}]}, "'y'"),
        ({**_spec({"x": [1, 2]}), "exclude": [{"x": 5}]}, "matches no config"),
        (_spec({"x": 1, "seed": [1, 2]}, seeds=2), "seeds"),
        (_spec({"x": 1, "status": "a"}), "'status'"),
        (_spec({"x": 1}, seeds=0), "seeds"),
        ({"sweep": {"name": "a", "kind": "attribute"}, "grid": {"plan": ["triton-bf16"], "seqq": 8}}, "'seqq'"),
        ({"sweep": {"name": "a", "kind": "attribute"}, "grid": {"plan": ["triton-bf16", "trition-fp16"]}}, "'plan'"),
        ({"sweep": {"name": "a", "kind": "attribute"}, "grid": {"plan": "pytorch-bf16"}}, "'plan'"),
        ({"sweep": {"name": "a", "kind": "attribute"}, "grid": {"plan": "int8-reference"}}, "has quantizers"),
        ({"sweep": {"name": "a", "kind": "attribute"}, "grid": {"baseline": "triton-bf16"}}, "'baseline'"),
        ({"sweep": {"name": "a", "kind": "attribute"}, "grid": {"heads": 4, "kv_heads": 3}}, "'kv_heads'"),
        ({"sweep": {"name": "a", "kind": "attribute"}, "grid": {"seq": [64, 0]}}, "'seq'"),
    ],
)
def test_bad_specs_fail_before_running_and_name_the_key(raw: dict, named: str, tmp_path: Path) -> None:
    store = tmp_path / "s.db"
    with pytest.raises(SpecError, match=named):
        run_sweep(raw, store, workers=1, progress=False)
    assert not store.exists()  # nothing ran, nothing was created


def test_bad_toml_and_store_paths(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[sweep\nname = 1\n")
    with pytest.raises(SpecError, match="not valid TOML"):
        load_spec(bad)
    with pytest.raises(SpecError, match="cannot read"):
        load_spec(tmp_path / "missing.toml")
    with pytest.raises(ValueError, match="is a folder"):
        run_sweep(_spec({"x": 1}), tmp_path, progress=False)
    with pytest.raises(ValueError, match="does not exist"):
        run_sweep(_spec({"x": 1}), tmp_path / "no" / "s.db", progress=False)
    with pytest.raises(ValueError, match="workers"):
        run_sweep(_spec({"x": 1}), tmp_path / "s.db", workers=0, progress=False)


# -- runs on a local cluster ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def toy_store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, Path]:
    """A toy sweep run once on 2 workers: 3 x values x 2 seeds, one config whose worker dies on its first
    attempt (guarded by a marker file) and one that raises."""
    d = tmp_path_factory.mktemp("sweep")
    marker = d / "crashed"
    raw = {
        "sweep": {"name": "toy", "kind": TOY, "seeds": 2},
        "grid": {"x": [1, 2, 3], "a": 2.0},
        "include": [{"x": 7, "crash_marker": str(marker)}, {"x": 8, "fail": True}],
    }
    store = d / "runs.db"
    res = run_sweep(raw, store, workers=2, progress=False)
    assert marker.exists()  # the worker did die once
    assert (res.total, res.failed) == (10, 2) and res.ok + res.lost == 8, res.summary()
    if res.lost:  # the dead worker's run is retried by Dask; one it gave up on is retried by a rerun
        res = run_sweep(raw, store, workers=2, progress=False)
        assert res.lost == 0 and res.ok + res.skipped == 10, res.summary()
    return store, raw, marker


def test_one_row_per_config_and_worker_death_retried(toy_store: tuple[Path, dict, Path]) -> None:
    store, raw, _ = toy_store
    df = load(store)
    spec = load_spec(raw)
    assert sorted(df["config_hash"]) == sorted(spec.hashes())  # one row per config, nothing more
    ok = df[df["status"] == "ok"]
    assert len(ok) == 8 and ok["error"].isna().all()
    assert (ok["y"] == ok["a"].fillna(2.0) * ok["x"] + ok["seed"]).all()
    crashed = ok[ok["x"] == 7]
    assert len(crashed) == 2  # both seeds of the crashing config, the first retried by Dask on a new worker
    failed = df[df["status"] == "failed"]
    assert len(failed) == 2 and failed["error"].str.contains("toy failure for x=8").all()
    assert failed["y"].isna().all()
    for col in ("start", "end", "wall_s"):
        assert (df[col] >= 0).all()
    assert (df["end"] >= df["start"]).all()
    assert set(df["python"]) == {".".join(map(str, sys.version_info[:3]))}
    assert df["numpy"].notna().all() and df["numba"].notna().all() and df["hostname"].notna().all()
    assert set(df.attrs["config_columns"]) == {"x", "a", "seed", "crash_marker", "fail"}
    assert {"y", "y2", "label", "pid"} <= set(df.attrs["metric_columns"])


def test_rerun_skips_finished_and_failed_runs(toy_store: tuple[Path, dict, Path]) -> None:
    store, raw, _ = toy_store
    before = load(store)
    res = run_sweep(raw, store, workers=1, progress=False)
    assert (res.skipped, res.ok, res.failed) == (10, 0, 0) and res.complete is False  # 2 failed rows remain
    after = load(store)
    assert after[["config_hash", "start"]].equals(before[["config_hash", "start"]])


def test_report_writes_tables_and_plots(toy_store: tuple[Path, dict, Path], tmp_path: Path) -> None:
    from simfloat.cli import main

    store, _, _ = toy_store
    out = tmp_path / "rep"
    assert main(["report", "--store", str(store), "--out", str(out), "--by", "x", "--metric", "y"]) == 0
    assert {p.name for p in out.iterdir()} == {"y.csv", "y.png", "report.md"}
    import pandas as pd

    t = pd.read_csv(out / "y.csv")
    assert list(t.columns) == ["x", "mean", "std", "min", "max", "count"]
    assert t["x"].tolist() == [1, 2, 3, 7]  # x = 8 failed: left out
    assert t["mean"].tolist() == [2.0 * x + 0.5 for x in (1, 2, 3, 7)]  # y = a x + seed, seeds 0 and 1
    assert t["count"].tolist() == [2, 2, 2, 2]
    md = (out / "report.md").read_text()
    assert "## y" in md and "| x | mean | std | min | max | count |" in md and "2 failed" in md
    rep = report(store, tmp_path / "all", plots=False)
    assert rep.by == ["x", "crash_marker"] and "y2" in rep.metrics and "pid" in rep.metrics
    with pytest.raises(ValueError, match="'nope'"):
        report(store, tmp_path / "bad", by=["nope"])
    with pytest.raises(ValueError, match="'label'"):
        report(store, tmp_path / "bad", metrics=["label"])


def test_retry_failed_replaces_the_failed_rows(toy_store: tuple[Path, dict, Path]) -> None:
    store, raw, _ = toy_store
    before = load(store).set_index("config_hash")
    res = run_sweep(raw, store, workers=1, progress=False, retry_failed=True)
    assert (res.skipped, res.ok, res.failed) == (8, 0, 2)
    after = load(store).set_index("config_hash")
    assert sorted(after.index) == sorted(before.index)
    again = after[after["status"] == "failed"].index
    assert (after.loc[again, "start"] > before.loc[again, "start"]).all()


def _rows(store: Path) -> int:
    if not store.exists():
        return 0
    try:
        with sqlite3.connect(store, timeout=5) as db:
            return db.execute("SELECT count(*) FROM runs").fetchone()[0]
    except sqlite3.OperationalError:  # the table is not made yet
        return 0


def _client(spec: Path, store: Path, cwd: Path) -> subprocess.Popen:
    """``simfloat sweep SPEC --store STORE --workers 1`` in a subprocess, in a session of its own."""
    env = dict(
        os.environ,
        PYTHONUNBUFFERED="1",
        PYTHONPATH=os.pathsep.join([str(ROOT), str(TESTS), os.environ.get("PYTHONPATH", "")]),
    )
    cmd = [sys.executable, "-m", "simfloat.cli", "sweep", str(spec), "--store", str(store), "--workers", "1"]
    return subprocess.Popen(
        cmd,
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=sigint.restore,
    )


def _wait_rows(proc: subprocess.Popen, store: Path, more_than: int) -> None:
    deadline = time.monotonic() + 120
    while _rows(store) <= more_than:
        assert proc.poll() is None, proc.stdout.read()
        assert time.monotonic() < deadline, "no run committed within 120 s"
        time.sleep(0.05)


def _reap(proc: subprocess.Popen) -> None:
    try:  # the client's worker processes, in its session, if any outlive it
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(10)


@pytest.mark.skipif(sys.platform == "win32", reason="SIGINT / SIGKILL to a subprocess are POSIX")
def test_ctrl_c_then_sigkill_of_the_client_mid_sweep_resume_without_duplicates(tmp_path: Path) -> None:
    n = 10
    spec = tmp_path / "slow.toml"
    spec.write_text(f'[sweep]\nname = "slow"\nkind = "{TOY}"\n[grid]\nx = {list(range(n))}\nsleep = 0.4\n')
    store = tmp_path / "slow.db"
    proc = _client(spec, store, tmp_path)  # Ctrl-C: stops, says so, exit status 130, keeps what finished
    try:
        _wait_rows(proc, store, 0)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    finally:
        _reap(proc)
    assert proc.returncode == 130, out
    assert "sweep slow: interrupted" in out
    after_int = _rows(store)
    assert 1 <= after_int < n
    proc = _client(spec, store, tmp_path)  # kill -9 of the client once it has committed another run
    try:
        _wait_rows(proc, store, after_int)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        _reap(proc)
    kept = _rows(store)
    assert after_int < kept < n, "the client was to be killed mid-sweep"
    first = load(store)[["config_hash", "start"]]
    res = run_sweep(spec, store, workers=2, progress=False)
    assert res.skipped == kept and res.ok == n - kept and res.complete
    df = load(store)
    assert len(df) == n and df["config_hash"].is_unique
    assert sorted(df["x"]) == list(range(n))
    assert sorted(df["config_hash"]) == sorted(load_spec(spec).hashes())
    merged = first.merge(df[["config_hash", "start"]], on="config_hash", suffixes=("_before", "_after"))
    assert len(merged) == kept and (merged["start_before"] == merged["start_after"]).all()  # nothing rerun


def test_cli_sweep_prints_counts_and_refuses_bad_specs(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from simfloat.cli import main

    spec = tmp_path / "bad.toml"
    spec.write_text('[sweep]\nname = "b"\nkind = "sweep_toy:run"\nsedes = 2\n[grid]\nx = [1]\n')
    assert main(["sweep", str(spec), "--store", str(tmp_path / "b.db")]) == 2
    assert "unknown key 'sedes'" in capsys.readouterr().err
    assert main(["report", "--store", str(tmp_path / "none.db")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_import_simfloat_does_not_import_dask() -> None:
    code = (
        "import sys, simfloat, simfloat.sweep, simfloat.cli; simfloat.cli.build_parser(); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('dask', 'distributed')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.replace("'", '"')) == []


# -- the built-in attribute kind ------------------------------------------------------------------------------


def test_attribute_kind_metrics_match_attribute(monkeypatch: pytest.MonkeyPatch) -> None:
    import simfloat.attribution
    from simfloat.sweep.kinds import attribute

    seen = {}
    real = simfloat.attribution.attribute

    def spy(*args: object, **kwargs: object) -> object:
        seen["args"], seen["kwargs"] = args, kwargs
        seen["res"] = real(*args, **kwargs)
        return seen["res"]

    monkeypatch.setattr(simfloat.attribution, "attribute", spy)
    config = {"quick": True, "seq": 33, "head_dim": 8, "heads": 1, "plan": "triton-bf16", "ops": ["exp", "l_i"]}
    config |= {"tiles": [[8, 16]], "block_ns": [16], "seed": 3, "dist": "uniform"}
    m = attribute(config)
    q = seen["args"][0]
    assert q.shape == (1, 1, 33, 8) and seen["kwargs"]["block_m"] == 16 and seen["kwargs"]["trace"] is False
    res = seen["res"]
    fvb = res.flash_vs_baseline.set_index("kernel")
    assert m["flash_max_abs"] == fvb.loc["flash", "max_abs"] and m["baseline_rms"] == fvb.loc["baseline", "rms"]
    assert m["ratio_max"] == fvb.loc["flash", "ratio_max"]
    iso = res.isolation.set_index("op")
    assert m["iso_exp_max_abs"] == iso.loc["exp", "max_abs"] and m["iso_l_i_rms"] == iso.loc["l_i", "rms"]
    abl = res.ablation.set_index("op")
    assert m["abl_l_i_max_abs"] == abl.loc["l_i", "max_abs"] and m["ref_rms"] == abl.loc["all", "rms"]
    assert m["tile_8x16_max_abs"] == res.tiles["max_abs"].iloc[0]
    assert m["steps_16_rms"] == res.steps["rms"].iloc[0]
    assert m["baseline_plan"] == "pytorch-bf16" and m["runs"] == res.meta["runs"]
    assert not any(k.startswith("iso_qk") for k in m)  # only the ops asked for
