"""specledger serve: OpenAI-compatible routes, vLLM metrics, queueing, robustness (loopback only)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from specledger.cli.serve import serve
from specledger.engine.decode import Engine
from specledger.engine.drafters.ngram import NgramDrafter
from specledger.errors import SpecLedgerError
from specledger.probe.histograms import histogram_delta, histogram_from_snapshot
from specledger.probe.loadgen import LoadConfig, PromptItem, run_load
from specledger.probe.prometheus import counter_by_label, counter_total, gauge_mean, parse_prometheus_text
from specledger.probe.spec_figures import spec_decode_figures
from specledger.probe.sse import OpenAIStreamDecoder
from specledger.records import RoundRecord
from specledger.serve.app import create_app, goodput_step_cost, max_positions, parse_gamma
from specledger.serve.hardening import Limits
from specledger.serve.metrics import draft_counts
from specledger.serve.options import check_serve_options, is_loopback
from specledger.serve.protocol import RequestError, check_common, resolve_max_tokens, stream_chunk
from specledger.serve.runner import ServerThread
from tests.conftest import CharTokenizer, tiny_model

TOKENIZER = CharTokenizer()


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Tiny forwards on a busy 2-core machine are ~50x slower with 2 intra-op threads (barrier waits
    against the server, client and other processes); one thread keeps this file fast. Restored after."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
MODEL = "tiny-serve"
CONTEXT = 256


def tiny_encoder(prompt: str | None, messages: list[dict] | None) -> list[int]:
    """Raw text as characters; chat as ``role: content; ... assistant:`` (CharTokenizer has no template)."""
    if messages is not None:
        prompt = "; ".join(f"{m['role']}: {m['content']}" for m in messages) + "; assistant:"
    return TOKENIZER.encode(prompt)


def tiny_engine() -> Engine:
    vocab = len(CharTokenizer.ALPHABET)
    return Engine(tiny_model(5, vocab=vocab, n_layers=2, dim=32, max_seq_len=CONTEXT), TOKENIZER,
                  eos_token_ids=[TOKENIZER.encode("!")[0]], max_context=CONTEXT, name="tiny")


KEEP = 1000  # records (and batch steps) kept by the apps of the tests that read them; the server default is 0


def tiny_app(max_queue: int = 16, drafter: str = "ngram", gamma: int | str = 4, max_batch: int = 8,
             drafter_obj=None, limits: Limits | None = None, keep_records: int = 0, encode=None):
    return create_app(tiny_engine(), drafter, gamma, model_name=MODEL, max_queue=max_queue, max_batch=max_batch,
                      drafter=drafter_obj, layers="1" if drafter == "layerskip" else None,
                      encode=encode or tiny_encoder, limits=limits, keep_records=keep_records)


def solo_greedy(prompt: str, max_tokens: int, **kwargs):
    """The reference: plain greedy decoding of the same tiny model by the solo engine (its own copy)."""
    return tiny_engine().generate(TOKENIZER.encode(prompt), max_tokens=max_tokens, **kwargs)


PROMPTS = [
    "abc abc abc abc", "the cat sat on the mat the cat", "0101010101", "hello world hello",
    "xyz", "aaaa bbbb aaaa bbbb", "def f(x): return x", "one two three one two",
    "A B C A B C", "spec spec spec", "[1, 2, 3, 1, 2, 3]", "qwerty",
]


def scrape(client: httpx.Client):
    r = client.get("/metrics")
    assert r.status_code == 200
    return parse_prometheus_text(r.text)


def rounds_of(records) -> list[RoundRecord]:
    return [rnd for rec in records for rnd in rec.rounds]


def expected_spec_counters(rounds: list[RoundRecord]) -> dict:
    """What vLLM would count for these rounds, straight from the engine's own records."""
    drafts = [r for r in rounds if r.proposed > 0]
    per_pos = Counter(p for r in drafts for p in range(r.accepted))
    return {
        "drafts": len(drafts),
        "draft_tokens": sum(r.proposed for r in drafts),
        "accepted": sum(r.accepted for r in drafts),
        "per_pos": dict(per_pos),
    }


def read_sse(text: str) -> tuple[str, str | None, dict | None, bool]:
    """(joined text, last finish_reason, usage, saw [DONE]) of a complete SSE body."""
    decoder = OpenAIStreamDecoder()
    parts, finish, usage, done = [], None, None, False
    for chunk in decoder.feed(text) + decoder.close():
        assert chunk.kind != "error", chunk.error
        if chunk.kind == "done":
            done = True
        parts.append(chunk.text)
        finish = chunk.finish_reason or finish
        usage = chunk.usage or usage
    return "".join(parts), finish, usage, done


# --- pure pieces ----------------------------------------------------------------------------


@given(st.integers(0, 8).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n))), st.booleans())
def test_draft_counts_follow_vllm(proposed_accepted: tuple[int, int], truncated: bool) -> None:
    proposed, accepted = proposed_accepted
    rnd = RoundRecord("ngram", 8, proposed, accepted, 1 if truncated else accepted + 1, truncated, 0, 0, 0, 10)
    c = draft_counts(rnd)
    if proposed == 0:  # no candidates: not a draft, whatever else happened
        assert (c.drafts, c.draft_tokens, c.accepted, len(c.positions)) == (0, 0, 0, 0)
    else:  # truncated rounds count the verified K, as vLLM does
        assert (c.drafts, c.draft_tokens, c.accepted) == (1, proposed, accepted)
        assert list(c.positions) == list(range(accepted))


