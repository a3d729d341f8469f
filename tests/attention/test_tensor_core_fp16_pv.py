"""Plans whose P.V accumulates in fp16 on the tensor cores (``tensor_core(arch, "fp16", out_format="fp16")``,
as SageAttention's P.V on some GPUs): the flash and the quantized-flash plans take the model, and both engines
give the same bits (the vector row kernels run it: ``MMA.fast``)."""

from __future__ import annotations

import numpy as np
import pytest

import simfloat as sf
from simfloat.accumulate import tensor_core
from simfloat.accumulate._rows import mma
from simfloat.attention import flash, plan
from simfloat.attention.quant_plan import EXACT, Quant
from simfloat.attention.quantized import quant_flash


def _qkv(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    q, k, v = (sf.round(rng.standard_normal((1, 2, 70, 32)), "float16") for _ in range(3))
    return q, k, v


def _bits_equal(x: np.ndarray, y: np.ndarray) -> bool:
    return bool(np.array_equal(np.asarray(x, np.float64).view(np.uint64), np.asarray(y, np.float64).view(np.uint64)))


@pytest.mark.parametrize("arch", ["sm70", "sm80", "sm89", "sm90", "sm120"])
@pytest.mark.parametrize(("causal", "bm", "bn"), [(False, 64, 64), (True, 32, 16)])
def test_flash_with_fp16_accumulating_pv(arch: str, causal: bool, bm: int, bn: int) -> None:
    pv = tensor_core(arch, "fp16", out_format="fp16")
    assert mma(pv).fast  # the row kernels' own form, not the per-output reference
    q, k, v = _qkv(0)
    base = plan("triton-fp16")
    pl = base.replace(pv=pv, acc="fp16")  # the accumulator the MMA reads and writes is fp16
    kw = dict(causal=causal, block_m=bm, block_n=bn)
    ref = flash(q, k, v, plan=pl, engine="reference", **kw)
    vec = flash(q, k, v, plan=pl, engine="vector", **kw)
    assert _bits_equal(ref, vec)
    assert (vec != flash(q, k, v, plan=base, **kw)).mean() > 0.2  # fp16 accumulation: most outputs move


@pytest.mark.parametrize("pv_update", ["into_acc", "two_level"])
def test_quantized_flash_with_fp16_accumulating_pv(pv_update: str) -> None:
    """SageAttention-1-like: INT8 Q, K per block, fp16 V and P, P.V accumulated in fp16 (Ada)."""
    blk = Quant("int", "per-block", pre="float32")
    f16 = Quant("float", "unscaled", fmt="float16")
    pv = tensor_core("sm89", "fp16", out_format="fp16")
    qp = plan("half-int8").replace(
        name="sage1-fp16-pv",
        q_quant=blk,
        k_quant=blk,
        v_quant=f16,
        p_quant=f16,
        qk=EXACT,
        pv=pv,
        pv_update=pv_update,
        acc="float16",
    )
    q, k, v = _qkv(1)
    ref = quant_flash(q, k, v, plan=qp, engine="reference", block_m=32, block_n=32)
    vec = quant_flash(q, k, v, plan=qp, engine="vector", block_m=32, block_n=32)
    assert _bits_equal(ref, vec)
    fp32_pv = qp.replace(name="fp32-pv", pv=tensor_core("sm89", "fp16"), acc="float32")
    assert (vec != quant_flash(q, k, v, plan=fp32_pv, block_m=32, block_n=32)).any()
