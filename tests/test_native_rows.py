"""The native float32 row ops (engine/kernels/ops.c) and the model's native row path: close to the
torch reference, and row-invariant bit for bit (what greedy exactness rests on)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from specledger.engine import kernels, native_rows
from specledger.engine.kernels import ops
from specledger.engine.layers import Linear, apply_rope
from specledger.errors import SpecLedgerError
from tests.conftest import tiny_model

pytestmark = pytest.mark.skipif(kernels.lib() is None, reason=f"native kernel unavailable: {kernels.status()}")


def test_rms_norm_and_silu_mul_match_torch_and_are_row_invariant():
    torch.manual_seed(0)
    x, w = torch.randn(7, 48), torch.randn(48)
    full = ops.rms_norm(x, w, 1e-5)
    torch.testing.assert_close(full, F.rms_norm(x, (48,), w, 1e-5), atol=1e-5, rtol=1e-5)
    gu = torch.randn(7, 64)
    act = ops.silu_mul(gu)
    torch.testing.assert_close(act, F.silu(gu[:, :32]) * gu[:, 32:], atol=1e-5, rtol=1e-5)
    for i in range(7):
        assert torch.equal(ops.rms_norm(x[i : i + 1], w, 1e-5), full[i : i + 1])
        assert torch.equal(ops.silu_mul(gu[i : i + 1]), act[i : i + 1])


def test_fused_residual_add_equals_torch_add_bit_for_bit():
    torch.manual_seed(1)
    lin = Linear(32, 40, bias=True)
    x, r = torch.randn(5, 32), torch.randn(5, 40)
    with torch.inference_mode():
        assert torch.equal(lin.fused_add(x, r), r + lin(x))


@pytest.mark.parametrize("hd", [8, 64])
def test_rope_and_attention_match_torch(hd):
    torch.manual_seed(2)
    nh, nkv, m, cap, start = 4, 2, 3, 16, 5
    qkv = torch.randn(m, nh + 2 * nkv, hd)
    ang = torch.randn(cap, hd // 2)
    cos, sin = torch.cat((ang, ang), -1).cos(), torch.cat((ang, ang), -1).sin()
    pos = torch.arange(start, start + m)
    want = qkv.clone()
    want[:, : nh + nkv] = apply_rope(qkv[:, : nh + nkv][None], cos[pos][:, None], sin[pos][:, None])[0]
    ops.rope_(qkv, cos, sin, pos, nh + nkv)
    torch.testing.assert_close(qkv, want, atol=1e-6, rtol=1e-6)
    cache = torch.randn(2, 1, nkv, cap, hd)
    ref_cache = cache.clone()
    out = ops.attend(qkv, cache[0], cache[1], torch.zeros(m, dtype=torch.long), pos, nh, nkv, tree=False)
    ref_cache[:, 0, :, start : start + m] = qkv[:, nh:].view(m, 2, nkv, hd).permute(1, 2, 0, 3)
    assert torch.equal(cache, ref_cache)
    for i in range(m):
        q = qkv[i, :nh].view(nkv, nh // nkv, hd)
        ref = F.scaled_dot_product_attention(q, ref_cache[0, 0, :, : start + i + 1],
                                             ref_cache[1, 0, :, : start + i + 1])
        torch.testing.assert_close(out[i].view(nkv, nh // nkv, hd), ref, atol=1e-5, rtol=1e-5)
        solo = ops.attend(qkv[i : i + 1], cache[0], cache[1], torch.zeros(1, dtype=torch.long), pos[i : i + 1], nh, nkv,
                          tree=True)
        assert torch.equal(solo[0], out[i])  # one row alone == that row in the pass, either mode


def test_attention_reads_a_trees_keys_from_its_rows_as_from_the_cache_bit_for_bit():
    """hd 64 and 20 keys and more: the scores of 16 keys at a time (one transposing sum) must equal the one-key dot
    bit for bit. Tree mode reads a row's keys past the first row's position from the rows themselves (one-key
    dots), chain mode from the cache (16 at a time): a chain of rows must come out identical both ways, and so
    must the cache they leave."""
    torch.manual_seed(4)
    nh, nkv, hd, m, cap, start = 4, 2, 64, 20, 64, 3
    qkv = torch.randn(m, nh + 2 * nkv, hd)
    pos, slots = torch.arange(start, start + m), torch.zeros(m, dtype=torch.long)
    base = torch.randn(2, 1, nkv, cap, hd)
    chain_cache, tree_cache = base.clone(), base.clone()
    chain = ops.attend(qkv, chain_cache[0], chain_cache[1], slots, pos, nh, nkv, tree=False)
    tree = ops.attend(qkv, tree_cache[0], tree_cache[1], slots, pos, nh, nkv, tree=True)
    assert torch.equal(chain, tree) and torch.equal(chain_cache, tree_cache)
    ref_cache = base.clone()
    ref_cache[:, 0, :, start : start + m] = qkv[:, nh:].view(m, 2, nkv, hd).permute(1, 2, 0, 3)
    for i in (0, 12, 19):
        q = qkv[i, :nh].view(nkv, nh // nkv, hd)
        ref = F.scaled_dot_product_attention(q, ref_cache[0, 0, :, : start + i + 1],
                                             ref_cache[1, 0, :, : start + i + 1])
        torch.testing.assert_close(chain[i].view(nkv, nh // nkv, hd), ref, atol=1e-5, rtol=1e-5)


def test_a_tree_row_sees_its_ancestors_not_its_earlier_siblings():
    """Tree mode: siblings share a position; row m must attend over what it would see had the rows been written
    one by one in DFS order (its ancestors), which is what a lone chain of its path sees."""
    torch.manual_seed(5)
    nh, nkv, hd, cap, start = 4, 2, 64, 64, 30
    # root at start; children a (start+1), its child a1 (start+2); then sibling b (start+1), its child b1 (start+2)
    pos = torch.tensor([start, start + 1, start + 2, start + 1, start + 2])
    qkv = torch.randn(5, nh + 2 * nkv, hd)
    base = torch.randn(2, 1, nkv, cap, hd)
    cache = base.clone()
    out = ops.attend(qkv, cache[0], cache[1], torch.zeros(5, dtype=torch.long), pos, nh, nkv, tree=True)
    for path in ([0, 1, 2], [0, 3, 4]):
        lone = base.clone()
        want = ops.attend(qkv[path], lone[0], lone[1], torch.zeros(3, dtype=torch.long), pos[path], nh, nkv,
                          tree=False)
        assert torch.equal(out[path], want)
    assert torch.equal(cache, lone)  # the last branch written, as row-by-row writing leaves it


def test_model_takes_the_native_path_and_it_matches_the_torch_path():
    model = tiny_model(n_layers=2)
    tokens = torch.randint(0, 64, (2, 9))
    with torch.inference_mode():
        assert native_rows.available(model)
        got = model(tokens, 0, model.new_cache(16, batch_size=2))
        with pytest.raises(SpecLedgerError, match="slots"):  # a batch larger than the cache: one clear error
            model(tokens, 0, model.new_cache(16))
        for m in model.modules():
            if isinstance(m, Linear):
                m.native = False
        assert not native_rows.available(model)
        ref = model(tokens, 0, model.new_cache(16, batch_size=2))
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(("rows", "tree", "layers", "kv"), [(1, False, None, False), (5, False, None, False),
                                                            (4, True, None, False), (3, False, [0, 2], False),
                                                            (6, True, None, True), (3, True, [0, 2], True)])
def test_the_one_call_stack_is_the_per_op_path_bit_for_bit(rows, tree, layers, kv, monkeypatch):
    """run_layers runs the whole stack in one native call (specledger_layers_f32); it must give exactly the bits
    of the per-op path (block_rows), in the rows, in the k/v it writes and in the k/v it hands back for a tree's
    commit (``kv``), or greedy exactness would rest on luck."""
    from dataclasses import replace

    from specledger.engine.model import Transformer

    torch.manual_seed(3)
    model = Transformer(replace(tiny_model(4).config, attention_bias=True)).eval().requires_grad_(False)
    with torch.no_grad():  # biases and norms that are not 0 and 1, so a pointer the stack dropped would show
        for block in model.layers:
            block.attn_norm.add_(torch.rand_like(block.attn_norm))
            block.wqkv.bias.normal_()
            block.wo.bias.normal_()
    x = torch.randn(rows, model.config.dim)
    slots = torch.zeros(rows, dtype=torch.long)
    positions = torch.tensor([7] * rows if tree else list(range(7, 7 + rows)), dtype=torch.long)

    cfg = model.config

    def run():
        cache = model.new_cache(32)
        cache.kv.normal_(generator=torch.Generator().manual_seed(5))  # the same history for both paths
        out = torch.full((cfg.n_layers, 2, rows, cfg.n_kv_heads, int(cfg.head_dim)), float("nan")) if kv else None
        with torch.inference_mode():
            return native_rows.run_layers(model, x.clone(), cache.kv, slots, positions, 0, layers, tree, out), \
                cache.kv, out

    fast, fast_kv, fast_out = run()
    assert native_rows._STACKS.get(model) is not None, "the one-call stack did not run"
    monkeypatch.setattr(native_rows, "_run_stack", lambda *a, **k: None)
    slow, slow_kv, slow_out = run()
    assert torch.equal(fast, slow) and torch.equal(fast_kv, slow_kv)
    if kv:  # the layers not run stay untouched (NaN) in both
        assert torch.allclose(fast_out, slow_out, equal_nan=True, rtol=0, atol=0)
        assert fast_out.isnan().any() == (layers is not None)


def test_the_cached_stack_sees_replaced_modules_converted_tensors_and_changed_weights():
    """The stack and the ends are checked in full only when the epoch moved (a module, parameter or buffer assigned
    anywhere, or a conversion); a float32 linear's in-place change is checked every forward; in-place norm changes
    are read where they lie. Each change must show in the logits exactly as on the modules' own path."""
    model = tiny_model(4)
    tokens = torch.tensor([[3, 17, 5]])

    def both():
        with torch.inference_mode():
            fast = model(tokens, 0, model.new_cache(8))
        with torch.inference_mode(), pytest.MonkeyPatch.context() as patched:
            patched.setattr(native_rows, "forward_logits", lambda *a, **k: None)
            patched.setattr(native_rows, "_run_stack", lambda *a, **k: None)
            slow = model(tokens, 0, model.new_cache(8))
        assert torch.equal(fast, slow)
        return fast

    before = both()
    with torch.no_grad():
        model.layers[1].w13.weight.mul_(1.5)  # in place: the linear's version moves, its pack is a copy
    changed = both()
    assert not torch.equal(changed, before)
    with torch.no_grad():
        model.layers[0].attn_norm.add_(0.25)  # in place: read where it lies
    both()
    model.layers[2].mlp_norm = torch.nn.Parameter(torch.full_like(model.layers[2].mlp_norm, 0.5))  # assigned
    both()
    model.norm = torch.nn.Parameter(model.norm.detach() * 2)  # the final norm, in the ends
    both()
    model.to(torch.float32)  # a conversion (no-op here, but it runs _apply: the epoch moves)
    both()