def test_gamma_parsing_and_options() -> None:
    assert parse_gamma(3)() == 3 and parse_gamma("5")() == 5
    assert parse_gamma("heuristic")().name == "heuristic"
    assert parse_gamma("heuristic")() is not parse_gamma("heuristic")()  # fresh per request
    shared = object()
    make = parse_gamma("goodput", step_cost=shared)
    assert make().step_cost is shared and make() is not make()  # fresh policies, one measured step cost
    for bad in (-1, "fast", "-2"):
        with pytest.raises(SpecLedgerError):
            parse_gamma(bad)
    assert max_positions(4) == 4 and max_positions("heuristic") == 16
    assert resolve_max_tokens(None, 10, 256) == 128 and resolve_max_tokens(None, 200, 256) == 56
    assert resolve_max_tokens(500, 10, 256) == 500  # explicit values reach the engine's check
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.0.0.1")
    with pytest.raises(SpecLedgerError, match="drafter"):
        check_serve_options(8000, "magic", "4", 64)
    with pytest.raises(SpecLedgerError, match="gamma"):
        serve(gamma="lots")  # rejected before any model is loaded
    with pytest.raises(SpecLedgerError, match="max-queue"):
        check_serve_options(8000, "ngram", "4", 0)
    with pytest.raises(SpecLedgerError, match="max-batch"):
        check_serve_options(8000, "ngram", "4", 64, 0)
    with pytest.raises(SpecLedgerError, match="max-body-bytes"):
        check_serve_options(8000, "ngram", "4", 64, 8, max_body_bytes=100)
    with pytest.raises(SpecLedgerError, match="max-connections"):
        check_serve_options(8000, "ngram", "4", 64, 8, max_connections=50)
    with pytest.raises(SpecLedgerError, match="max_batch"):
        tiny_app(max_batch=0)


def test_protocol_shapes() -> None:
    chunk = stream_chunk("chat", "id", "m", 1, "hi")
    assert chunk["object"] == "chat.completion.chunk" and chunk["choices"][0]["delta"] == {"content": "hi"}
    assert stream_chunk("chat", "id", "m", 1, None, role=True)["choices"][0]["delta"]["role"] == "assistant"
    closing = stream_chunk("completion", "id", "m", 1, "", "length")["choices"][0]
    assert closing["text"] == "" and closing["finish_reason"] == "length"
    from specledger.serve.protocol import CompletionRequest

    with pytest.raises(RequestError) as err:
        check_common(CompletionRequest(prompt="x", model="/etc/passwd"), MODEL)
    assert err.value.status == 404 and "does not exist" in err.value.message


# --- end to end on loopback --------------------------------------------------------------


@pytest.mark.parametrize("max_batch", [1, 4])
def test_end_to_end_probe_matches_engine_records(max_batch: int) -> None:
    app = tiny_app(max_queue=16, max_batch=max_batch, keep_records=KEEP)
    records = app.state.records
    with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=60) as client:
        assert client.get("/health").status_code == 200
        assert [m["id"] for m in client.get("/v1/models").json()["data"]] == [MODEL]
        before = scrape(client)
        config = LoadConfig(base_url=server.url, model=MODEL, max_tokens=24, temperature=0.0, concurrency=4,
                            num_requests=12)
        run = asyncio.run(run_load(config, [PromptItem(prompt=p) for p in PROMPTS], tokenizer=TOKENIZER.encode))
        after = scrape(client)

        assert all(r.ok and r.saw_done and r.finish_reason in ("stop", "length") for r in run.results)
        served = list(records)
        assert len(served) == 12
        # the probe's per-request view equals the engine's: text, token count, chunking
        probe_view = Counter((r.output_text, r.usage_completion_tokens, tuple(r.chunk_tokens)) for r in run.results)
        engine_view = Counter((rec.text, rec.output_tokens, tuple(rec.chunks)) for rec in served)
        assert probe_view == engine_view
        assert sum(r.completion_tokens for r in run.results) == sum(rec.output_tokens for rec in served)

        # spec-decode counters: metric deltas == the engine's own round records
        want = expected_spec_counters(rounds_of(served))
        assert want["drafts"] > 0  # the n-gram drafter found repeats in these prompts
        figures = spec_decode_figures(before, after)
        assert figures.source == "vllm"
        assert figures.num_drafts == want["drafts"]
        assert figures.num_draft_tokens == want["draft_tokens"]
        assert figures.num_accepted_tokens == want["accepted"]
        delta_pos = {p: after_v - counter_by_label(before, "vllm:spec_decode_num_accepted_tokens_per_pos",
                                                   "position").get(str(p), 0.0)
                     for p, after_v in ((int(k), v) for k, v in counter_by_label(
                         after, "vllm:spec_decode_num_accepted_tokens_per_pos", "position").items())}
        assert {p: v for p, v in delta_pos.items() if v} == want["per_pos"]

        # token counters, finished reasons and histogram counts
        def delta(name: str) -> float:
            return counter_total(after, name) - (counter_total(before, name) or 0.0)

        assert delta("vllm:prompt_tokens") == sum(rec.prompt_tokens for rec in served)
        assert delta("vllm:generation_tokens") == sum(rec.output_tokens for rec in served)
        reasons = Counter("length" if rec.stop_reason == "length" else "stop" for rec in served)
        success = counter_by_label(after, "vllm:request_success", "finished_reason")
        assert {k: v for k, v in success.items() if v} == dict(reasons)
        ttft = histogram_delta(histogram_from_snapshot(before, "vllm:time_to_first_token_seconds"),
                               histogram_from_snapshot(after, "vllm:time_to_first_token_seconds"))
        itl = histogram_delta(histogram_from_snapshot(before, "vllm:inter_token_latency_seconds"),
                              histogram_from_snapshot(after, "vllm:inter_token_latency_seconds"))
        assert ttft.count == 12 and itl.count == sum(len(rec.chunks) - 1 for rec in served)
        assert histogram_from_snapshot(after, "vllm:e2e_request_latency_seconds").count == 12

        # streamed text == non-streamed text for the same request (completions and chat)
        for prompt in PROMPTS[:4]:
            body = {"model": MODEL, "prompt": prompt, "max_tokens": 24, "temperature": 0}
            plain = client.post("/v1/completions", json=body).json()
            streamed = client.post("/v1/completions", json={**body, "stream": True,
                                                            "stream_options": {"include_usage": True}})
            text, finish, usage, done = read_sse(streamed.text)
            assert done and text == plain["choices"][0]["text"] and finish == plain["choices"][0]["finish_reason"]
            assert usage == plain["usage"]
            assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
            assert usage["prompt_tokens"] == len(prompt)
        chat = {"messages": [{"role": "user", "content": "abc abc abc"}], "max_tokens": 16, "temperature": 0}
        plain = client.post("/v1/chat/completions", json=chat).json()
        assert plain["object"] == "chat.completion" and plain["choices"][0]["message"]["role"] == "assistant"
        streamed = client.post("/v1/chat/completions", json={**chat, "stream": True})
        text, finish, usage, done = read_sse(streamed.text)
        assert done and usage is None and text == plain["choices"][0]["message"]["content"]
        assert finish == plain["choices"][0]["finish_reason"]
        assert streamed.headers["content-type"].startswith("text/event-stream")

        idle = scrape(client)
        assert gauge_mean(idle, "vllm:num_requests_running") == 0
        assert gauge_mean(idle, "vllm:num_requests_waiting") == 0


