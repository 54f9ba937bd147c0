"""Memory bandwidth: what decode achieves, beside what this machine can read right now.

Plain decode of a small model streams every weight (and the KV cache so far) once per token, so
``bytes read per token / seconds per token`` says how close an engine is to the hardware's limit
(gpt-fast prints the same figure). The limit is measured in the same run, not assumed: on a shared
machine a slow moment shows up as a low read bandwidth, not as a slow engine.

Conventions, one place: weights as :meth:`Transformer.weight_bytes` counts them (every layer, final
norm, LM head; the embedding lookup excluded, a tied table counted once); bytes read by one decode
step at context ``c`` are ``W + c · m_KV`` (every layer's keys and values over the prefix, m_KV =
layers × 2 × kv_heads × head_dim × bytes), by :func:`specledger.ledger.memory.step_read_bytes`, the one
formula every bandwidth line uses (:func:`decode_line`). The measured read bandwidth is the best of
several passes of ``torch.sum`` over a buffer far larger than the last-level cache, with torch's
intra-op threads (the threads decode uses).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypedDict

import torch

from specledger.ledger.memory import kv_read_bytes, step_read_bytes

if TYPE_CHECKING:
    from specledger.engine.model import Transformer

#: bytes the read probe streams per pass (8x a 32 MiB L3)
PROBE_BYTES = 256 << 20


def measure_read_bandwidth(nbytes: int = PROBE_BYTES, repeats: int = 8, device: str | torch.device = "cpu") -> float:
    """This machine's read bandwidth now, bytes/s: best of ``repeats`` ``torch.sum`` passes over
    ``nbytes`` of float32 (pages touched first, one untimed pass); on a GPU, its memory's."""
    device = torch.device(device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda *_: None)
    x = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=device)
    x.sum()
    best = 0.0
    for _ in range(repeats):
        sync(device)
        t = time.perf_counter()
        x.sum()
        sync(device)
        dt = time.perf_counter() - t
        best = max(best, x.numel() * 4 / dt if dt > 0 else 0.0)
    return best


def kv_element_bytes(model: Transformer) -> int:
    """Bytes of one KV cache element: the model's activation dtype (what :meth:`Transformer.new_cache` holds)."""
    return torch.empty(0, dtype=model.dtype).element_size()


def kv_bytes_per_position(model: Transformer) -> int:
    """KV bytes one cached position holds across all layers in the model's dtype (m_KV)."""
    return model.config.kv_bytes_per_token(kv_element_bytes(model))


def decode_bytes_per_token(model: Transformer, mean_context: float = 0.0) -> float:
    """Bytes one plain decode step reads: W + c · m_KV at c = ``mean_context`` (:func:`step_read_bytes`)."""
    return step_read_bytes(model.weight_bytes(), kv_bytes_per_position(model), mean_context)


def mean_decode_context(prompt_tokens: int, output_tokens: int) -> float:
    """Mean prefix length over the decode steps of one request (step i attends to prompt + i)."""
    return prompt_tokens + max(0, output_tokens - 1) / 2.0


def requests_decode_context(requests: Sequence[tuple[int, int]]) -> float:
    """The mean context of the decode steps of ``(prompt_tokens, output_tokens)`` pairs, weighted by their
    decode steps (o - 1 each: the first token comes from the prefill); 0 without a decode step. The KV read
    is linear in the context, so the bytes at this context are the mean bytes per token."""
    tokens = sum(max(0, o - 1) for _, o in requests)
    if tokens <= 0:
        return 0.0
    return sum(max(0, o - 1) * mean_decode_context(p, o) for p, o in requests) / tokens


def request_bytes_per_token(model: Transformer, requests: Sequence[tuple[int, int]]) -> float:
    """Decode bytes per token averaged over ``(prompt_tokens, output_tokens)`` pairs, weighted by tokens."""
    return decode_bytes_per_token(model, requests_decode_context(requests))


