"""The native decoder against Hugging Face's LlamaForCausalLM on a tiny random model."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

transformers = pytest.importorskip("transformers")

from specledger.engine.int8 import quantize_int8  # noqa: E402
from specledger.engine.model import Transformer  # noqa: E402
from specledger.engine.model_config import KVCache, ModelConfig  # noqa: E402
from specledger.errors import SpecLedgerError  # noqa: E402

VOCAB = 211
SEQ = 13


def tiny_hf_model(n_layers: int = 3, tie: bool = True, seed: int = 0, attention_bias: bool = False):
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=n_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=tie,
        attention_bias=attention_bias,
    )
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():  # random norms, so a wrong norm placement cannot hide behind ones
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return model


def native_from(hf_model, dtype=torch.float32) -> Transformer:
    config = ModelConfig.from_hf(hf_model.config.to_dict())
    return Transformer.from_hf_state_dict(config, hf_model.state_dict(), dtype=dtype)


def hf_logits(hf_model, tokens: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return hf_model(tokens, use_cache=False).logits.float()


@pytest.fixture(scope="module")
def pair():
    hf = tiny_hf_model()
    return hf, native_from(hf)


@pytest.fixture(scope="module")
def tokens():
    return torch.randint(0, VOCAB, (1, SEQ), generator=torch.Generator().manual_seed(1))


def full_pass(model: Transformer, tokens: torch.Tensor, **kwargs) -> torch.Tensor:
    cache = model.new_cache(32, batch_size=tokens.shape[0])
    with torch.inference_mode():
        return model(tokens, 0, cache, **kwargs)


def test_config_from_hf_maps_llama_keys(pair):
    hf, ours = pair
    cfg = ours.config
    assert (cfg.vocab_size, cfg.dim, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.hidden_dim) == (
        VOCAB, 64, 3, 4, 2, 128)
    assert cfg.head_dim == 16 and cfg.max_seq_len == 64 and cfg.tie_embeddings
    assert cfg.kv_bytes_per_token(2) == 3 * 2 * 2 * 16 * 2


def test_config_rejects_other_architectures():
    with pytest.raises(SpecLedgerError, match="Llama"):
        ModelConfig.from_hf({"model_type": "gpt2", "vocab_size": 10})


@pytest.mark.parametrize("tie", [True, False])
def test_full_sequence_matches_hf(tie, tokens):
    hf = tiny_hf_model(tie=tie, seed=3)
    ours = native_from(hf)
    logits = full_pass(ours, tokens)
    assert logits.dtype == torch.float32 and logits.shape == (1, SEQ, VOCAB)
    torch.testing.assert_close(logits, hf_logits(hf, tokens), atol=1e-4, rtol=1e-4)


def test_attention_bias_matches_hf(tokens):
    hf = tiny_hf_model(seed=4, attention_bias=True)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("proj.bias"):
                p.normal_(0, 0.5)
    torch.testing.assert_close(full_pass(native_from(hf), tokens), hf_logits(hf, tokens), atol=1e-4, rtol=1e-4)


def test_batch_matches_hf(pair):
    hf, ours = pair
    batch = torch.randint(0, VOCAB, (3, 7), generator=torch.Generator().manual_seed(5))
    torch.testing.assert_close(full_pass(ours, batch), hf_logits(hf, batch), atol=1e-4, rtol=1e-4)


def test_last_only_is_last_row(pair, tokens):
    _, ours = pair
    full = full_pass(ours, tokens)
    last = full_pass(ours, tokens, last_only=True)
    assert last.shape == (1, 1, VOCAB)
    torch.testing.assert_close(last, full[:, -1:], atol=1e-5, rtol=1e-5)


@settings(max_examples=15, deadline=None)
@given(chunks=st.lists(st.integers(min_value=1, max_value=5), min_size=1, max_size=8))
def test_incremental_chunks_equal_full_pass(pair, tokens, chunks):
    """Prefill/decode in arbitrary chunk sizes reproduces the one-shot logits row for row."""
    _, ours = pair
    full = full_pass(ours, tokens)
    cache = ours.new_cache(SEQ)
    pos, rows = 0, []
    with torch.inference_mode():
        for size in chunks + [SEQ]:
            if pos == SEQ:
                break
            size = min(size, SEQ - pos)
            rows.append(ours(tokens[:, pos:pos + size], pos, cache))
            pos += size
    torch.testing.assert_close(torch.cat(rows, dim=1), full, atol=1e-5, rtol=1e-5)


def test_prefill_then_single_steps(pair, tokens):
    hf, ours = pair
    expected = hf_logits(hf, tokens)
    cache = ours.new_cache(SEQ)
    with torch.inference_mode():
        pre = ours(tokens[:, :5], 0, cache, last_only=True)
        steps = [ours(tokens[:, p:p + 1], p, cache) for p in range(5, SEQ)]
    torch.testing.assert_close(pre[:, 0], expected[:, 4], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(torch.cat(steps, dim=1), expected[:, 5:], atol=1e-4, rtol=1e-4)


def test_layer_subset_equals_hf_with_those_layers(tokens):
    hf = tiny_hf_model(n_layers=3, seed=7)
    ours = native_from(hf)
    keep = [0, 2]
    pruned = tiny_hf_model(n_layers=3, seed=7)
    pruned.model.layers = torch.nn.ModuleList(pruned.model.layers[i] for i in keep)
    for new_idx, layer in enumerate(pruned.model.layers):
        layer.self_attn.layer_idx = new_idx
    pruned.config.num_hidden_layers = len(keep)
    expected = hf_logits(pruned, tokens)
    torch.testing.assert_close(full_pass(ours, tokens, layers=keep), expected, atol=1e-4, rtol=1e-4)
    assert not torch.allclose(full_pass(ours, tokens), expected, atol=1e-3)


def test_kv_rollback_equals_fresh_cache(pair, tokens):
    """Decode A, roll back to position p, decode B: same logits as a fresh cache decoding B."""
    _, ours = pair
    prefix, branch_a = tokens[:, :6], tokens[:, 6:]
    branch_b = torch.randint(0, VOCAB, (1, 4), generator=torch.Generator().manual_seed(9))
    with torch.inference_mode():
        cache = ours.new_cache(SEQ)
        ours(prefix, 0, cache)
        ours(branch_a, 6, cache)  # stale slots 6..12 now hold A's keys
        rolled = [ours(branch_b[:, i:i + 1], 6 + i, cache) for i in range(4)]
        fresh_cache = ours.new_cache(SEQ)
        ours(prefix, 0, fresh_cache)
        fresh = ours(branch_b, 6, fresh_cache)
    torch.testing.assert_close(torch.cat(rolled, dim=1), fresh, atol=1e-5, rtol=1e-5)


def test_bf16_close_to_fp32(pair, tokens):
    hf, ours = pair
    ours16 = native_from(hf, dtype=torch.bfloat16)
    assert ours16.dtype == torch.bfloat16
    ref = full_pass(ours, tokens)
    got = full_pass(ours16, tokens)
    assert got.dtype == torch.float32
    assert (got - ref).abs().max() < 0.05 * ref.abs().max()


def test_cache_shape_nbytes_and_bounds(pair, tokens):
    _, ours = pair
    cache = ours.new_cache(20, batch_size=2)
    assert isinstance(cache, KVCache) and cache.capacity == 20
    assert cache.k.shape == (3, 2, 2, 20, 16)
    assert cache.nbytes() == 2 * 3 * 2 * 2 * 20 * 16 * 4
    with pytest.raises(SpecLedgerError):
        ours(tokens, 10, ours.new_cache(16))
    with pytest.raises(SpecLedgerError):
        ours.new_cache(65)


def test_weight_bytes_counts_tied_head_once(pair):
    _, ours = pair
    cfg = ours.config
    per_layer = (64 * (4 + 2 * 2) * 16 + 64 * 64 + 64 * 2 * 128 + 128 * 64 + 2 * 64) * 4
    assert ours.weight_bytes() == cfg.n_layers * per_layer + 64 * 4 + VOCAB * 64 * 4


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int8_close_to_float(pair, tokens, dtype):
    hf, _ = pair
    base = native_from(hf, dtype=dtype)
    before = {k: v.clone() for k, v in base.state_dict().items()}
    quant = quantize_int8(base)
    for k, v in base.state_dict().items():  # the input model is untouched
        assert torch.equal(v, before[k])
    assert quant.weight_bytes() < 0.6 * base.weight_bytes()
    ref, got = full_pass(base, tokens), full_pass(quant, tokens)
    rel = (got - ref).norm() / ref.norm()
    assert rel < (0.02 if dtype == torch.float32 else 0.05)
    agree = (got.argmax(-1) == ref.argmax(-1)).float().mean()
    assert agree >= 0.75
    # incremental decode on the quantized model is still consistent with its own full pass
    cache = quant.new_cache(SEQ)
    with torch.inference_mode():
        quant(tokens[:, :4], 0, cache)
        step = quant(tokens[:, 4:5], 4, cache)
    torch.testing.assert_close(step[:, 0], got[:, 4], atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 4])
def test_prepacked_linear_matches_f_linear(dtype, rows):
    """Every kernel path of the prepacked Linear computes F.linear, and an in-place weight
    update is picked up (the packed copies are rebuilt, never stale)."""
    from specledger.engine.layers import Linear

    torch.manual_seed(0)
    lin = Linear(64, 96, bias=True).to(dtype).requires_grad_(False)
    x = torch.randn(1, rows, 64, dtype=dtype)
    tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    with torch.inference_mode():
        torch.testing.assert_close(lin(x), torch.nn.functional.linear(x, lin.weight, lin.bias), **tol)
    with torch.no_grad():
        lin.weight.mul_(-2.0)
    with torch.inference_mode():
        torch.testing.assert_close(lin(x), torch.nn.functional.linear(x, lin.weight, lin.bias), **tol)


def test_quantize_under_inference_mode_and_deepcopy(pair, tokens):
    """The decode loop may quantize inside inference_mode; the packed state is never copied."""
    import copy

    _, ours = pair
    full_pass(ours, tokens)  # builds the packed copies
    with torch.inference_mode():
        quant = quantize_int8(ours)
        twin = copy.deepcopy(ours)
    assert torch.isfinite(full_pass(quant, tokens)).all()
    torch.testing.assert_close(full_pass(twin, tokens), full_pass(ours, tokens))