def test_disconnect_mid_stream_frees_the_slot() -> None:
    app = tiny_app(max_queue=4, keep_records=KEEP)
    service = app.state.service
    long = {"prompt": "abc abc", "max_tokens": 200, "temperature": 0, "ignore_eos": True, "stream": True}
    with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=60) as client:
        with client.stream("POST", "/v1/completions", json=long) as response:
            assert response.status_code == 200
            next(response.iter_bytes())  # first chunk, then hang up
        # the next request is served, and the abandoned one never finished its 200 tokens
        ok = client.post("/v1/completions", json={"prompt": "xyz", "max_tokens": 5, "temperature": 0})
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] <= 5
        assert all(rec.output_tokens < 200 for rec in app.state.records)
        assert len(service.worker.aborted_rounds) >= 1
        idle = scrape(client)
        assert gauge_mean(idle, "vllm:num_requests_running") == 0
        assert gauge_mean(idle, "vllm:num_requests_waiting") == 0


async def _robustness_storm(url: str, expected: dict[str, str]) -> Counter:
    """~200 mixed requests at once; asserts each answer and returns a tally of outcomes."""
    bad_bodies = [
        b"{", b"not json", b"[1, 2]", b'"prompt"', b"", b"[" * 100000,
        json.dumps({"prompt": 5}).encode(), json.dumps({"prompt": ["a", "b"]}).encode(),
        json.dumps({"prompt": "abc", "max_tokens": "8"}).encode(),
        json.dumps({"prompt": "abc", "max_tokens": True}).encode(),
        json.dumps({"prompt": "abc", "temperature": -1}).encode(),
        json.dumps({"prompt": "abc", "temperature": 2.5}).encode(),
        json.dumps({"prompt": "abc", "top_p": 0}).encode(),
        json.dumps({"prompt": "abc", "n": 2}).encode(),
        json.dumps({"prompt": "abc", "max_tokens": 0}).encode(),
        json.dumps({"prompt": "abc", "max_tokens": 10**9}).encode(),
        json.dumps({"prompt": "abc " * 2000, "max_tokens": 8}).encode(),
        json.dumps({"prompt": "abc", "stop": 7}).encode(),
        json.dumps({"prompt": "", "max_tokens": 4}).encode(),
        json.dumps({"prompt": "\u00e9\u00e9", "max_tokens": 4}).encode(),
        json.dumps({"prompt": "abc", "seed": -3}).encode(),
        json.dumps({"prompt": "abc", "stream_options": "yes"}).encode(),
    ]
    # refused only once encoded (context, vocabulary, empty prompt): the queue check comes first, so 429 when full
    after_encoding = {json.dumps(b).encode() for b in ({"prompt": "abc", "max_tokens": 10**9},
                                                       {"prompt": "abc " * 2000, "max_tokens": 8},
                                                       {"prompt": "", "max_tokens": 4},
                                                       {"prompt": "\u00e9\u00e9", "max_tokens": 4})}
    assert after_encoding <= set(bad_bodies)
    tally: Counter = Counter()

    async def bad(client: httpx.AsyncClient, body: bytes) -> None:
        r = await client.post("/v1/completions", content=body, headers={"content-type": "application/json"})
        if r.status_code == 429 and body in after_encoding:
            tally["bad 429"] += 1
            return
        assert r.status_code == 400, (body[:60], r.text)
        assert r.json()["error"]["type"] == "invalid_request_error"
        tally["400"] += 1

    async def wrong_model(client: httpx.AsyncClient) -> None:
        r = await client.post("/v1/chat/completions",
                              json={"model": "../../weights.gguf", "messages": [{"role": "user", "content": "a"}]})
        assert r.status_code == 404 and "does not exist" in r.json()["error"]["message"]
        tally["404"] += 1

    async def good(client: httpx.AsyncClient, prompt: str, stream: bool) -> None:
        body = {"model": MODEL, "prompt": prompt, "max_tokens": 8, "temperature": 0, "stream": stream}
        r = await client.post("/v1/completions", json=body)
        if r.status_code == 429:
            assert int(r.headers["retry-after"]) >= 1
            assert r.json()["error"]["type"] == "rate_limit_error"
            tally["429"] += 1
            return
        assert r.status_code == 200, r.text
        text = read_sse(r.text)[0] if stream else r.json()["choices"][0]["text"]
        assert text == expected[prompt]
        tally["200"] += 1

    async def hang_up(client: httpx.AsyncClient, prompt: str) -> None:
        body = {"prompt": prompt, "max_tokens": 40, "temperature": 0, "ignore_eos": True, "stream": True}
        async with client.stream("POST", "/v1/completions", json=body) as r:
            if r.status_code == 200:
                async for _ in r.aiter_bytes():
                    break
                tally["hang-up"] += 1
            else:
                assert r.status_code == 429
                tally["429"] += 1

    async def impatient(client: httpx.AsyncClient) -> None:  # non-streaming client that gives up
        body = {"prompt": "abc abc", "max_tokens": 150, "temperature": 0, "ignore_eos": True}
        try:
            r = await client.post("/v1/completions", json=body, timeout=0.05)
            assert r.status_code in (200, 429)
        except httpx.TimeoutException:
            tally["timeout"] += 1

    prompts = list(expected)
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=64)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:
        jobs = []
        for i in range(200):
            kind = i % 10
            if kind in (0, 1, 2):
                jobs.append(bad(client, bad_bodies[i % len(bad_bodies)]))
            elif kind == 3:
                jobs.append(wrong_model(client) if i % 20 == 3 else impatient(client))
            elif kind in (4, 5):
                jobs.append(hang_up(client, prompts[i % len(prompts)]))
            else:
                jobs.append(good(client, prompts[i % len(prompts)], stream=kind % 2 == 0))
        # three bursts: the queue (2 slots) overflows in each
        for start in range(0, 200, 70):
            await asyncio.gather(*jobs[start:start + 70])
        # after the storm, every well-formed request is served
        for prompt in prompts:
            await good(client, prompt, stream=True)
    return tally


