"""The target's shape (:class:`ModelConfig`, from a Hugging Face ``config.json``) and its static,
position-indexed KV cache (:class:`KVCache`): the two things every forward pass is sized by."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specledger.errors import SpecLedgerError
from specledger.ledger.memory import KVShape

_LLAMA_LIKE = ("llama", "mistral")


@dataclass
class ModelConfig:
    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    hidden_dim: int
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    max_seq_len: int = 2048
    tie_embeddings: bool = True
    head_dim: int | None = None
    attention_bias: bool = False

    def __post_init__(self) -> None:
        if self.head_dim is None:
            self.head_dim = self.dim // self.n_heads
        if self.n_heads % self.n_kv_heads:
            raise SpecLedgerError(
                f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}; fix the model config"
            )

    @classmethod
    def from_hf(cls, hf_config: dict) -> ModelConfig:
        """Map a Hugging Face ``config.json`` dict (LlamaConfig keys) onto a ModelConfig."""
        model_type = str(hf_config.get("model_type", "llama"))
        if model_type not in _LLAMA_LIKE:
            raise SpecLedgerError(
                f"model_type {model_type!r} is not supported natively (only the Llama family: "
                f"{', '.join(_LLAMA_LIKE)}); use a Llama-architecture checkpoint"
            )
        if hf_config.get("sliding_window"):
            window = int(hf_config["sliding_window"])
            if window < int(hf_config.get("max_position_embeddings", 2048)):
                raise SpecLedgerError(
                    "sliding-window attention is not supported natively; use a checkpoint without it"
                )
        rope_params = hf_config.get("rope_parameters") or {}
        rope_scaling = hf_config.get("rope_scaling") or rope_params
        rope_type = rope_scaling.get("rope_type", rope_scaling.get("type", "default"))
        if rope_type not in ("default", None):
            raise SpecLedgerError(
                f"rope_scaling type {rope_type!r} is not supported natively; use a checkpoint with plain RoPE"
            )
        if hf_config.get("mlp_bias"):
            raise SpecLedgerError("MLP biases are not supported natively; use a checkpoint without mlp_bias")
        theta = hf_config.get("rope_theta", rope_params.get("rope_theta", 10000.0))
        n_heads = int(hf_config["num_attention_heads"])
        return cls(
            vocab_size=int(hf_config["vocab_size"]),
            dim=int(hf_config["hidden_size"]),
            n_layers=int(hf_config["num_hidden_layers"]),
            n_heads=n_heads,
            n_kv_heads=int(hf_config.get("num_key_value_heads") or n_heads),
            hidden_dim=int(hf_config["intermediate_size"]),
            rope_theta=float(theta),
            norm_eps=float(hf_config.get("rms_norm_eps", 1e-5)),
            max_seq_len=int(hf_config.get("max_position_embeddings", 2048)),
            tie_embeddings=bool(hf_config.get("tie_word_embeddings", True)),
            head_dim=hf_config.get("head_dim"),
            attention_bias=bool(hf_config.get("attention_bias", False)),
        )

    def kv_shape(self, dtype_bytes: int, layers: int | None = None) -> KVShape:
        """The KV of one token over ``layers`` layers (default all) at ``dtype_bytes`` per element."""
        return KVShape(layers=int(layers or self.n_layers), kv_heads=self.n_kv_heads, head_dim=int(self.head_dim),
                       bytes_per_element=int(dtype_bytes))

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """KV bytes one token occupies: m_KV = n_layers × 2 × n_kv_heads × head_dim × dtype_bytes
        (:attr:`specledger.ledger.memory.KVShape.bytes_per_token`, the one formula)."""
        return self.kv_shape(dtype_bytes).bytes_per_token


class KVCache:
    """Static, position-indexed: k, v tensors [n_layers, B, n_kv_heads, capacity, head_dim].

    Holds no length: the caller passes ``start_pos`` to forward; rolling back rejected tokens is
    simply passing a smaller ``start_pos`` next time (stale slots get overwritten).
    ``k`` and ``v`` are views of one tensor ``kv`` [n_layers, 2, B, n_kv_heads, capacity, head_dim]
    so a layer writes its new keys and values with a single copy.
    """

    def __init__(self, config: ModelConfig, capacity: int, batch_size: int, dtype: torch.dtype,
                 device: torch.device | str | None = None):
        self.capacity = capacity
        self.batch_size = batch_size
        self.kv = torch.zeros(
            (config.n_layers, 2, batch_size, config.n_kv_heads, capacity, int(config.head_dim)), dtype=dtype,
            device=device,
        )
        self.k = self.kv[:, 0]
        self.v = self.kv[:, 1]

    def nbytes(self) -> int:
        """Bytes held by the k and v tensors together."""
        return self.kv.numel() * self.kv.element_size()

    def slot(self, b: int) -> KVCache:
        """A batch-1 view of sequence slot ``b`` (shares storage): prefill one request of a batch."""
        view = object.__new__(KVCache)
        view.capacity, view.batch_size = self.capacity, 1
        view.kv = self.kv[:, :, b : b + 1]
        view.k, view.v = view.kv[:, 0], view.kv[:, 1]
        return view
