"""GGUF block-quantized weights kept quantized (engine/quant_gguf.py, kernels/qgemv.c): the packed weights are the
file's blocks, the matmul is close to the dequantized reference, every row's bits are independent of the call (and
of the instruction set), and greedy speculation on a quantized target is token-identical to its plain decoding."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from specledger.engine import kernels, quant_gguf
from specledger.engine.decode import Engine
from specledger.engine.drafters.ngram import NgramDrafter
from specledger.engine.layers import Linear
from specledger.engine.quant_gguf import QuantEmbedding, QuantLinear, quantize_blocks, quantize_model
from specledger.engine.sampling import SamplingParams
from specledger.errors import SpecLedgerError
from tests.conftest import tiny_model

pytestmark = pytest.mark.skipif(kernels.lib() is None, reason=f"native kernel unavailable: {kernels.status()}")
FORMATS = ("Q8_0", "Q4_0", "Q4_1")


def _reference(blocks: np.ndarray, fmt: str, n: int, k: int) -> torch.Tensor:
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    return torch.from_numpy(dequantize(blocks, GGMLQuantizationType[fmt]).reshape(n, k))


@pytest.mark.parametrize("fmt", FORMATS)
def test_packed_weight_dequantizes_to_gguf_reference_and_keeps_file_bytes(fmt):
    torch.manual_seed(0)
    n, k = 37, 96  # a partial group of 16 outputs, three blocks
    blocks = quantize_blocks(torch.randn(n, k), fmt)
    lin = QuantLinear(fmt, blocks, n, k)
    torch.testing.assert_close(lin.weight, _reference(blocks, fmt, n, k), rtol=0, atol=1e-6)
    assert lin.packed.numel() == 64 * (k // 32) * quant_gguf.BLOCK_BYTES[fmt]  # 64 = 37 rounded up to 32s
    rows = torch.tensor([[36, 0], [5, 5]])
    assert torch.equal(lin.dequantize_rows(rows), lin.weight[rows])


@pytest.mark.parametrize("fmt", FORMATS)
def test_matmul_is_close_to_the_dequantized_weights(fmt):
    torch.manual_seed(1)
    n, k = 200, 576
    w, b = torch.randn(n, k), torch.randn(n)
    blocks = quantize_blocks(w, fmt)
    lin = QuantLinear(fmt, blocks, n, k, b)
    x = torch.randn(6, k)
    ref = x @ _reference(blocks, fmt, n, k).T + b
    rel = ((lin(x) - ref).norm() / ref.norm()).item()
    assert rel < 0.02  # the activation rows' own 8-bit blocks: ~0.5 % here
    assert lin(x[None]).shape == (1, 6, n)


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_row_is_bit_identical_whatever_shares_the_call(fmt):
    torch.manual_seed(2)
    n, k = 72, 160
    lin = QuantLinear(fmt, quantize_blocks(torch.randn(n, k), fmt), n, k, torch.randn(n))
    x = torch.randn(19, k) * torch.logspace(-2, 2, 19)[:, None]  # rows of very different scales
    full = lin(x)
    for i in range(19):
        assert torch.equal(lin(x[i : i + 1]), full[i : i + 1])
    for lo, hi in ((0, 8), (3, 12), (5, 19), (17, 19)):  # groups of 8 rows, remainders, shifted positions
        assert torch.equal(lin(x[lo:hi]), full[lo:hi])
    r = torch.randn(19, n)
    assert torch.equal(lin.fused_add(x, r), r + full)


def _build_variant(tmp: Path, march: str) -> ctypes.CDLL:
    src = Path(kernels.__file__).parent
    out = tmp / f"q-{march}.so"
    cc = shutil.which("cc") or shutil.which("gcc")
    subprocess.run([cc, "-O3", f"-march={march}", "-ffp-contract=fast", "-fopenmp", "-fPIC", "-shared",
                    str(src / "qgemv.c"), "-o", str(out), "-lm"], check=True, capture_output=True, timeout=120)
    lib = ctypes.CDLL(str(out))
    p, i = ctypes.c_void_p, ctypes.c_int
    lib.specledger_qpack.argtypes = [i, p, p, i, i]
    lib.specledger_qlinear.argtypes = [i, p, p, p, p, p, i, i, i, i]
    lib.specledger_qpath.restype = ctypes.c_char_p
    return lib


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler")
@pytest.mark.parametrize("march", ["haswell", "x86-64"])
def test_avx2_and_portable_paths_give_the_native_bits(tmp_path, march):
    if " avx2" not in kernels._cpu_flags() and march == "haswell":
        pytest.skip("this CPU cannot run AVX2 code")
    if kernels.platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("x86 variants")
    lib = _build_variant(tmp_path, march)
    assert lib.specledger_qpath().decode() == ("avx2" if march == "haswell" else "portable")
    torch.manual_seed(3)
    n, k, m = 40, 128, 5
    x = torch.randn(m, k)
    for fmt in FORMATS:
        native = QuantLinear(fmt, quantize_blocks(torch.randn(n, k), fmt), n, k)
        packed = torch.empty_like(native.packed)
        raw = torch.as_tensor(quantize_blocks(native.weight, fmt))  # the same values, re-quantized exactly
        lib.specledger_qpack(native.kind, raw.data_ptr(), packed.data_ptr(), n, k)
        assert torch.equal(packed, native.packed)
        y = torch.empty(m, n)
        lib.specledger_qlinear(native.kind, x.data_ptr(), packed.data_ptr(), None, None, y.data_ptr(), m, n, k, 1)
        assert torch.equal(y, native(x)), fmt


def test_unsupported_block_format_is_a_one_line_error_naming_the_supported():
    with pytest.raises(SpecLedgerError, match="Q5_K has no native kernel; supported: Q8_0, Q4_0, Q4_1"):
        QuantLinear("Q5_K", np.zeros(0, np.uint8), 16, 256)


def test_a_group_in_an_unsupported_format_falls_back_to_float32_and_is_reported():
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    torch.manual_seed(4)
    w = torch.randn(8, 64)
    tensors = [SimpleNamespace(name="a", tensor_type=SimpleNamespace(name="Q5_0"), shape=[64, 8],
                               data=quantize(w.numpy(), GGMLQuantizationType.Q5_0)),
               SimpleNamespace(name="b", tensor_type=SimpleNamespace(name="Q8_0"), shape=[64, 8],
                               data=quantize_blocks(w, "Q8_0"))]
    report = quant_gguf.QuantReport()
    mixed = quant_gguf._group(SimpleNamespace(tensors=tensors), ["a", "b"], [None, None], report, "blk.0.x", None)
    assert isinstance(mixed, Linear) and mixed.weight.shape == (16, 64)
    assert torch.equal(mixed.weight[:8], _reference(tensors[0].data, "Q5_0", 8, 64))  # the file's values
    only_q8 = quant_gguf._group(SimpleNamespace(tensors=tensors), ["b"], [None], report, "blk.0.y", None)
    assert isinstance(only_q8, QuantLinear)
    assert report.fallback == ["blk.0.x (Q5_0/Q8_0)"] and report.kept == {"Q8_0": 1}
    assert report.label == "gguf:q8_0+f32" and "dequantized to float32" in report.line()


def _quantized_tiny(fmt: str, tied: bool = False):
    model = tiny_model(5, vocab=96, n_layers=2, dim=64)
    if tied:
        model.config.tie_embeddings = True
        model.lm_head.weight = model.embed.weight
    return quantize_model(model, fmt)


@pytest.mark.parametrize("fmt", FORMATS)
def test_verify_rows_and_packed_batches_equal_plain_steps_bit_for_bit(fmt):
    model = _quantized_tiny(fmt)
    assert all(isinstance(b.wqkv, QuantLinear) for b in model.layers) and isinstance(model.lm_head, QuantLinear)
    tokens = torch.tensor([[3, 17, 5, 60, 2, 9, 41, 11]])
    with torch.inference_mode():
        cache = model.new_cache(32)
        model(tokens[:, :4], 0, cache)
        verify = model(tokens[:, 4:], 4, cache)  # one 4-row pass (the native stack)
        cache2 = model.new_cache(32)
        model(tokens[:, :4], 0, cache2)
        steps = [model(tokens[:, i : i + 1], i, cache2) for i in range(4, 8)]
    for i, step in enumerate(steps):
        assert torch.equal(verify[:, i : i + 1], step)


@pytest.mark.parametrize("fmt", FORMATS)
def test_greedy_speculation_on_a_quantized_target_is_token_identical(fmt):
    model = _quantized_tiny(fmt, tied=fmt == "Q8_0")
    if fmt == "Q8_0":
        assert isinstance(model.embed, QuantEmbedding) and model.embed.table is model.lm_head
    engine = Engine(model, max_context=512, name="tiny", dtype=fmt.lower())
    params = SamplingParams(temperature=0.0)
    prompts = [[1, 2, 3, 1, 2, 3, 1, 2], [7, 7, 8, 9, 40, 41, 7, 7, 8], list(range(10, 40))]
    for prompt in prompts:
        plain = engine.generate(prompt, max_tokens=40, params=params, ignore_eos=True)
        for gamma in (1, 4, 7):
            spec = engine.generate(prompt, drafter=NgramDrafter(), gamma=gamma, max_tokens=40, params=params,
                                   ignore_eos=True)
            assert spec.token_ids == plain.token_ids
        tree = engine.generate(prompt, drafter=NgramDrafter(), gamma=3, tree_budget=6, max_tokens=40, params=params,
                               ignore_eos=True)
        assert tree.token_ids == plain.token_ids


def test_quantized_model_reads_the_block_bytes_per_token():
    fp32 = tiny_model(5, vocab=96, n_layers=2, dim=64)
    before = fp32.weight_bytes()
    q = quantize_model(fp32, "Q4_1")
    per_weight = 20 / 32  # Q4_1: 20 bytes per 32 weights
    linear_weights = sum(b.wqkv.in_features * b.wqkv.out_features + 64 * 64 + 64 * 256 + 128 * 64 for b in q.layers)
    linear_weights += 96 * 64
    norms = (2 * 2 + 1) * 64 * 4
    assert q.weight_bytes() == pytest.approx(linear_weights * per_weight + norms, rel=0.01)
    assert q.weight_bytes() < before / 4


def test_four_way_on_a_block_quantized_target_names_its_own_reference(tmp_path):
    from specledger.bench.quantization import run_quantization
    from tests.test_quantization import tiny_engine, workload_items

    result = run_quantization(tiny_engine(), workload_items(tmp_path), drafter="ngram", gamma=3, max_tokens=16,
                              out_dir=tmp_path / "run", n_resamples=50, quant="q8_0")
    assert [s["key"] for s in result["settings"]] == ["fp32-plain", "q8_0-plain", "fp32-spec", "q8_0-spec"]
    assert result["quant_dtype"] == "q8_0" and result["correctness"]["spec_q8_0_vs_q8_0_plain"]["all_identical"]
    terms = result["terms"]
    assert terms["q8_0"]["weight_bytes"] < terms["fp32"]["weight_bytes"] / 3
    assert terms["q8_0"]["verify_rows"] > 1 and terms["fp32"]["verify_premium"] > 0
    assert any("Why they do not multiply" in line for line in result["statements"])


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("rows", [1, 2, 5])  # 1 and 2: the decode layer (one barrier per norm + matmul), 5: shared
def test_one_native_call_per_stack_equals_the_per_op_path(fmt, rows):
    from specledger.engine import native_rows

    model = _quantized_tiny(fmt)
    x = torch.randn(rows, 64)
    slots, pos = torch.zeros(rows, dtype=torch.long), torch.arange(3, 3 + rows)
    with torch.inference_mode():
        model._ensure_rope()
        _, cos, sin = model._rope_cache
        c1, c2 = model.new_cache(16), model.new_cache(16)
        fused = native_rows.run_layers(model, x, c1.kv, slots, pos, 0)  # ops.c's stack, quantizing in its passes
        per_op = x
        for i, block in enumerate(model.layers):
            per_op = native_rows.block_rows(block, per_op, c2.kv[i], slots, pos, cos, sin, False)
    assert torch.equal(fused, per_op) and torch.equal(c1.kv, c2.kv)


@pytest.mark.real_model
def test_bundled_gguf_kept_quantized_speculates_token_identically():
    from specledger.engine.build import build_engine

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        engine = build_engine(None, "gguf")  # load_quantized checks every linear against the dequantized weights
        assert engine.dtype == "gguf:q4_1+q8_0" and engine.loaded.weights_note.startswith("weights kept quantized")
        assert engine.model.weight_bytes() < 100e6  # vs 538 MB in float32
        params = SamplingParams(temperature=0.0)
        for text in ("List three uses of a paperclip.", "def add(a, b):\n    return a + b\n# now subtract:"):
            ids = engine.loaded.encode_prompt(text)
            plain = engine.generate(ids, max_tokens=32, params=params)
            for kwargs in (dict(gamma=2), dict(gamma=6), dict(gamma=3, tree_budget=8)):
                spec = engine.generate(ids, drafter=NgramDrafter(), max_tokens=32, params=params, **kwargs)
                assert spec.token_ids == plain.token_ids
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("fmt", ("F32", *FORMATS))
@pytest.mark.parametrize("tied", (False, True))
def test_the_one_call_forward_is_the_modules_path_bit_for_bit(fmt, tied, monkeypatch):
    """specledger_forward_f32 (embedding, stack, final norm and head in one call) gives the bits of the embedding
    module, the stack call, the norm and the head's linear run one after another, and the same cache."""
    from specledger.engine import native_rows

    if fmt == "F32":
        model = tiny_model(5, vocab=96, n_layers=2, dim=64)
        if tied:
            model.lm_head.weight = model.embed.weight
    else:
        model = _quantized_tiny(fmt, tied)
    assert native_rows._ends(model) is not None  # the one-call path applies
    tokens = torch.tensor([[3, 17, 5], [60, 2, 95]])
    for last_only in (False, True):
        with torch.inference_mode():
            fast_cache, slow_cache = model.new_cache(16, batch_size=2), model.new_cache(16, batch_size=2)
            for start, rows in ((0, tokens), (3, tokens[:, :1])):  # a prefill of 3 rows, then one decode row each
                fast = model(rows, start, fast_cache, last_only=last_only)
                with monkeypatch.context() as patched:
                    patched.setattr(native_rows, "forward_logits", lambda *a, **k: None)
                    slow = model(rows, start, slow_cache, last_only=last_only)
                assert fast.shape == slow.shape == (2, 1 if last_only else rows.shape[1], 96)
                assert torch.equal(fast, slow)
            assert torch.equal(fast_cache.kv, slow_cache.kv)


def test_a_token_outside_the_vocabulary_is_a_one_line_error():
    model = _quantized_tiny("Q4_1")
    with torch.inference_mode(), pytest.raises(SpecLedgerError, match=r"token ids must lie in \[0, 96\)"):
        model(torch.tensor([[3, 96]]), 0, model.new_cache(8))