def test_robustness_storm_keeps_serving_and_leaks_no_slots() -> None:
    app = tiny_app(max_queue=2, keep_records=KEEP)
    service = app.state.service
    with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=60) as client:
        expected = {}
        for prompt in PROMPTS[:6]:
            r = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 8, "temperature": 0})
            expected[prompt] = r.json()["choices"][0]["text"]
        before = scrape(client)
        served_before = len(app.state.records)

        tally = asyncio.run(_robustness_storm(server.url, expected))
        assert (tally["400"] + tally["bad 429"] == 60 and tally["400"] > 0 and tally["404"] == 10
                and tally["429"] > 0 and tally["200"] >= len(PROMPTS[:6]))
        assert tally["hang-up"] > 0

        # server alive; gauges back to 0 (the worker finishes the round it is in, then stops)
        assert wait_idle(client), "running/waiting gauges did not return to 0"
        assert service.queue.taken == 0  # every place the worker took was given back
        assert client.get("/health").status_code == 200
        after = scrape(client)
        # every counted draft round is in a finished record or in an aborted request's rounds
        finished = list(app.state.records)[served_before:]
        want = expected_spec_counters(rounds_of(finished) + list(service.worker.aborted_rounds))
        figures = spec_decode_figures(before, after)
        assert figures.num_drafts == want["drafts"] and figures.num_accepted_tokens == want["accepted"]
        assert figures.num_draft_tokens == want["draft_tokens"]


def wait_idle(client: httpx.Client, tries: int = 200) -> bool:
    """Poll the gauges until nothing runs or waits (True) or ``tries`` scrapes pass (False)."""
    for _ in range(tries):
        snap = scrape(client)
        if gauge_mean(snap, "vllm:num_requests_running") == 0 and gauge_mean(snap, "vllm:num_requests_waiting") == 0:
            return True
        time.sleep(0.05)
    return False


# --- the real model --------------------------------------------------------------------------


@pytest.mark.real_model
def test_real_model_chat_completion() -> None:
    from specledger.engine.build import build_engine

    app = create_app(build_engine(None), "ngram", 4, max_queue=4, keep_records=10)
    name = app.state.service.model_name
    with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=300) as client:
        chat = {"model": name, "messages": [{"role": "user", "content": "What is the capital of France?"}],
                "max_tokens": 24, "temperature": 0}
        r = client.post("/v1/chat/completions", json=chat)
        assert r.status_code == 200, r.text
        body = r.json()
        content = body["choices"][0]["message"]["content"]
        assert isinstance(content, str) and content.strip()
        assert "<|im_end|>" not in content and "<|im_start|>" not in content
        assert 0 < body["usage"]["completion_tokens"] <= 24 and body["usage"]["prompt_tokens"] > 5
        streamed = client.post("/v1/chat/completions", json={**chat, "stream": True})
        text, finish, _, done = read_sse(streamed.text)
        assert done and text == content and finish == body["choices"][0]["finish_reason"]
        rec = app.state.records[-1]
        assert rec.output_tokens == body["usage"]["completion_tokens"]


# --- continuous batching in the server ---------------------------------------------------------


