"""experiments/golden: the run's config checks, the spec's expansion, a smoke study (resumed) and its figures."""

from __future__ import annotations

import tomllib

import pytest

pd = pytest.importorskip("pandas")
pytest.importorskip("matplotlib")

from experiments.golden import figures, run, study  # noqa: E402

CFG = dict(
    fmt="bf16",
    normalization="per_step",
    l_ij="sequential",
    rounding="nearest_even",
    M=256,
    d=8,
    N=40,
    tiles="fa1",
    rows=8,
    seed=0,
)


def test_validate_names_the_bad_key():
    run.validate(CFG)
    for bad, match in (
        ({**CFG, "fmt": "fp8"}, "'fmt'"),
        ({**CFG, "nope": 1}, "unknown config key"),
        ({k: v for k, v in CFG.items() if k != "M"}, "'M' is missing"),
        ({**CFG, "N": 0}, "'N' must be >= 1"),
        ({**CFG, "d": 8.0}, "'d' must be an int"),
    ):
        with pytest.raises(ValueError, match=match):
            run.validate(bad)


def test_run_metrics_and_tiles():
    out = run.run(CFG)
    assert (out["block_m"], out["block_n"]) == (8, 8)  # fa1_tiles(256, 8)
    assert out["rows_evaluated"] == 8
    assert out["ratio_all"] == out["flash_max_abs"] / out["all_max_abs"]
    assert 0 < out["flash_max_abs"] < 0.1 and 0.9 < out["flash_cos_sim"] <= 1
    assert run.tiles_of({**CFG, "M": 1024, "tiles": "swapped"}) == (32, 8)
    assert run.tiles_of({**CFG, "M": 1024, "tiles": "square"}) == (32, 32)
    once = run.run({**CFG, "l_ij": "fp32_once", "rounding": "toward_zero"})
    assert once["flash_max_abs"] != out["flash_max_abs"]


def test_spec_expands_and_validates():
    with study.SPEC.open("rb") as fh:
        spec = tomllib.load(fh)
    configs = study.expand(spec)
    assert len(configs) == len({study.config_hash(c) for c in configs})
    for c in configs:
        run.validate(c)
    assert {c["tiles"] for c in configs} == {"fa1", "swapped", "square"}
    assert {c["seed"] for c in configs} == set(range(5)) and configs[0]["seed"] == 0 and configs[-1]["seed"] == 4
    small = {"sweep": {"kind": "x:y", "seeds": [5]}, "grid": {"a": [1, 2], "b": 3}, "exclude": [{"a": 2}]}
    assert study.expand(small) == [{"a": 1, "b": 3, "seed": 5}]
    small["include"] = [{"a": 7, "b": [4, 5]}]
    assert study.expand(small) == [
        {"a": 1, "b": 3, "seed": 5},
        {"a": 7, "b": 4, "seed": 5},
        {"a": 7, "b": 5, "seed": 5},
    ]
    with pytest.raises(ValueError, match="'a' has an empty list"):
        study.expand({"sweep": {}, "grid": {"a": []}})
    with pytest.raises(ValueError, match="no config"):
        study.expand({"sweep": {}, "grid": {"a": 1}, "exclude": [{"a": 1}]})


def test_smoke_study_resumes_and_plots(tmp_path, capsys):
    csv = tmp_path / "g.csv"
    assert study.main(["--smoke", "--csv", str(csv), "--limit", "5"]) == 0
    assert len(pd.read_csv(csv)) == 5
    assert study.main(["--smoke", "--csv", str(csv)]) == 0  # resumes: the first 5 are skipped
    df = pd.read_csv(csv)
    assert len(df) == len(set(df["config_hash"])) == 48
    assert "43 runs of 48 configs (5 already done)" in capsys.readouterr().out
    assert figures.main(["--csv", str(csv), "--out", str(tmp_path), "--all-rows"]) == 0
    for name in ("fig3_format", "fig4_seq", "fig5_tiles", "fig6_swap"):
        assert (tmp_path / f"{name}.png").read_bytes()[:4] == b"\x89PNG"
        assert len(pd.read_csv(tmp_path / f"{name}.csv")) > 0
    claims = pd.read_csv(tmp_path / "claims.csv")
    assert len(claims) == 2 * 2 * 2 and set(claims["baseline"]) == {"pytorch", "all"}
    cov = pd.read_csv(tmp_path / "coverage.csv")
    assert cov["complete"].all() and cov["runs"].sum() == 48
    assert set(claims["N_tiles"]) == set(claims["N_swap"]) == {40}


def test_first_filters_order_the_runs_and_nothing_else():
    configs = study.expand({"sweep": {"seeds": 2}, "grid": {"M": [1, 2, 3], "N": [10, 20], "t": "a"}})
    first = [study.parse_filter("M=2"), study.parse_filter("N=20,M=1|3")]
    assert first[1] == {"N": [20], "M": [1, 3]}
    out = study.prioritize(configs, first)
    assert sorted(map(study.config_hash, out)) == sorted(map(study.config_hash, configs))
    key = [(c["M"], c["N"], c["seed"]) for c in out]
    assert key[:4] == [(2, 10, 0), (2, 20, 0), (2, 10, 1), (2, 20, 1)]  # grid order (seed outermost) within
    assert key[4:8] == [(1, 20, 0), (3, 20, 0), (1, 20, 1), (3, 20, 1)]
    assert key[8:] == [(1, 10, 0), (3, 10, 0), (1, 10, 1), (3, 10, 1)]
    assert study.prioritize(configs, []) == configs
    with pytest.raises(ValueError, match="unknown key"):
        study.prioritize(configs, [{"Q": [1]}])
    for bad in ("M", "M=", "=2", "M=1|"):
        with pytest.raises(ValueError, match="KEY=V"):
            study.parse_filter(bad)


def test_a_partial_grid_is_reported_and_the_tile_claims_use_a_complete_n():
    rows = [
        {"N": n, "M": m, "tiles": "fa1", "seed": 0, "config_hash": f"{n}-{m}"}
        for n, ms in ((256, (1, 2, 3)), (4096, (1, 2, 3)), (16384, (2,)))
        for m in ms
    ]
    df = pd.DataFrame(rows)
    assert figures._largest_n_with(df, "M", [1, 2, 3]) == 4096
    assert figures._largest_n_with(df, "M", [2]) == 16384
    want = rows + [{"N": 16384, "M": m, "tiles": "fa1", "seed": s} for m in (1, 2, 3) for s in (1, 2)]
    cov = figures.coverage(df, want).set_index(["N", "M"])
    assert cov.loc[(16384, 2), ["runs", "configs", "complete"]].tolist() == [1, 3, False]
    assert cov.loc[(16384, 1), ["runs", "configs", "complete"]].tolist() == [0, 2, False]
    assert cov.loc[(4096, 1), "complete"] and cov.loc[(256, 3), "complete"]


def test_the_spec_runs_through_simfloat_sweep_as_the_study_ran_it():
    """`simfloat sweep experiments/golden/spec.toml` expands to exactly the configs (and hashes-worth of
    content) of the committed study, so the sweep reruns nothing the loop finished and misses nothing."""
    import json

    from simfloat.sweep.spec import load_spec

    with open(study.SPEC, "rb") as fh:
        loop = study.expand(tomllib.load(fh))
    swept = load_spec(study.SPEC).configs
    key = lambda c: json.dumps(c, sort_keys=True)  # noqa: E731
    assert sorted(map(key, swept)) == sorted(map(key, loop))
