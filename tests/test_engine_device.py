"""The engine at the hardware's limit (issue 23): native kernel, bandwidth figures, device threading.

No GPU here: the device is checked on the CPU. Every tensor the engine makes inside a request must be
placed explicitly on the model's device -- run under ``torch.device("meta")`` as the default device, a
tensor made without one lands on ``meta`` and the first op mixing it with the model's CPU tensors fails.
Host syncs are counted by a function mode that sees every read-back (``tolist``, ``item``, ``int()`` ...).
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from conftest import tiny_model
from torch.overrides import TorchFunctionMode

from specledger.engine import kernels
from specledger.engine.bandwidth import (
    decode_bytes_per_token,
    describe,
    kv_bytes_per_position,
    measure_read_bandwidth,
    request_bytes_per_token,
)
from specledger.engine.batch import BatchEngine, BatchRequest
from specledger.engine.decode import Engine
from specledger.engine.device import RoundClock, default_dtype, resolve_device
from specledger.engine.drafters.registry import make_drafter
from specledger.engine.layers import Linear
from specledger.engine.loader import parse_dtype
from specledger.engine.sampling import SamplingParams
from specledger.errors import SpecLedgerError

PROMPT = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3]


# -- the native kernel -----------------------------------------------------------------------------
needs_kernel = pytest.mark.skipif(kernels.lib() is None, reason=f"native kernel unavailable: {kernels.status()}")


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
def test_native_linear_is_row_invariant_and_close_to_f_linear(dtype, bias):
    torch.manual_seed(0)
    lin = Linear(48, 37, bias=bias).to(dtype)  # 37 outputs: a ragged last block of 8
    x = torch.randn(11, 48).to(dtype)
    with torch.inference_mode():
        full = lin(x)
        assert lin._native is not None
        for i in range(11):  # a row's bits never depend on how many rows share the call
            assert torch.equal(lin(x[i : i + 1]), full[i : i + 1])
        for start, n in ((0, 2), (3, 5), (4, 7)):
            assert torch.equal(lin(x[start : start + n]), full[start : start + n])
        ref = torch.nn.functional.linear(x.double(), lin.weight.double(),
                                         None if lin.bias is None else lin.bias.double())
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    assert (full.double() - ref).abs().max().item() < tol * max(1.0, ref.abs().max().item())


@needs_kernel
def test_native_linear_repacks_when_the_weight_changes_and_can_be_switched_off():
    lin = Linear(16, 8)
    x = torch.randn(2, 16)
    with torch.no_grad():
        first = lin(x)
        lin.weight.mul_(2.0)
        assert torch.allclose(lin(x), 2 * first, atol=1e-5)
        lin.native = False  # per instance: oneDNN (or F.linear) again
        assert lin(x).shape == (2, 8) and lin._native is None


def test_kernel_status_names_the_path():
    assert kernels.status().startswith(("native gemv", "off"))


def test_unsupported_shapes_fall_back():
    lin = Linear(20, 4)  # K % 16 != 0
    with torch.no_grad():
        y = lin(torch.randn(3, 20))
    assert lin._native is None and y.shape == (3, 4)


# -- bandwidth -------------------------------------------------------------------------------------
def test_bytes_per_token_is_weights_plus_kv_at_the_mean_context():
    model = tiny_model()
    cfg = model.config
    per_pos = kv_bytes_per_position(model)
    assert per_pos == cfg.n_layers * 2 * cfg.n_kv_heads * cfg.head_dim * 4
    assert decode_bytes_per_token(model) == model.weight_bytes()
    assert decode_bytes_per_token(model, 10) == model.weight_bytes() + 10 * per_pos
    # one request: prompt 10, 5 outputs -> 4 decode steps at contexts 10..13 -> mean 11.5
    assert request_bytes_per_token(model, [(10, 5)]) == pytest.approx(model.weight_bytes() + 12 * per_pos)


def test_read_bandwidth_probe_and_line():
    bw = measure_read_bandwidth(nbytes=1 << 20, repeats=2)
    assert bw > 0
    line = describe(538e6, 10.4, 24.9e9)
    assert line == "5.6 GB/s achieved (538 MB/token x 10.4 tok/s) = 22% of 24.9 GB/s measured read"


# -- devices ---------------------------------------------------------------------------------------
@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_cuda_is_a_one_line_error_naming_the_fix():
    with pytest.raises(SpecLedgerError) as err:
        resolve_device("cuda")
    msg = str(err.value)
    assert "\n" not in msg and "--device cpu" in msg and "CUDA build of torch" in msg


def test_device_names_and_default_dtypes():
    assert resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(SpecLedgerError, match="unknown --device"):
        resolve_device("tpu")
    assert default_dtype("cpu") == "float32" and default_dtype("cuda") == "bfloat16"
    assert parse_dtype("auto") == torch.float32 and parse_dtype("auto", "cuda") == torch.bfloat16


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
@pytest.mark.parametrize("verb", ["generate", "run", "serve", "calibrate"])
def test_cli_device_cuda_fails_in_one_line(verb, tmp_path):
    args = {"generate": ["-p", "hi"], "run": ["--quick", "--out", str(tmp_path / "r")], "serve": [],
            "calibrate": ["--out", str(tmp_path / "c.json")]}[verb]
    proc = subprocess.run([sys.executable, "-m", "specledger.cli", verb, *args, "--device", "cuda"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip() and "USDT" not in ln]
    assert len(lines) == 1 and "CUDA" in lines[0] and "--device cpu" in lines[0], lines
    assert not (tmp_path / "r").exists()


def test_round_clock_on_cpu_splits_host_time():
    clock = RoundClock("cpu")
    a, b, c = clock.mark(), clock.mark(), clock.mark()
    parts = clock.split(a, b, c)
    assert len(parts) == 2 and all(p >= 0 for p in parts)


class _Syncs(TorchFunctionMode):
    """Counts host read-backs (what would synchronise a GPU) while ``active``."""

    READS = {"tolist", "item", "__int__", "__float__", "__bool__", "__index__", "nonzero"}

    def __init__(self) -> None:
        super().__init__()
        self.active, self.count = False, 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if self.active and getattr(func, "__name__", "") in self.READS:
            self.count += 1
        return func(*args, **(kwargs or {}))


class _Watched:
    """The model with its forward inside the sync counter: a verify pass must not read back."""

    def __init__(self, model, syncs: _Syncs):
        self.model, self.syncs = model, syncs

    def __getattr__(self, name):
        return getattr(self.model, name)

    def __call__(self, *args, **kwargs):
        self.syncs.active = True
        try:
            return self.model(*args, **kwargs)
        finally:
            self.syncs.active = False


@pytest.mark.parametrize("temperature", [0.0, 0.9])
@pytest.mark.parametrize("drafter", ["none", "ngram", "layerskip", "quant-self"])
def test_every_tensor_of_a_request_is_placed_on_the_model_device(drafter, temperature):
    model = tiny_model(n_layers=3)
    engine = Engine(model, eos_token_ids=[], max_context=256)
    params = SamplingParams(temperature=temperature, seed=3)

    def go():
        d = make_drafter(drafter, engine, layers="0,2" if drafter == "layerskip" else None)
        return engine.generate(PROMPT, drafter=d, gamma=0 if drafter == "none" else 3, params=params,
                               max_tokens=24, ignore_eos=True).token_ids

    reference = go()
    engine._cache = None
    with torch.device("meta"):  # any tensor made without an explicit device lands on meta and breaks
        placed = go()
    assert placed == reference and len(placed) == 24


def test_packed_batch_places_every_tensor_on_the_model_device():
    model = tiny_model()
    requests = [BatchRequest(PROMPT[: 5 + i], max_tokens=12, ignore_eos=True, request_id=str(i)) for i in range(3)]

    def go():
        be = BatchEngine(model, max_batch=3, capacity=64)
        recs = be.run(requests, lambda: make_drafter("ngram", None), gamma=3)
        return sorted((r.request_id, r.token_ids) for r in recs)

    reference = go()
    with torch.device("meta"):
        assert go() == reference


def test_the_verify_forward_reads_nothing_back_and_the_commit_once():
    syncs = _Syncs()
    model = tiny_model()
    engine = Engine(model, eos_token_ids=[], max_context=256)
    engine.model = _Watched(model, syncs)
    with syncs:
        rec = engine.generate(PROMPT, drafter=make_drafter("ngram", engine), gamma=3, max_tokens=20,
                              ignore_eos=True)
    assert len(rec.token_ids) == 20 and len(rec.rounds) >= 1
    assert syncs.count == 0  # no read-back in the prefill or any verify pass: only the commit reads


@needs_kernel
@pytest.mark.parametrize("drafter", ["ngram", "layerskip", "quant-self"])
def test_bf16_greedy_speculation_is_token_identical_on_the_native_kernel(drafter):
    """The native kernel is row-invariant in bf16 too, so bf16 verify rows equal bf16 decode rows."""
    for seed in range(3):
        engine = Engine(tiny_model(seed, dim=64).to(torch.bfloat16), eos_token_ids=[], max_context=256)
        for prompt in (PROMPT, [5, 9, 5, 9, 5, 9, 7]):
            plain = engine.generate(prompt, max_tokens=40, ignore_eos=True).token_ids
            d = make_drafter(drafter, engine, layers="0,1" if drafter == "layerskip" else None)
            assert engine.generate(prompt, drafter=d, gamma=3, max_tokens=40, ignore_eos=True).token_ids == plain