class Gate:
    """Lets the test hold the engine thread: a proposal waits for a permit until the gate opens."""

    def __init__(self) -> None:
        self._permits = threading.Semaphore(0)
        self._open = threading.Event()

    def pass_through(self) -> None:
        if not self._open.is_set():
            assert self._permits.acquire(timeout=30), "the test never let the engine go on"

    def allow(self, n: int) -> None:
        self._permits.release(n)

    def open(self) -> None:
        self._open.set()
        self._permits.release(1000)


class GatedDrafter(NgramDrafter):
    """n-gram drafting that passes the gate before every proposal (forks share the gate)."""

    def __init__(self, gate: Gate) -> None:
        super().__init__()
        self.gate = gate

    def fork(self) -> GatedDrafter:
        return GatedDrafter(self.gate)

    def propose(self, context, gamma, params, rng):
        self.gate.pass_through()
        return super().propose(context, gamma, params, rng)


def gauges(client: httpx.Client) -> tuple[float, float]:
    snap = scrape(client)
    return gauge_mean(snap, "vllm:num_requests_running"), gauge_mean(snap, "vllm:num_requests_waiting")


def wait_for(condition, what: str, tries: int = 600) -> None:
    for _ in range(tries):
        if condition():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def test_batched_streams_get_their_solo_outputs_and_the_running_gauge_counts_the_batch() -> None:
    gate = Gate()
    app = tiny_app(max_queue=8, max_batch=4, drafter_obj=GatedDrafter(gate), keep_records=KEEP)
    prompts = PROMPTS[:4]
    want = {p: solo_greedy(p, 30, ignore_eos=True).text for p in prompts}
    results: dict[str, tuple] = {}

    def fetch(url: str, prompt: str) -> None:
        body = {"prompt": prompt, "max_tokens": 30, "temperature": 0, "ignore_eos": True, "stream": True}
        with httpx.Client(base_url=url, timeout=60) as c:
            results[prompt] = read_sse(c.post("/v1/completions", json=body).text)

    with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=60) as client:
        threads = [threading.Thread(target=fetch, args=(server.url, p)) for p in prompts]
        for t in threads:
            t.start()
        # the first request(s) hold the engine at their first proposal; the rest queue up
        wait_for(lambda: sum(gauges(client)) == 4, "all four requests to be admitted")
        running, _ = gauges(client)
        assert running >= 1
        gate.allow(int(running))  # that step ends; the queued requests join the batch
        wait_for(lambda: gauges(client) == (4, 0), "a batch of four")
        gate.open()
        for t in threads:
            t.join(60)
        assert wait_idle(client), "running/waiting gauges did not return to 0"
    for prompt in prompts:
        text, finish, _, done = results[prompt]
        assert done and finish == "length" and text == want[prompt], prompt
    assert max(s.batch_size for s in app.state.service.worker.batch.steps) == 4


def test_batched_stop_strings_and_max_tokens_cut_like_solo() -> None:
    """More concurrent requests than slots, each with its own stop strings / max_tokens / EOS setting:
    text, finish reason and token count equal the solo engine's, streamed or not."""
    cases = []
    for i, prompt in enumerate(PROMPTS):
        plain = solo_greedy(prompt, 24, ignore_eos=True).text
        stop = [plain[6:8]] if i % 3 == 0 else [plain[10:13], "@@"] if i % 3 == 1 else []
        max_tokens = 5 + 3 * (i % 5)
        ref = solo_greedy(prompt, max_tokens, stop=stop, ignore_eos=i % 2 == 0)
        body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stop": stop, "ignore_eos": i % 2 == 0,
                "stream": i % 2 == 1}
        cases.append((body, ref))
    assert {ref.stop_reason for _, ref in cases} >= {"stop", "length"}

    async def run_all(url: str) -> list:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            return await asyncio.gather(*(client.post("/v1/completions", json=body) for body, _ in cases))

    app = tiny_app(max_queue=16, max_batch=4, keep_records=KEEP)
    with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=60) as client:
        responses = asyncio.run(run_all(server.url))
        assert wait_idle(client)
    for (body, ref), r in zip(cases, responses):
        assert r.status_code == 200, r.text
        if body["stream"]:
            text, finish, _, done = read_sse(r.text)
            assert done
        else:
            choice = r.json()["choices"][0]
            text, finish = choice["text"], choice["finish_reason"]
            assert r.json()["usage"]["completion_tokens"] == ref.output_tokens
        assert text == ref.text and finish == ("length" if ref.stop_reason == "length" else "stop"), body
    assert max(s.batch_size for s in app.state.service.worker.batch.steps) > 1


