"""tensor_core presets against an independent lab's GPU measurements (Khattak & Mikaitis, arXiv 2512.07004;
tests/fixtures/tensor_cores, with its licence and provenance): every row of every output, bit for bit, through
``dot`` (the scalar reference) and ``matmul`` (the vector engine). The presets are the instruction table's;
each data set names its GPU's arch and the instruction its kernel ran (``wmma::mma_sync`` and the fp8
``mma.sync`` both issue mma.sync)."""

from __future__ import annotations

import numpy as np
import pytest
from tensor_core_data import DATA, INSTRUCTION, MANIFEST, bits, dataset, load, rows

from simfloat.accumulate import Chunked, Interleaved, dot, tensor_core

CASES = [(ds["file"], out) for ds in MANIFEST["datasets"] for out in ds["outputs"]]


def _model(name: str, out: str):  # type: ignore[no-untyped-def]
    ds = dataset(name)
    return tensor_core(ds["arch"], ds["input_format"], out_format=out, instruction=INSTRUCTION)


def test_fixture_files_and_provenance() -> None:
    assert (DATA / "LICENCE").read_text().startswith("BSD 2-Clause License")
    assert MANIFEST["commit"] == "b12b5a700957655375a1b0c1d0c26e76065da015"
    assert len(MANIFEST["datasets"]) == 19
    for ds in MANIFEST["datasets"]:
        z = np.load(DATA / ds["file"])
        assert z["a"].shape == z["b"].shape == (ds["rows"], ds["k"])
        assert {f"d_{o}" for o in ds["outputs"]} <= set(z.files)


@pytest.mark.parametrize(("name", "out"), CASES, ids=[f"{n[:-4]}-{o}" for n, o in CASES])
def test_every_row_bit_for_bit(name: str, out: str) -> None:
    model = _model(name, out)
    a, b, c, want = load(name, out)
    vec = rows(model, a, b, c)
    assert int((bits(vec) == want).sum()) == len(want)
    ref = np.array([dot(a[i], b[i], float(c[i]), acc=model) for i in range(len(want))])
    assert int((bits(ref) == want).sum()) == len(want)


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_b200_fp8_mma_sync_is_not_tcgen05(fmt: str) -> None:
    """B200's mma.sync on fp8 adds C after the products' sum (acc_add); its tcgen05 model, which aligns C with
    the products, misses about a third of the rows: the instruction axis is needed."""
    a, b, c, want = load(f"B200_{fmt}.npz", "fp32")
    tc = tensor_core("sm100", fmt)  # the default instruction: tcgen05
    assert tc == tensor_core("sm100", fmt, instruction="tcgen05") and tc.acc_add == "fused"
    got = rows(tc, a, b, c)
    assert 0.5 < float(np.mean(bits(got) == want)) < 0.7
    assert tensor_core("sm100", fmt, instruction="mma.sync").acc_add == "nearest_even"


def test_h100_fp8_outputs_were_measured_with_zero_c() -> None:
    """The manifest's note: H100's fp8 -> fp32 rows fit C = 0 (all of them) and not the file's C (none)."""
    ds = dataset("H100_e4m3.npz")
    z = np.load(DATA / ds["file"])
    a, b, c, want = load(ds["file"], "fp32")
    assert not c.any()
    c_file = z["c"].astype(np.uint32).view(np.float32).astype(np.float64)
    got = rows(_model(ds["file"], "fp32"), a, b, c_file)
    assert int((bits(got) == want).sum()) == 0


@pytest.mark.parametrize("name", ["H100_e4m3.npz", "H100_e5m2.npz", "B200_e4m3.npz", "B200_e5m2.npz"])
def test_fp8_fp16_results_are_two_fp16_steps_then_c(name: str) -> None:
    """H100 / B200 mma.sync fp8 -> fp16: two fp16 k16 steps on the converted operands in the fragment's k order
    (pairs of k alternating), from zero, then C in one fp16 addition. The same steps with C as the first step's
    accumulator, or in plain k order, or C = 0, miss most rows: each part of the model is needed."""
    ds = dataset(name)
    model = _model(name, "fp16")
    assert isinstance(model, Interleaved) and (model.chunk, model.group) == (32, 2)
    step = tensor_core(ds["arch"], "fp16", out_format="fp16", instruction=INSTRUCTION)
    assert model.inner == Chunked(chunk=32, inner=step, outer_fmt="float16", outer_mode="nearest_even")
    a, b, c, want = load(name, "fp16")
    for other in (Interleaved(step, chunk=32, group=2), model.inner):  # C fused in the first step; plain order
        assert float(np.mean(bits(rows(other, a, b, c)) == want)) < 0.8
    assert float(np.mean(bits(rows(model, a, b, 0 * c)) == want)) < 0.01


def test_interleaved_chunked_inner_is_checked() -> None:
    step = tensor_core("sm90", "fp16", out_format="fp16")
    with pytest.raises(ValueError, match="multiple of 32"):
        Interleaved(Chunked(chunk=48, inner=step), chunk=32)
    with pytest.raises(ValueError, match="multiple of 32"):
        Interleaved(Chunked(splits=2, inner=step), chunk=32)
    with pytest.raises(TypeError, match="inner must be a BlockFMA or a Chunked of one"):
        Interleaved(Chunked(chunk=32))  # type: ignore[arg-type]
    m = Interleaved(Chunked(chunk=64, inner=step), chunk=32, group=2)
    assert m.step == step and list(m.order(32)[:4]) == [0, 1, 4, 5]