def achieved(bytes_per_token: float, tokens_per_s: float) -> float:
    """Bandwidth achieved, bytes/s."""
    return bytes_per_token * tokens_per_s


def describe(bytes_per_token: float, tokens_per_s: float, machine_bytes_per_s: float | None,
             kv_bytes: float | None = None, context: float | None = None) -> str:
    """One line: ``5.6 GB/s achieved (538 MB/token x 10.4 tok/s) = 22% of 24.9 GB/s measured read``; given
    ``kv_bytes`` (the KV part of ``bytes_per_token``) and its ``context``, the token's bytes are split:
    ``(290 MB/token = 100 MB weights + 190 MB KV at context 4096, x 10.4 tok/s)``."""
    got = achieved(bytes_per_token, tokens_per_s)
    per_token = f"{bytes_per_token / 1e6:.0f} MB/token"
    if kv_bytes is not None and context is not None:
        per_token += (f" = {(bytes_per_token - kv_bytes) / 1e6:.0f} MB weights + {kv_bytes / 1e6:.0f} MB KV at "
                      f"context {context:.0f},")
    line = f"{got / 1e9:.1f} GB/s achieved ({per_token} x {tokens_per_s:.1f} tok/s)"
    if machine_bytes_per_s:
        line += f" = {got / machine_bytes_per_s * 100:.0f}% of {machine_bytes_per_s / 1e9:.1f} GB/s measured read"
    return line


def decode_line(model: Transformer, context: float, tokens_per_s: float, machine_bytes_per_s: float | None) -> str:
    """:func:`describe` of plain decoding at ``context``: W + c · m_KV per token (:func:`decode_bytes_per_token`),
    the weights and the KV shown apart."""
    kv = kv_read_bytes(kv_bytes_per_position(model), context)
    return describe(decode_bytes_per_token(model, context), tokens_per_s, machine_bytes_per_s, kv, context)


class PlainBandwidthDict(TypedDict, total=False):
    """Plain decoding's achieved bandwidth beside this machine's read bandwidth (empty without a timed round)."""

    plain_decode_tokens_per_s: float
    plain_decode_GB_per_s: float
    bytes_per_token: float  # weights + the KV at ``mean_context``
    kv_read_bytes_per_token: float
    mean_context: float  # tokens
    machine_read_GB_per_s: float
    bandwidth: str  # the line :func:`decode_line` writes


def plain_decode_bandwidth(model: Transformer, plain: Sequence[Any], device: str | torch.device = "cpu"
                           ) -> PlainBandwidthDict:
    """Plain decoding's achieved bandwidth over ``plain`` (records of plain decoding): decode tok/s over its
    one-token rounds (the prefill left out) x bytes per token (weights + the KV at the mean context,
    :func:`request_bytes_per_token`), beside this machine's read bandwidth measured now. Empty without a
    timed decode round. ``mean_context`` is the context the KV was counted at; ``kv_read_bytes_per_token``
    the KV part of ``bytes_per_token``."""
    rounds = [r for rec in plain for r in rec.rounds if r.proposed == 0]
    seconds = sum(r.t_round for r in rounds)
    if not rounds or seconds <= 0:
        return {}
    rate = sum(r.committed for r in rounds) / seconds
    ctx = requests_decode_context([(rec.prompt_tokens, rec.output_tokens) for rec in plain])
    bpt = decode_bytes_per_token(model, ctx)
    machine = measure_read_bandwidth(device=device)
    return {"plain_decode_tokens_per_s": rate, "plain_decode_GB_per_s": bpt * rate / 1e9,
            "bytes_per_token": bpt, "kv_read_bytes_per_token": kv_read_bytes(kv_bytes_per_position(model), ctx),
            "mean_context": ctx, "machine_read_GB_per_s": machine / 1e9,
            "bandwidth": decode_line(model, ctx, rate, machine)}