def test_cancelling_a_batched_stream_frees_its_slot_for_a_waiting_request() -> None:
    gate = Gate()
    app = tiny_app(max_queue=4, max_batch=2, drafter_obj=GatedDrafter(gate), keep_records=KEEP)
    worker = app.state.service.worker
    long = {"prompt": "abc abc", "max_tokens": 200, "temperature": 0, "ignore_eos": True, "stream": True}
    short = {"prompt": "xyz", "max_tokens": 5, "temperature": 0, "ignore_eos": True}
    replies: dict[str, httpx.Response] = {}

    def post(url: str, name: str, body: dict) -> None:
        with httpx.Client(base_url=url, timeout=60) as c:
            replies[name] = c.post("/v1/completions", json=body)

    with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=60) as client:
        with client.stream("POST", "/v1/completions", json=long) as hung:  # A: held at its first proposal
            assert hung.status_code == 200
            wait_for(lambda: gauges(client) == (1, 0), "A in the batch")
            b = threading.Thread(target=post, args=(server.url, "B", {**long, "prompt": "abc def"}))
            b.start()
            wait_for(lambda: gauges(client) == (1, 1), "B queued")
            gate.allow(1)  # A's step ends, B joins the batch: both slots taken
            wait_for(lambda: gauges(client) == (2, 0), "A and B in the batch")
            c = threading.Thread(target=post, args=(server.url, "C", short))
            c.start()
            wait_for(lambda: gauges(client) == (2, 1), "C waiting for a slot")
        # A's client hung up: the next step boundary drops A, and C takes its slot while B runs on
        first = next(iter(worker.active.values())).job
        wait_for(first.cancel_flag.is_set, "the server to notice the hang-up")
        gate.open()
        b.join(60)
        c.join(60)
        assert wait_idle(client), "running/waiting gauges did not return to 0"
    assert replies["C"].json()["choices"][0]["text"] == solo_greedy("xyz", 5, ignore_eos=True).text
    assert [rec.output_tokens for rec in app.state.records] == [5, 200]  # C finished first: A's slot
    assert len(worker.aborted_rounds) >= 1 and all(r.batch_size <= 2 for r in worker.aborted_rounds)


def test_an_engine_failure_outside_any_request_fails_the_batch_and_the_server_keeps_serving(monkeypatch) -> None:
    """The packed forward itself raising cannot be blamed on one request: that step's requests get
    a 500 without internal detail; the next request is served exactly."""
    app = tiny_app(max_queue=8, max_batch=4)
    model = app.state.service.worker.batch.model
    real = model.forward_packed
    armed = [True]

    def exploding(*args, **kwargs):
        if armed[0]:
            armed[0] = False
            raise RuntimeError("boom /secret/path")
        return real(*args, **kwargs)

    monkeypatch.setattr(model, "forward_packed", exploding)
    with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=60) as client:
        body = {"prompt": "abc abc", "max_tokens": 8, "temperature": 0}
        failed = client.post("/v1/completions", json=body)
        assert failed.status_code == 500, failed.text
        error = failed.json()["error"]
        assert error["type"] == "server_error" and "boom" not in error["message"] and "secret" not in failed.text
        streamed = client.post("/v1/completions", json={**body, "stream": True})
        text, _, _, done = read_sse(streamed.text)
        assert done and text == solo_greedy("abc abc", 8).text
        assert wait_idle(client)
        assert counter_total(scrape(client), "specledger:request_failures") == 1


@pytest.mark.parametrize("drafter,gamma", [("suffix", "heuristic"), ("layerskip", 2), ("none", 0)])
def test_batched_drafters_and_policies_stay_exact(drafter: str, gamma: int | str) -> None:
    """Per-request drafters forked from the server's (weights and the suffix trie shared) and
    per-request policies: concurrent greedy outputs equal plain solo decoding."""
    prompts = PROMPTS[:6]
    want = {p: solo_greedy(p, 16).text for p in prompts}

    async def run_all(url: str) -> list:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            return await asyncio.gather(*(client.post("/v1/completions", json={
                "prompt": p, "max_tokens": 16, "temperature": 0}) for p in prompts))

    app = tiny_app(max_queue=8, max_batch=3, drafter=drafter, gamma=gamma, keep_records=KEEP)
    with ServerThread(app) as server:
        responses = asyncio.run(run_all(server.url))
    assert [r.json()["choices"][0]["text"] for r in responses] == [want[p] for p in prompts]
    records = list(app.state.records)
    assert len(records) == 6 and {rec.drafter for rec in records} == {drafter}
    if gamma == "heuristic":
        assert {rec.gamma for rec in records} == {"heuristic"}


def test_goodput_server_measures_its_step_cost_once(target) -> None:
    from specledger.cost.step_cost import StepCost
    from specledger.engine.decode import Engine

    engine = Engine(target)
    cost = goodput_step_cost(engine, "goodput")
    assert isinstance(cost, StepCost) and cost.forward_s(64) >= cost.forward_s(1) > 0
    assert goodput_step_cost(engine, 4) is None and goodput_step_cost(engine, "heuristic") is None


# --- issue 12: no request can harm another; hostile-but-fair clients ---------------------------


class BombDrafter(NgramDrafter):
    """n-gram drafting behind the gate that raises, once the gate is open (the batch formed), for
    the requests whose prompt starts with "bomb"."""

    def __init__(self, gate: Gate) -> None:
        super().__init__()
        self.gate = gate

    def fork(self) -> BombDrafter:
        return BombDrafter(self.gate)

    def propose(self, context, gamma, params, rng):
        self.gate.pass_through()
        if self.gate._open.is_set() and TOKENIZER.decode(list(context[:4])) == "bomb":
            raise RuntimeError("boom /secret/path")
        return super().propose(context, gamma, params, rng)


