"""tl.dot of fp8 on sm_90 with M < 64 (mma.sync on operands converted to fp16): simfloat.accumulate.fp8_mma_sync,
an Interleaved model (k in alternating pairs across the two k16 steps of each 32-wide chunk) over the fp16
preset, against the H200 probe e4m3_16_32_32 (tests/fixtures/gpu/h200/probes/probes.npz, read as
simfloat_gpu.campaign.fit reads
it), on both engines; the reordering itself against an explicit permutation; and its argument errors."""

from pathlib import Path

import numpy as np
import pytest

from simfloat.accumulate import (
    BlockFMA,
    Interleaved,
    Sequential,
    acc_params,
    dot,
    fp8_mma_sync,
    matmul,
    tensor_core,
)

PROBES = Path(__file__).resolve().parents[1] / "fixtures" / "gpu" / "h200" / "probes" / "probes.npz"


def _probe(name):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    if not PROBES.exists():
        pytest.skip(f"no probe file {PROBES}")
    z = np.load(PROBES)
    key = f"dot_{name}__"
    if key + "a_bits" not in z.files:
        pytest.skip(f"probe {name} not recorded in {PROBES.name}")

    def decode(bits):
        return bits.astype(np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)

    a, b = decode(z[key + "a_bits"]), decode(z[key + "b_bits"])  # (T, M, K), (T, K, N)
    return a, b, z[key + "c0"].astype(np.float64), z[key + "c"].astype(np.float64), str(z[key + "mma"][0])


def _agreement(model, a, b, c0, c, engine):
    eq = [matmul(a, b, cin, acc=model, engine=engine) == c[i] for i, cin in enumerate((np.zeros_like(c0), c0))]
    return float(np.mean(eq))


@pytest.mark.parametrize("engine", ["vector", "reference"])
def test_fp8_mma_sync_reproduces_the_h200_probe(engine):
    a, b, c0, c, mma = _probe("e4m3_16_32_32")
    assert "mma.sync" in mma and "f16" in mma  # the probe is the fp16 mma.sync path this model is for
    assert _agreement(fp8_mma_sync(), a, b, c0, c, engine) == 1.0
    # the fp16 preset in plain k order (the earlier model) and the fp8 preset do not
    assert _agreement(tensor_core("sm90", "fp16"), a, b, c0, c, engine) < 0.99
    assert _agreement(tensor_core("sm90", "e4m3"), a, b, c0, c, engine) < 0.5


def test_order_is_alternating_pairs_per_chunk():
    m = fp8_mma_sync()
    one = [
        0,
        1,
        4,
        5,
        8,
        9,
        12,
        13,
        16,
        17,
        20,
        21,
        24,
        25,
        28,
        29,
        2,
        3,
        6,
        7,
        10,
        11,
        14,
        15,
        18,
        19,
        22,
        23,
        26,
        27,
        30,
        31,
    ]
    assert m.order(32).tolist() == one
    assert m.order(64).tolist() == one + [32 + i for i in one]
    m4 = Interleaved(BlockFMA(8, 25), chunk=32, group=4)  # 4 steps of 8
    assert m4.order(32)[:8].tolist() == [0, 1, 2, 3, 16, 17, 18, 19]


@pytest.mark.parametrize("k", [32, 96])
@pytest.mark.parametrize("engine", ["vector", "reference"])
def test_interleaved_is_the_inner_model_on_reordered_k(engine, k):
    rng = np.random.default_rng(k)
    a = np.ldexp(rng.standard_normal((3, 7, k)).astype(np.float16), rng.integers(-12, 12, (3, 7, k)))
    b = rng.standard_normal((k, 5)).astype(np.float16).astype(np.float64)
    a = a.astype(np.float64)
    c = rng.standard_normal((3, 7, 5)).astype(np.float32).astype(np.float64)
    model = fp8_mma_sync()
    o = model.order(k)
    got = matmul(a, b, c, acc=model, engine=engine)
    want = matmul(np.ascontiguousarray(a[..., o]), np.ascontiguousarray(b[o]), c, acc=model.inner, engine="reference")
    np.testing.assert_array_equal(got, want)
    assert dot(a[0, 0], b[:, 0], float(c[0, 0, 0]), acc=model) == want[0, 0, 0]


def test_interleaved_errors():
    with pytest.raises(ValueError, match="K = 48 is not a multiple of chunk = 32"):
        matmul(np.ones((2, 48)), np.ones((48, 2)), acc=fp8_mma_sync())
    with pytest.raises(TypeError, match="Interleaved model reorders k"):
        acc_params(fp8_mma_sync())
    with pytest.raises(TypeError, match="inner must be a BlockFMA"):
        Interleaved(Sequential("fp32"))
    with pytest.raises(ValueError, match="to divide chunk"):
        Interleaved(BlockFMA(16, 25), chunk=24)
    with pytest.raises(ValueError, match="chunk must be a positive int"):
        Interleaved(BlockFMA(16, 25), chunk=0)
    with pytest.raises(ValueError, match="only arch 'sm90'"):
        fp8_mma_sync("sm80")


def test_gpu_fit_singles_it_out_on_the_probe():
    """simfloat_gpu.campaign.fit (the fitting tool run on a GPU's probes.npz) lists the model and picks it for this
    probe."""
    _probe("e4m3_16_32_32")  # skips without the fixture
    from simfloat_gpu.campaign import fit

    v = fit.probe_variants(np.load(PROBES), "dot")["e4m3_16_32_32"]
    res = fit.fit_dot("e4m3_16_32_32", v, coarse_rows=256, log=lambda m: None)
    assert res["best"].startswith("fp8_mma_sync") and res["agreement"] == 1.0, res
