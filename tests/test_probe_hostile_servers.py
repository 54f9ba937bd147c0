"""The probe against servers that misbehave on purpose (issue 46): one that streams for ever, one whose every
reply is malformed (bad JSON, random bytes, 1 MB lines, no line ends), one that trickles, one whose /metrics
is huge -- and a llama.cpp reply with reasoning, whose text the record keeps. A stdlib server per test; every
server loop is bounded; deadlines are generous bounds, never speed assertions.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
import warnings
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from specledger.cli import main
from specledger.errors import SpecLedgerError, SpecLedgerWarning
from specledger.probe.bounds import check_some_succeeded, default_deadline_s, stream_limits
from specledger.probe.fetch import MAX_STREAM_BYTES
from specledger.probe.loadgen import LoadConfig, PromptItem, RequestResult, run_load
from specledger.probe.prometheus import MAX_FAR_POSITIONS, MAX_POSITION, MAX_SERIES_PER_NAME, parse_prometheus_text
from specledger.probe.records import record_from_result
from specledger.probe.sse import OpenAIStreamDecoder

MAX_WRITES = 200_000  # every server loop ends after this many writes, whatever the client does


def chunk(text: str) -> bytes:
    body = {"id": "chatcmpl-1", "choices": [{"index": 0, "text": text, "finish_reason": None}]}
    return f"data: {json.dumps(body)}\n\n".encode()


def stream_forever(write) -> None:
    for _ in range(MAX_WRITES):
        write(chunk("tok "))


def malformed(write) -> None:
    write(b"data: {this is not json\n\n")
    write(b"data: [DONE]\n\n")


def random_bytes(write) -> None:
    rng = random.Random(0)
    for _ in range(64):
        write(bytes(rng.getrandbits(8) for _ in range(1024)))


def megabyte_lines(write) -> None:
    for _ in range(8):
        write(chunk("x" * (1 << 20)))  # valid chunks, 1 MB of text each


def no_line_ends(write) -> None:
    for _ in range(MAX_WRITES):
        write(b"data: " + b"y" * 4096)


def trickle(write) -> None:
    for _ in range(600):  # a byte every 0.2 s: two minutes at most
        write(b":")
        time.sleep(0.2)


LLAMACPP_REASONING = [
    {"choices": [{"finish_reason": None, "index": 0, "delta": {"role": "assistant", "content": None}}]},
    {"choices": [{"finish_reason": None, "index": 0, "delta": {"reasoning_content": "Let me think"}}]},
    {"choices": [{"finish_reason": None, "index": 0, "delta": {"reasoning_content": " about 2+2."}}]},
    {"choices": [{"finish_reason": None, "index": 0, "delta": {"content": "4"}}]},
    {"choices": [{"finish_reason": "stop", "index": 0, "delta": {}}],
     "usage": {"completion_tokens": 3, "prompt_tokens": 5, "total_tokens": 8},
     "timings": {"predicted_n": 3, "draft_n": 2, "draft_n_accepted": 1}},
]


def llamacpp_reasoning(write) -> None:
    for body in LLAMACPP_REASONING:
        write(f"data: {json.dumps({'id': 'chatcmpl-r', 'system_fingerprint': 'b6100-abc', **body})}\n\n".encode())
    write(b"data: [DONE]\n\n")


def huge_metrics() -> bytes:
    """~16 MB of per-position series (positions 0..~300k), the amplification of issue 46 item 6."""
    lines = ["# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter"]
    position = 0
    size = 0
    while size < 16_000_000:
        line = f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",position="{position}"}} 1.0'
        lines.append(line)
        size += len(line) + 1
        position += 1
    return ("\n".join(lines) + "\n").encode()


class Hostile:
    """``with Hostile(behaviour) as url:`` -- a loopback server: /v1/models, /metrics, and every POST answered
    200 text/event-stream by ``behaviour(write)`` (a write error -- the client left -- ends it)."""

    def __init__(self, behaviour, metrics: bytes = b"") -> None:
        behaviour_, metrics_ = behaviour, metrics

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def log_message(self, *args) -> None:
                pass

            def _send(self, status: int, ctype: str, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                if self.path.startswith("/v1/models"):
                    self._send(200, "application/json", b'{"data": [{"id": "hostile"}]}')
                else:
                    self._send(200, "text/plain", metrics_)

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()

                def write(data: bytes) -> None:
                    self.wfile.write(data)
                    self.wfile.flush()

                try:
                    behaviour_(write)
                except OSError:
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def load(url: str, behaviour_timeout: float = 10.0, **kwargs) -> list[RequestResult]:
    config = LoadConfig(base_url=url, model="hostile", concurrency=1, num_requests=2, timeout_s=behaviour_timeout,
                        max_tokens=128, **kwargs)
    return asyncio.run(run_load(config, [PromptItem(prompt="p")])).results


def test_a_server_that_streams_for_ever_costs_a_bounded_request() -> None:
    """Each request stops at max_tokens plus the margin of token chunks: failed, and what it keeps (and
    writes) is a few kilobytes, not the 84 MB of text and 1.3 M chunk times of issue 46."""
    limits = stream_limits(128, MAX_STREAM_BYTES)
    with Hostile(stream_forever) as url:
        results = load(url)
    assert [r.error.split(":")[0] for r in results] == ["TooLong", "TooLong"]
    for r in results:
        assert len(r.chunk_times) == limits.max_chunks and not r.ok
        assert len(json.dumps(r.to_dict())) < 64_000


@pytest.mark.parametrize("behaviour, kind", [
    (random_bytes, "IncompleteStream"), (megabyte_lines, "TooLarge"), (no_line_ends, "TooLarge"),
    (malformed, "malformed JSON"),
])
def test_every_malformed_reply_fails_bounded(behaviour, kind: str) -> None:
    with Hostile(behaviour) as url:
        results = load(url)
    assert all(not r.ok and kind in r.error for r in results), [r.error for r in results]
    assert all(len(json.dumps(r.to_dict())) < 64_000 for r in results)
    with pytest.raises(SpecLedgerError, match="every one of the 2 requests sent to"):
        check_some_succeeded(results, url)


def test_probe_exits_2_with_one_line_when_every_request_fails(tmp_path: Path, capsys) -> None:
    with Hostile(malformed) as url:
        with pytest.raises(SystemExit) as exc:
            main(["probe", url, "--requests", "2", "--concurrency", "1", "--no-metrics", "--timeout", "10",
                  "--out", str(tmp_path / "run")])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: every one of the 2 requests sent to ")
    assert "malformed JSON" in err[0]


def test_a_trickling_server_ends_by_the_deadline(capsys) -> None:
    """4 requests at concurrency 1, --timeout 10, --deadline 2: done in about 2 s (bound: 15 s), not 40 s."""
    with Hostile(trickle) as url:
        t0 = time.monotonic()
        with pytest.raises(SystemExit) as exc:
            main(["probe", url, "--requests", "4", "--concurrency", "1", "--no-metrics", "--timeout", "10",
                  "--deadline", "2"])
        elapsed = time.monotonic() - t0
    assert exc.value.code == 2 and elapsed < 15
    err = capsys.readouterr().err
    assert "Deadline: the load's deadline of 2 s passed" in err and "3 of 4 requests were not sent" in err


def test_the_default_deadline_is_the_requests_waves_of_timeout() -> None:
    assert default_deadline_s(4, 120.0, concurrency=1) == 4 * 120 + 10
    assert default_deadline_s(16, 10.0, concurrency=4) == 4 * 10 + 10
    assert default_deadline_s(10, 10.0, rate=2.0) == 5 + 10 + 10
    assert default_deadline_s(100, 10.0, concurrency=1, duration_s=30) == 30 + 10 + 10
    assert LoadConfig(base_url="", model="", num_requests=4, concurrency=1, timeout_s=5).total_deadline_s() == 30
    with pytest.raises(SpecLedgerError, match="--deadline"):
        LoadConfig(base_url="", model="", deadline_s=0).validate()


def test_stream_limits_grow_with_max_tokens_and_keep_a_margin() -> None:
    small, large = stream_limits(16, MAX_STREAM_BYTES), stream_limits(4096, MAX_STREAM_BYTES)
    assert small.max_chunks == 16 + 64 and large.max_chunks == 4096 + 1024
    assert small.max_bytes < large.max_bytes <= MAX_STREAM_BYTES
    assert stream_limits(10**9, 1000).max_bytes == 1000


def test_huge_metrics_are_read_within_the_caps() -> None:
    """16 MB of per-position series: the positions past MAX_POSITION are dropped (but for a few the figures then
    name) and counted, one warning."""
    text = huge_metrics().decode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        snapshot = parse_prometheus_text(text)
    positions = sorted(int(s.labels["position"]) for s in snapshot.samples if "position" in s.labels)
    assert positions == list(range(MAX_POSITION + 1 + MAX_FAR_POSITIONS))
    assert len(snapshot.samples) <= MAX_SERIES_PER_NAME
    assert snapshot.dropped > 150_000
    assert [w for w in caught if issubclass(w.category, SpecLedgerWarning)]


def test_a_flood_of_metric_names_is_capped() -> None:
    text = "".join(f"# TYPE m{i} gauge\nm{i} 1\n" for i in range(60_000))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        snapshot = parse_prometheus_text(text)
    assert len(snapshot.samples) <= 50_000 and snapshot.dropped >= 10_000


# --- llama.cpp reasoning ------------------------------------------------------------------------


def test_llamacpp_reasoning_is_kept_timed_and_in_the_record() -> None:
    """A llama.cpp streamed reply with reasoning: the reasoning chunks are timed and counted like the answer,
    and the ledger record's text holds them (reasoning, then answer), so text and token times agree."""
    with Hostile(llamacpp_reasoning) as url:
        results = load(url, chat=True)
    first = results[0]
    assert first.ok, first.error
    assert first.reasoning_text == "Let me think about 2+2." and first.output_text == "4"
    assert len(first.chunk_times) == 3 and first.completion_tokens == 3
    record = record_from_result(first, drafter="endpoint", gamma=4, temperature=0.0, model="m", endpoint=url,
                                category="c", tokenizer=lambda text: list(range(len(text.split()))))
    assert record.text == "Let me think about 2+2.4"
    assert record.extra["reasoning_chars"] == len("Let me think about 2+2.")
    assert record.output_tokens == 3 and record.token_ids  # ids of everything generated


def test_vllm_reasoning_key_is_read_when_reasoning_content_is_empty() -> None:
    decoder = OpenAIStreamDecoder()
    body = {"choices": [{"index": 0, "delta": {"reasoning_content": "", "reasoning": "hmm"}}]}
    (parsed,) = decoder.feed(f"data: {json.dumps(body)}\n\n".encode())
    assert parsed.reasoning == "hmm" and parsed.generated == "hmm"