def _batched_posts(url: str, bodies: list[dict], client: httpx.Client, gate: Gate, batch: int) -> list[httpx.Response]:
    """Post ``bodies`` concurrently while the gate holds the engine; let go once ``batch`` run together."""
    replies: list = [None] * len(bodies)

    def post(i: int) -> None:
        with httpx.Client(base_url=url, timeout=60) as c:
            replies[i] = c.post("/v1/completions", json=bodies[i])

    threads = [threading.Thread(target=post, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    wait_for(lambda: sum(gauges(client)) == len(bodies), "every request admitted")
    # Let the engine through one proposal at a time until the waiting requests have joined the batch
    # (the running gauge may lag the step the engine is blocked in, so no fixed number of permits).
    for _ in range(600):
        if gauges(client)[0] == batch:
            break
        gate.allow(1)
        time.sleep(0.05)
    wait_for(lambda: gauges(client)[0] == batch, f"a batch of {batch}")
    gate.open()
    for t in threads:
        t.join(60)
    return replies


def test_extreme_sampling_values_cannot_fail_their_batch() -> None:
    """Issue 12 item 1: temperature 1e-40 (greedy) and top_p 1e-300 (top token only) in a batch of 8:
    all 8 answer 200, and each of those two equals plain greedy decoding."""
    gate = Gate()
    app = tiny_app(max_queue=8, max_batch=8, drafter_obj=GatedDrafter(gate), keep_records=KEEP)
    prompts = PROMPTS[:8]
    bodies = [{"prompt": p, "max_tokens": 12, "temperature": 0, "ignore_eos": True} for p in prompts]
    bodies[2] = {**bodies[2], "temperature": 1e-40}
    bodies[5] = {**bodies[5], "temperature": 1.0, "top_p": 1e-300, "seed": 3}
    bodies[6] = {**bodies[6], "temperature": 2.0, "top_k": 1, "seed": 4}  # top-1 sampling is greedy too
    bodies[7] = {**bodies[7], "temperature": 1e-5, "top_p": 5e-324, "top_k": 10**9, "seed": 5}
    with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=60) as client:
        replies = _batched_posts(server.url, bodies, client, gate, batch=8)
        assert wait_idle(client)
    assert [r.status_code for r in replies] == [200] * 8, [r.text for r in replies if r.status_code != 200]
    for body, reply in zip(bodies, replies):
        if body is not bodies[7]:  # 1e-5 is sampled at T = 1e-5: any output is fine, only not a failure
            assert reply.json()["choices"][0]["text"] == solo_greedy(body["prompt"], 12, ignore_eos=True).text, body
    assert max(s.batch_size for s in app.state.service.worker.batch.steps) == 8


def test_a_request_whose_drafter_raises_fails_alone() -> None:
    """Issue 12 item 1: one request's drafter raises inside a batch step: that request alone gets a
    500 (OpenAI-shaped, no internal text), streamed or not; the others get their solo outputs."""
    gate = Gate()
    app = tiny_app(max_queue=8, max_batch=6, drafter_obj=BombDrafter(gate), keep_records=KEEP)
    prompts = PROMPTS[:4]
    bodies = [{"prompt": p, "max_tokens": 16, "temperature": 0, "ignore_eos": True} for p in prompts]
    # ignore_eos: no request may finish (a sampled one could draw EOS) before the batch of 6 has formed
    bodies += [{"prompt": "bomb bomb", "max_tokens": 16, "temperature": 0, "ignore_eos": True},
               {"prompt": "bomb!", "max_tokens": 16, "temperature": 0.9, "stream": True, "ignore_eos": True}]
    with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=60) as client:
        replies = _batched_posts(server.url, bodies, client, gate, batch=6)
        assert wait_idle(client)
        assert counter_total(scrape(client), "specledger:request_failures") == 2
    for prompt, reply in zip(prompts, replies):
        assert reply.status_code == 200
        assert reply.json()["choices"][0]["text"] == solo_greedy(prompt, 16, ignore_eos=True).text
    failed, streamed = replies[4], replies[5]
    assert failed.status_code == 500
    error = failed.json()["error"]
    assert error["type"] == "server_error" and error["message"] and "boom" not in failed.text
    assert "secret" not in failed.text and "RuntimeError" not in failed.text
    assert streamed.status_code == 200 and '"server_error"' in streamed.text and "boom" not in streamed.text
    chunks = OpenAIStreamDecoder().feed(streamed.text)
    assert [c.kind for c in chunks][-2:] == ["error", "done"]
    assert len(app.state.records) == 4


class SlowDrafter(NgramDrafter):
    """n-gram drafting that takes 20 ms a proposal: a request keeps emitting events for seconds."""

    def fork(self) -> SlowDrafter:
        return SlowDrafter()

    def propose(self, context, gamma, params, rng):
        time.sleep(0.02)
        return super().propose(context, gamma, params, rng)


def test_a_non_streaming_client_that_leaves_frees_its_slot_at_the_next_step() -> None:
    """Issue 12 item 2: the handler notices the hang-up although events keep arriving (one every
    ~20 ms), and the engine drops the request at the next step instead of decoding to max_tokens
    (~120 rounds, several seconds)."""
    app = tiny_app(max_queue=4, max_batch=2, drafter_obj=SlowDrafter(), gamma=1, keep_records=KEEP)
    worker = app.state.service.worker
    long = {"prompt": "abc abc", "max_tokens": 240, "temperature": 0, "ignore_eos": True}
    with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=60) as client:
        with pytest.raises(httpx.TimeoutException):
            httpx.post(server.url + "/v1/completions", json=long, timeout=0.5)
        left = time.monotonic()
        assert wait_idle(client), "running/waiting gauges did not return to 0"
        assert time.monotonic() - left < 2.0
        assert not app.state.records  # it never finished
        rounds = len(worker.aborted_rounds)
        assert 1 <= rounds < 60, rounds  # ran ~0.5 s of 20 ms rounds, not its ~120
        ok = client.post("/v1/completions", json={"prompt": "xyz", "max_tokens": 5, "temperature": 0})
        assert ok.status_code == 200
    assert [rec.output_tokens for rec in app.state.records] == [ok.json()["usage"]["completion_tokens"]]


