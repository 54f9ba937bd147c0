"""A small, fast native Llama-family decoder with a static, position-indexed KV cache.

Design (in the spirit of gpt-fast, written for CPU decode):

- q/k/v are fused into one linear (``wqkv``) and gate/up into one (``w13``): a decode step
  runs 4 matmuls per layer instead of 7, and each weight is read exactly once per step.
  Matmuls run on prepacked weight copies (:class:`specledger.engine.layers.Linear`), the bulk of the speed-up.
- One RoPE call per layer rotates the q and k heads and passes the v heads through (cos=1,
  sin=0), so the new keys and values land in the cache with a single copy.
- The KV cache is a pair of preallocated tensors ``[n_layers, B, n_kv_heads, capacity, head_dim]``
  holding no length. ``forward(tokens, start_pos, cache)`` writes k/v for positions
  ``start_pos .. start_pos+T-1`` and attends over slots ``[0, start_pos+T)`` only, so rolling
  back rejected draft tokens is just passing a smaller ``start_pos`` next time.
- GQA without copies: the ``n_heads // n_kv_heads`` query heads that share one kv head are
  folded into the query-length axis, so attention is one SDPA call over
  ``[B, n_kv_heads, group*T, head_dim]`` queries against the unrepeated cache slice.
- Numerics follow Hugging Face Llama: RMSNorm in float32 then cast back before the weight
  multiply, RoPE with the rotate-half convention, cos/sin computed in float32 and cast to the
  activation dtype (:mod:`specledger.engine.layers`), logits computed in the model dtype and
  returned as float32.

The config and the KV cache are :mod:`specledger.engine.model_config`'s; this module is the forward.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from specledger.engine import native_rows
from specledger.engine.layers import Linear, apply_rope, rms_norm, rope_cos_sin
from specledger.engine.model_config import KVCache, ModelConfig
from specledger.errors import SpecLedgerError

#: Up to this many positions per forward (decode steps and verify passes) attention runs row by
#: row, making each row's result independent of how many rows share the pass.
ROW_INVARIANT_MAX_T = 32


class Block(native_rows.EpochOnApply, nn.Module):
    """One pre-norm decoder layer: x += Attn(norm(x)); x += MLP(norm(x))."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        head_dim = int(config.head_dim)
        self.n_heads, self.n_kv_heads, self.head_dim = config.n_heads, config.n_kv_heads, head_dim
        self.eps = config.norm_eps
        qkv_out = (config.n_heads + 2 * config.n_kv_heads) * head_dim
        self.wqkv = Linear(config.dim, qkv_out, bias=config.attention_bias)
        self.wo = Linear(config.n_heads * head_dim, config.dim, bias=config.attention_bias)
        self.w13 = Linear(config.dim, 2 * config.hidden_dim, bias=False)
        self.w2 = Linear(config.hidden_dim, config.dim, bias=False)
        self.attn_norm = nn.Parameter(torch.ones(config.dim))
        self.mlp_norm = nn.Parameter(torch.ones(config.dim))
        self.hidden_dim = config.hidden_dim

    def forward(
        self,
        x: torch.Tensor,
        kv_cache: torch.Tensor,
        start_pos: int,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor | None,
    ) -> torch.Tensor:
        """``kv_cache`` is this layer's [2, B, nkv, capacity, hd]; ``cos``/``sin`` are
        [T, nh + 2*nkv, hd] with the value heads' rows set to cos=1, sin=0."""
        bsz, seq, _ = x.shape
        hd, nh, nkv = self.head_dim, self.n_heads, self.n_kv_heads
        qkv = self.wqkv(rms_norm(x, self.attn_norm, self.eps)).view(bsz, seq, nh + 2 * nkv, hd)
        qkv = apply_rope(qkv, cos, sin)
        end = start_pos + seq
        new_kv = qkv[:, :, nh:].view(bsz, seq, 2, nkv, hd).permute(2, 0, 3, 1, 4)
        kv_cache[:, :, :, start_pos:end].copy_(new_kv)
        # Fold each kv head's query group into the query axis: [B, nkv, group*T, hd].
        group = nh // nkv
        q = qkv[:, :, :nh].reshape(bsz, seq, nkv, group, hd).permute(0, 2, 3, 1, 4)
        if seq <= ROW_INVARIANT_MAX_T:
            # Decode and verify: each position attends over exactly its own key prefix with the
            # same unmasked call a one-token decode step makes, so a verify pass computes every
            # row bit-for-bit like plain decoding would (greedy exactness does not hinge on
            # rounding luck). Prefill (same shape in plain and speculative runs) takes the fast path.
            rows = [
                F.scaled_dot_product_attention(
                    q[:, :, :, i].contiguous(), kv_cache[0, :, :, : start_pos + i + 1],
                    kv_cache[1, :, :, : start_pos + i + 1],
                )
                for i in range(seq)
            ]
            out = torch.stack(rows, dim=1).reshape(bsz, seq, nh * hd)
        elif start_pos == 0:  # a prefill from the start: plain causal attention (the fused kernel, no mask tensor)
            out = F.scaled_dot_product_attention(qkv[:, :, :nh].transpose(1, 2), kv_cache[0, :, :, :end],
                                                 kv_cache[1, :, :, :end], is_causal=True, enable_gqa=True)
            out = out.transpose(1, 2).reshape(bsz, seq, nh * hd)
        else:
            q = q.reshape(bsz, nkv, group * seq, hd)
            out = F.scaled_dot_product_attention(q, kv_cache[0, :, :, :end], kv_cache[1, :, :, :end], attn_mask=mask)
            out = out.view(bsz, nkv, group, seq, hd).permute(0, 3, 1, 2, 4).reshape(bsz, seq, nh * hd)
        x = x + self.wo(out)
        gate_up = self.w13(rms_norm(x, self.mlp_norm, self.eps))
        gate, up = gate_up.split((self.hidden_dim, self.hidden_dim), dim=-1)
        return x + self.w2(F.silu(gate) * up)


    def forward_packed(
        self,
        x: torch.Tensor,
        kv_cache: torch.Tensor,
        slots: torch.Tensor,
        positions: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        slot_list: Sequence[int] | None = None,
        pos_list: Sequence[int] | None = None,
    ) -> torch.Tensor:
        """Ragged batch, packed: ``x`` [1, M, dim] holds M rows from several sequences; row m is
        position ``positions[m]`` of the sequence in cache slot ``slots[m]``. Every op is the same
        per-row op as :meth:`forward` (linears are row-invariant for M >= 2, attention runs row
        by row over the row's own key prefix), so each row equals a solo decode bit for bit."""
        _, m, _ = x.shape
        hd, nh, nkv = self.head_dim, self.n_heads, self.n_kv_heads
        qkv = self.wqkv(rms_norm(x, self.attn_norm, self.eps)).view(1, m, nh + 2 * nkv, hd)
        qkv = apply_rope(qkv, cos, sin)
        kv_cache[:, slots, :, positions] = qkv[0, :, nh:].view(m, 2, nkv, hd)
        group = nh // nkv
        q = qkv[0, :, :nh].reshape(m, nkv, group, hd)
        if slot_list is None or pos_list is None:  # host copies; the model passes them (no device sync)
            slot_list, pos_list = slots.tolist(), positions.tolist()
        rows = [
            F.scaled_dot_product_attention(
                q[i : i + 1].contiguous(),
                kv_cache[0, slot_list[i] : slot_list[i] + 1, :, : pos_list[i] + 1],
                kv_cache[1, slot_list[i] : slot_list[i] + 1, :, : pos_list[i] + 1],
            )
            for i in range(m)
        ]
        out = torch.cat(rows, dim=0).reshape(1, m, nh * hd)
        x = x + self.wo(out)
        gate_up = self.w13(rms_norm(x, self.mlp_norm, self.eps))
        gate, up = gate_up.split((self.hidden_dim, self.hidden_dim), dim=-1)
        return x + self.w2(F.silu(gate) * up)


    def forward_tree(
        self,
        x: torch.Tensor,
        kv_cache: torch.Tensor,
        slots: list[int],
        positions: list[int],
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv_out: torch.Tensor,
    ) -> torch.Tensor:
        """:meth:`forward_packed` for token trees (rows of each sequence in DFS preorder, a row's
        position = start + its depth): each row writes its own k/v at (slot, position) just before
        it attends over [0, position], so it sees exactly its root-to-node path (its ancestors were
        the last rows written at the shallower positions). Every row's new k/v is also copied to
        ``kv_out`` [2, M, nkv, hd] (the accepted path is committed from there)."""
        _, m, _ = x.shape
        hd, nh, nkv = self.head_dim, self.n_heads, self.n_kv_heads
        qkv = self.wqkv(rms_norm(x, self.attn_norm, self.eps)).view(1, m, nh + 2 * nkv, hd)
        qkv = apply_rope(qkv, cos, sin)
        new_kv = qkv[0, :, nh:].view(m, 2, nkv, hd)
        kv_out.copy_(new_kv.transpose(0, 1))
        group = nh // nkv
        q = qkv[0, :, :nh].reshape(m, nkv, group, hd)
        rows = []
        for i in range(m):
            s, p = slots[i], positions[i]
            kv_cache[:, s, :, p] = new_kv[i]
            rows.append(F.scaled_dot_product_attention(
                q[i : i + 1].contiguous(), kv_cache[0, s : s + 1, :, : p + 1], kv_cache[1, s : s + 1, :, : p + 1]))
        out = torch.cat(rows, dim=0).reshape(1, m, nh * hd)
        x = x + self.wo(out)
        gate_up = self.w13(rms_norm(x, self.mlp_norm, self.eps))
        gate, up = gate_up.split((self.hidden_dim, self.hidden_dim), dim=-1)
        return x + self.w2(F.silu(gate) * up)

    def forward_masked(
        self,
        x: torch.Tensor,
        kv_cache: torch.Tensor,
        write_start: int,
        key_len: int,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor,
    ) -> torch.Tensor:
        """Batch-1 rows written at slots ``write_start ..`` attending over slots [0, key_len) under a
        boolean ``mask`` [group*T, key_len] (drafting a tree: not row-invariant, and need not be)."""
        bsz, seq, _ = x.shape
        hd, nh, nkv = self.head_dim, self.n_heads, self.n_kv_heads
        qkv = self.wqkv(rms_norm(x, self.attn_norm, self.eps)).view(bsz, seq, nh + 2 * nkv, hd)
        qkv = apply_rope(qkv, cos, sin)
        new_kv = qkv[:, :, nh:].view(bsz, seq, 2, nkv, hd).permute(2, 0, 3, 1, 4)
        kv_cache[:, :, :, write_start : write_start + seq].copy_(new_kv)
        group = nh // nkv
        q = qkv[:, :, :nh].reshape(bsz, seq, nkv, group, hd).permute(0, 2, 3, 1, 4).reshape(bsz, nkv, group * seq, hd)
        out = F.scaled_dot_product_attention(q, kv_cache[0, :, :, :key_len], kv_cache[1, :, :, :key_len],
                                             attn_mask=mask)
        out = out.view(bsz, nkv, group, seq, hd).permute(0, 3, 1, 2, 4).reshape(bsz, seq, nh * hd)
        x = x + self.wo(out)
        gate_up = self.w13(rms_norm(x, self.mlp_norm, self.eps))
        gate, up = gate_up.split((self.hidden_dim, self.hidden_dim), dim=-1)
        return x + self.w2(F.silu(gate) * up)