def test_a_burst_is_admitted_up_to_queue_plus_batch() -> None:
    """Issue 12 item 6: with the engine busy on one request, a burst of 9 gets queue + free batch
    places (2 + 3 = 5) admitted, 4 answered 429; every admitted one gets its solo output."""
    gate = Gate()
    app = tiny_app(max_queue=2, max_batch=4, drafter_obj=GatedDrafter(gate))
    bodies = [{"prompt": p, "max_tokens": 6, "temperature": 0, "ignore_eos": True} for p in PROMPTS[:10]]
    replies: list = [None] * len(bodies)

    async def burst(url: str) -> list:
        async with httpx.AsyncClient(base_url=url, timeout=60) as c:
            return await asyncio.gather(*(c.post("/v1/completions", json=b) for b in bodies[1:]))

    def first(url: str) -> None:
        with httpx.Client(base_url=url, timeout=60) as c:
            replies[0] = c.post("/v1/completions", json=bodies[0])

    with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=60) as client:
        t = threading.Thread(target=first, args=(server.url,))
        t.start()
        wait_for(lambda: gauges(client) == (1, 0), "the first request held in the batch")
        done = threading.Event()

        def run_burst() -> None:
            replies[1:] = asyncio.run(burst(server.url))
            done.set()

        b = threading.Thread(target=run_burst)
        b.start()
        wait_for(lambda: gauges(client) == (1, 5), "five admitted to wait for the free places")
        gate.open()
        b.join(60)
        t.join(60)
        assert done.is_set() and wait_idle(client)
    statuses = Counter(r.status_code for r in replies)
    assert statuses == {200: 6, 429: 4}, statuses
    assert app.state.service.queue.taken == 0
    for body, reply in zip(bodies, replies):
        if reply.status_code == 200:
            assert reply.json()["choices"][0]["text"] == solo_greedy(body["prompt"], 6, ignore_eos=True).text


def _raw(url: str, data: bytes, read_timeout: float = 10.0) -> bytes:
    """Send raw bytes on a fresh connection; everything the server answers until it closes."""
    from tests.test_serve_hostile import raw_request

    return raw_request(url, data, read_timeout)


def test_hardening_body_limits_errors_and_unsupported_fields() -> None:
    """Issue 12 item 6: 413 before reading a declared or chunked oversize body, OpenAI-shaped 404 /
    405, a 400 naming a lone surrogate's place (no internal text), unsupported fields refused."""
    limits = Limits(max_body_bytes=4096, header_timeout_s=0.5, body_timeout_s=0.5)
    app = tiny_app(max_queue=4, limits=limits)
    with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=30) as client:
        big = json.dumps({"prompt": "a" * 5000, "max_tokens": 1}).encode()
        r = client.post("/v1/completions", content=big, headers={"content-type": "application/json"})
        assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
        assert r.headers.get("connection") == "close"

        def chunks():
            for i in range(0, len(big), 1000):
                yield big[i:i + 1000]

        r = client.post("/v1/completions", content=chunks(), headers={"content-type": "application/json"})
        assert r.status_code == 413 and "4096 bytes" in r.json()["error"]["message"]
        # a body just under the limit reaches the handler (whose answer: the prompt exceeds the context)
        under = client.post("/v1/completions", json={"prompt": "a" * 3000, "max_tokens": 1, "temperature": 0})
        assert under.status_code == 400 and under.json()["error"]["code"] is None and "context" in under.text

        r = client.get("/v2/nothing")
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
        r = client.get("/v1/completions")
        assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"
        assert "POST" in r.headers["allow"]

        r = client.post("/v1/completions", content=b'{"prompt": "ab\\ud800c", "max_tokens": 2}',
                        headers={"content-type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
        assert "surrogate" in r.json()["error"]["message"] and "Error" not in r.json()["error"]["message"]
        r = client.post("/v1/chat/completions", content=b'{"messages": [{"role": "user", "content": "\\udfff"}]}',
                        headers={"content-type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "messages.0.content"

        for field, value in [("logprobs", 1), ("logprobs", True), ("top_logprobs", 3),
                             ("tools", [{"type": "function", "function": {"name": "f"}}]),
                             ("response_format", {"type": "json_object"}), ("presence_penalty", 0.5),
                             ("tool_choice", "auto"), ("echo", True)]:
            r = client.post("/v1/completions", json={"prompt": "abc", "max_tokens": 2, field: value})
            assert r.status_code == 400, (field, r.text)
            assert r.json()["error"] == {"message": f"{field}: not supported by this server; omit it",
                                         "type": "invalid_request_error", "param": field,
                                         "code": "unsupported_parameter"}
        neutral = {"logprobs": None, "tools": [], "response_format": {"type": "text"}, "presence_penalty": 0,
                   "repetition_penalty": 1.0, "echo": False}
        r = client.post("/v1/completions", json={"prompt": "abc", "max_tokens": 2, "temperature": 0, **neutral})
        assert r.status_code == 200, r.text

        # a request head or a body that never completes: the connection is closed / answered 408
        t0 = time.monotonic()
        assert _raw(server.url, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n") == b""
        assert time.monotonic() - t0 < 5
        assert _raw(server.url, b"") == b""  # idle fresh connection
        answer = _raw(server.url, b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                      b"Content-Type: application/json\r\n"
                      b"Content-Length: 100\r\n\r\n{")
        assert answer.startswith(b"HTTP/1.1 408") and b"request_timeout" in answer
        # a header block that grows past the limit without ending: h11 refuses it (431, JSON, closed)
        answer = _raw(server.url, b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 70000)
        assert answer.startswith(b"HTTP/1.1 431") and b"request_header_fields_too_large" in answer
        assert client.get("/health").status_code == 200