class Transformer(native_rows.EpochOnApply, nn.Module):
    """Llama decoder. ``forward`` returns float32 logits and writes k/v into the given cache."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.dim)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.norm = nn.Parameter(torch.ones(config.dim))
        self.lm_head = Linear(config.dim, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        # Plain attributes, not buffers, so ``.to(dtype)`` never rounds the float32 tables.
        self.rope_cos, self.rope_sin = rope_cos_sin(config, config.max_seq_len)
        self._rope_cache: tuple[tuple, torch.Tensor, torch.Tensor] | None = None

    @property
    def dtype(self) -> torch.dtype:
        return self.norm.dtype

    @property
    def device(self) -> torch.device:
        return self.norm.device

    def new_cache(self, capacity: int, batch_size: int = 1) -> KVCache:
        """A zeroed cache for ``capacity`` positions (at most ``config.max_seq_len``)."""
        if not 0 < capacity <= self.config.max_seq_len:
            raise SpecLedgerError(
                f"KV cache capacity {capacity} is outside 1..{self.config.max_seq_len} (the model's context); "
                "shorten the prompt or max_tokens"
            )
        return KVCache(self.config, capacity, batch_size, self.dtype, self.device)

    def _ensure_rope(self) -> None:
        """The float32 RoPE tables cast to the activation dtype on the model's device, cached per (dtype, device)."""
        key = (self.dtype, self.device)
        if self._rope_cache is None or self._rope_cache[0] != key:
            dtype, device = key
            self._rope_cache = (key, self.rope_cos.to(device=device, dtype=dtype),
                                self.rope_sin.to(device=device, dtype=dtype))

    def _rope_tables(self, start_pos: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin for positions [start_pos, end) shaped [T, nh + 2*nkv, head_dim] in the
        activation dtype (HF casts them the same way): the rotation for the q and k heads,
        the identity (cos=1, sin=0) for the v heads."""
        self._ensure_rope()
        cfg = self.config
        seq, rotated, passthrough = end - start_pos, cfg.n_heads + cfg.n_kv_heads, cfg.n_kv_heads
        cos = self._rope_cache[1][start_pos:end, None].expand(seq, rotated, -1)
        sin = self._rope_cache[2][start_pos:end, None].expand(seq, rotated, -1)
        ones = cos.new_ones(seq, passthrough, cos.shape[-1])
        return torch.cat((cos, ones), dim=1), torch.cat((sin, torch.zeros_like(ones)), dim=1)

    def _causal_mask(self, start_pos: int, seq: int, group: int) -> torch.Tensor | None:
        """Boolean [group*T, start_pos+T] mask: query row for position ``start_pos+i`` may see
        key slot ``j`` iff ``j <= start_pos + i`` (rows repeat per folded query head). None where no layer
        needs one: up to ``ROW_INVARIANT_MAX_T`` queries (decode and verify attend row by row, unmasked), or a pass
        from position 0 (the layers attend with ``is_causal``)."""
        if seq <= ROW_INVARIANT_MAX_T or start_pos == 0:
            return None
        device = self.device
        query_pos = torch.arange(start_pos, start_pos + seq, device=device).repeat(group)
        return torch.arange(start_pos + seq, device=device)[None, :] <= query_pos[:, None]

    def forward(
        self,
        tokens: torch.Tensor,
        start_pos: int,
        cache: KVCache,
        layers: Sequence[int] | None = None,
        last_only: bool = False,
        return_hidden: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Logits (float32) ``[B, T, V]`` (``[B, 1, V]`` if ``last_only``) for ``tokens`` at
        positions ``start_pos .. start_pos+T-1``; each position attends to cache slots
        ``[0, position]`` and its own k/v are written into the cache first.

        ``return_hidden``: also return the final hidden states ``[B, T, dim]`` of *every*
        position (after the final norm: what the LM head reads), as ``(logits, hidden)`` --
        the features a learned draft head (``drafters/head.py``) runs on. Off, nothing extra
        is computed (the plain path is unchanged)."""
        bsz, seq = tokens.shape
        end = start_pos + seq
        if start_pos < 0 or end > cache.capacity:
            raise SpecLedgerError(
                f"positions {start_pos}..{end - 1} do not fit the KV cache (capacity {cache.capacity}); "
                "allocate a larger cache"
            )
        if seq <= ROW_INVARIANT_MAX_T and native_rows.available(self):  # decode and verify rows: native
            slots = torch.tensor([b for b in range(bsz) for _ in range(seq)], device=self.device)  # one op each
            pos = torch.tensor(list(range(start_pos, end)) * bsz, device=self.device)  # (arange + repeat: 2x slower)
            if layers is None and not return_hidden and (logits := native_rows.forward_logits(
                    self, tokens, cache.kv, slots, pos, bsz - 1, last_only)) is not None:
                return logits  # the whole forward in one native call
            x = native_rows.run_layers(
                self, self.embed(tokens).reshape(bsz * seq, -1), cache.kv, slots, pos, bsz - 1, layers
            ).view(bsz, seq, -1)
        else:
            x = self.embed(tokens)
            cos, sin = self._rope_tables(start_pos, end)
            mask = self._causal_mask(start_pos, seq, self.config.n_heads // self.config.n_kv_heads)
            for i in range(len(self.layers)) if layers is None else layers:
                x = self.layers[i](x, cache.kv[i], start_pos, cos, sin, mask)
        if return_hidden:
            hidden = rms_norm(x, self.norm, self.config.norm_eps)
            return self.lm_head(hidden[:, -1:] if last_only else hidden).float(), hidden
        if last_only:
            x = x[:, -1:]
        return self.lm_head(rms_norm(x, self.norm, self.config.norm_eps)).float()

    def _rope_rows(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin for arbitrary positions, [M, nh + 2*nkv, head_dim], same values as _rope_tables."""
        self._ensure_rope()
        cfg = self.config
        m, rotated, passthrough = len(positions), cfg.n_heads + cfg.n_kv_heads, cfg.n_kv_heads
        cos = self._rope_cache[1][positions][:, None].expand(m, rotated, -1)
        sin = self._rope_cache[2][positions][:, None].expand(m, rotated, -1)
        ones = cos.new_ones(m, passthrough, cos.shape[-1])
        return torch.cat((cos, ones), dim=1), torch.cat((sin, torch.zeros_like(ones)), dim=1)

    def forward_packed(
        self,
        tokens: Sequence[int],
        slots: Sequence[int],
        positions: Sequence[int],
        cache: KVCache,
        logit_rows: Sequence[int] | None = None,
        return_hidden: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """One pass over a ragged batch (continuous batching): row m is token ``tokens[m]`` at
        ``positions[m]`` of the sequence in cache slot ``slots[m]``; its k/v are written there and
        it attends to that slot's positions [0, positions[m]]. Returns float32 logits
        [len(logit_rows), V] for the requested rows (all rows if None); with ``return_hidden``
        ``(logits, hidden)``, hidden [M, dim] for every row (see :meth:`forward`)."""
        positions, device = list(positions), self.device
        if positions and (max(positions) >= cache.capacity or min(positions) < 0):
            raise SpecLedgerError(
                f"positions up to {max(positions)} do not fit the KV cache (capacity {cache.capacity})"
            )
        slot_list = list(slots)
        pos = torch.tensor(positions, dtype=torch.long, device=device)
        slot_t = torch.tensor(slot_list, dtype=torch.long, device=device)
        token_t = torch.tensor([list(tokens)], device=device)
        native = native_rows.available(self)
        if native and not return_hidden and logit_rows is None and (logits := native_rows.forward_logits(
                self, token_t, cache.kv, slot_t, pos, max(slot_list, default=0), False)) is not None:
            return logits[0]  # the whole packed forward in one native call, as a solo decode step
        x = self.embed(token_t)
        if native:
            x = native_rows.run_layers(self, x[0], cache.kv, slot_t, pos, max(slot_list, default=0))[None]
        else:
            cos, sin = self._rope_rows(pos)
            for i, layer in enumerate(self.layers):
                x = layer.forward_packed(x, cache.kv[i], slot_t, pos, cos, sin, slot_list, positions)
        if return_hidden:
            hidden = rms_norm(x, self.norm, self.config.norm_eps)
            rows = hidden if logit_rows is None else hidden[:, list(logit_rows)]
            return self.lm_head(rows).float()[0], hidden[0]
        if logit_rows is not None:
            x = x[:, list(logit_rows)]
        return self.lm_head(rms_norm(x, self.norm, self.config.norm_eps)).float()[0]

    def forward_tree(
        self,
        tokens: Sequence[int],
        slots: Sequence[int],
        positions: Sequence[int],
        cache: KVCache,
        return_hidden: bool = False,
    ) -> tuple[torch.Tensor, ...]:
        """One packed verify pass over token trees (and chains): rows as :meth:`forward_packed`, each
        sequence's rows in DFS preorder at positions start + depth (see :mod:`specledger.engine.tree`).
        Returns (float32 logits [M, V], the rows' new k/v [n_layers, 2, M, nkv, hd]) -- and, with
        ``return_hidden``, the rows' final hidden states [M, dim] third; commit an accepted path with
        :meth:`commit_tree_kv`. Each row is computed bit for bit like a plain decode step of its path."""
        pos = torch.tensor(list(positions), dtype=torch.long)
        if len(pos) and (int(pos.max()) >= cache.capacity or int(pos.min()) < 0):
            raise SpecLedgerError(
                f"positions up to {int(pos.max())} do not fit the KV cache (capacity {cache.capacity})"
            )
        cfg = self.config
        kv_out = torch.empty((cfg.n_layers, 2, len(pos), cfg.n_kv_heads, int(cfg.head_dim)), dtype=self.dtype)
        slot_list, pos_list = [int(s) for s in slots], pos.tolist()
        x = self.embed(torch.tensor([list(tokens)]))
        if native_rows.available(self):
            x = native_rows.run_layers(self, x[0], cache.kv,
                                       torch.tensor(slot_list, dtype=torch.long, device=self.device), pos,
                                       max(slot_list, default=0), tree=True, kv_out=kv_out)[None]
        else:
            cos, sin = self._rope_rows(pos)
            for i, layer in enumerate(self.layers):
                x = layer.forward_tree(x, cache.kv[i], slot_list, pos_list, cos, sin, kv_out[i])
        hidden = rms_norm(x, self.norm, self.config.norm_eps)
        if return_hidden:
            return self.lm_head(hidden).float()[0], kv_out, hidden[0]
        return self.lm_head(hidden).float()[0], kv_out

    @staticmethod
    def commit_tree_kv(cache: KVCache, slot: int, start: int, kv: torch.Tensor, rows: Sequence[int]) -> None:
        """Compact an accepted path in place: rows ``rows`` of a :meth:`forward_tree` pass's k/v go to
        positions ``start, start + 1, ..`` of cache slot ``slot`` (every layer, one copy)."""
        if rows:
            idx = torch.tensor(list(rows), dtype=torch.long)
            cache.kv[:, :, slot, :, start : start + len(rows)] = kv[:, :, idx].transpose(2, 3)

    def forward_tree_draft(
        self,
        tokens: Sequence[int],
        positions: Sequence[int],
        write_start: int,
        mask: torch.Tensor,
        cache: KVCache,
        layers: Sequence[int] | None = None,
    ) -> torch.Tensor:
        """Drafting a tree (batch-1 cache): rows ``tokens`` at RoPE ``positions`` write their k/v at
        slots ``write_start ..`` and attend over slots [0, write_start + T) where ``mask`` [T, that]
        allows (the context and the row's own ancestors). Float32 logits [T, V]."""
        seq = len(tokens)
        key_len = write_start + seq
        if key_len > cache.capacity:
            raise SpecLedgerError(f"a draft tree needs {key_len} positions; the draft cache holds {cache.capacity}")
        cos, sin = self._rope_rows(torch.tensor(list(positions), dtype=torch.long))
        group = self.config.n_heads // self.config.n_kv_heads
        full_mask = mask.repeat(group, 1)
        x = self.embed(torch.tensor([list(tokens)]))
        for i in range(len(self.layers)) if layers is None else layers:
            x = self.layers[i].forward_masked(x, cache.kv[i], write_start, key_len, cos, sin, full_mask)
        return self.lm_head(rms_norm(x, self.norm, self.config.norm_eps)).float()[0]

    def weight_bytes(self) -> int:
        """Bytes of weights read per decode step: every layer's tensors + final norm + LM head.

        Convention: the embedding lookup (one row) is excluded; with tied embeddings the shared
        table is counted once, as the LM head. Quantized layers count their int8 weights + scales.
        """
        counted: set[int] = set()
        total = 0
        tensors = list(self.layers.parameters()) + list(self.layers.buffers()) + [self.norm]
        tensors += list(self.lm_head.parameters()) + list(self.lm_head.buffers())
        for t in tensors:
            if id(t) not in counted:
                counted.add(id(t))
                total += t.numel() * t.element_size()
        return total

    @classmethod
    def from_hf_state_dict(
        cls, config: ModelConfig, state_dict: dict, dtype: torch.dtype = torch.float32
    ) -> Transformer:
        """Build from HF Llama names (``model.layers.N.self_attn.q_proj.weight`` ...), fusing
        q|k|v -> ``wqkv`` and gate|up -> ``w13`` by concatenation along the output axis."""
        with torch.device("meta"):
            model = cls(config)
        model = model.to_empty(device="cpu")
        model.rope_cos, model.rope_sin = rope_cos_sin(config, config.max_seq_len)

        def take(name: str) -> torch.Tensor:
            if name not in state_dict:
                raise SpecLedgerError(f"checkpoint is missing tensor {name!r}; use a complete Llama checkpoint")
            return state_dict[name]

        new_sd: dict[str, torch.Tensor] = {"embed.weight": take("model.embed_tokens.weight")}
        new_sd["norm"] = take("model.norm.weight")
        for i in range(config.n_layers):
            p = f"model.layers.{i}."
            att = p + "self_attn."
            new_sd[f"layers.{i}.wqkv.weight"] = torch.cat(
                [take(att + "q_proj.weight"), take(att + "k_proj.weight"), take(att + "v_proj.weight")]
            )
            if config.attention_bias:
                new_sd[f"layers.{i}.wqkv.bias"] = torch.cat(
                    [take(att + "q_proj.bias"), take(att + "k_proj.bias"), take(att + "v_proj.bias")]
                )
                new_sd[f"layers.{i}.wo.bias"] = take(att + "o_proj.bias")
            new_sd[f"layers.{i}.wo.weight"] = take(att + "o_proj.weight")
            new_sd[f"layers.{i}.w13.weight"] = torch.cat(
                [take(p + "mlp.gate_proj.weight"), take(p + "mlp.up_proj.weight")]
            )
            new_sd[f"layers.{i}.w2.weight"] = take(p + "mlp.down_proj.weight")
            new_sd[f"layers.{i}.attn_norm"] = take(p + "input_layernorm.weight")
            new_sd[f"layers.{i}.mlp_norm"] = take(p + "post_attention_layernorm.weight")
        new_sd["lm_head.weight"] = new_sd["embed.weight"] if config.tie_embeddings else take("lm_head.weight")
        model.load_state_dict(new_sd, strict=True, assign=True)
        if config.tie_embeddings:
            model.lm_head.weight = model.embed.weight
        model = model.to(dtype)
        model.eval().requires_grad_(False)
        return model
