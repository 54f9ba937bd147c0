"""Issue 34, ``serve``: hostile clients cannot stall the batch, hold slots or connections, reach the
server from a web page, grow its memory, or forge log lines; a dead engine is reported (loopback only)."""

from __future__ import annotations

import inspect
import json
import logging
import socket
import threading
import time
from urllib.parse import urlsplit

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from specledger.cli import app as cli_app
from specledger.cli.serve import serve
from specledger.engine.decode import Engine
from specledger.engine.drafters.ngram import NgramDrafter
from specledger.errors import SpecLedgerError
from specledger.serve.hardening import LOOPBACK_HOSTS, Limits, host_name, log_safe
from specledger.serve.options import allowed_hosts, check_serve_options
from specledger.serve.protocol import (
    MAX_STOP_CHARS,
    MAX_STOP_STRINGS,
    CompletionRequest,
    RequestError,
    parse_body,
)
from specledger.serve.runner import ServerThread
from specledger.serve.worker import JobQueue
from tests.conftest import CharTokenizer, tiny_model
from tests.test_serve import (
    CONTEXT,
    KEEP,
    Gate,
    GatedDrafter,
    create_app,
    gauges,
    one_torch_thread,  # noqa: F401 -- the module fixture: one torch thread for tiny forwards
    tiny_app,
    tiny_encoder,
    tiny_engine,
    wait_for,
    wait_idle,
)

BODY = {"prompt": "abc abc", "max_tokens": 5, "temperature": 0}


class CountingEncoder:
    """tiny_encoder that counts its calls (how many prompts the server tokenized)."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, prompt, messages):
        self.calls += 1
        return tiny_encoder(prompt, messages)


def raw_request(url: str, head: bytes, timeout: float = 10.0) -> bytes:
    """Send ``head`` (a whole request) on a fresh connection; everything answered until close."""
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=timeout) as sock:
        sock.sendall(head)
        out = b""
        while chunk := sock.recv(65536):
            out += chunk
        return out


# --- stop strings: OpenAI's count, a stated length, refused before anything walks them ----------


def test_stop_limits_are_checked_on_the_raw_payload() -> None:
    ok = parse_body(CompletionRequest, {"prompt": "x", "stop": ["a" * MAX_STOP_CHARS] * MAX_STOP_STRINGS})
    assert ok.stop_strings == ["a" * MAX_STOP_CHARS] * 4
    assert parse_body(CompletionRequest, {"prompt": "x", "stop": "a" * MAX_STOP_CHARS}).stop_strings
    for stop, where in [(["a"] * 5, "at most 4 stop sequences"), ("a" * (MAX_STOP_CHARS + 1), "stop: a stop"),
                        (["ok", "b" * 1000], "stop.1: a stop"), (["x"] * 100_000, "got 100000")]:
        with pytest.raises(RequestError) as err:
            parse_body(CompletionRequest, {"prompt": "x", "stop": stop})
        assert err.value.status == 400 and err.value.param == "stop" and where in err.value.message
    with pytest.raises(RequestError, match="stop"):  # wrong types are still the model's 400
        parse_body(CompletionRequest, {"prompt": "x", "stop": [1, 2]})


def test_a_request_with_100000_stop_strings_gets_400_at_once() -> None:
    encoder = CountingEncoder()
    app = tiny_app(max_queue=2, encode=encoder)
    stops = [f"s{i}" for i in range(100_000)]
    body = json.dumps({**BODY, "stop": stops}).encode()
    assert len(body) < 1 << 20  # under the default body limit: the handler sees it
    with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=10) as client:
        t0 = time.perf_counter()
        r = client.post("/v1/completions", content=body, headers={"content-type": "application/json"})
        elapsed = time.perf_counter() - t0
        assert r.status_code == 400, r.text[:300]
        assert r.json()["error"] == {"message": "stop: at most 4 stop sequences are allowed, got 100000",
                                     "type": "invalid_request_error", "param": "stop", "code": None}
        assert elapsed < 2.0, elapsed
        chat = {"messages": [{"role": "user", "content": "a"}], "stop": ["z" * (MAX_STOP_CHARS + 1)]}
        r = client.post("/v1/chat/completions", json=chat)
        assert r.status_code == 400 and r.json()["error"]["param"] == "stop"
        assert encoder.calls == 0  # refused before tokenizing
        assert client.post("/v1/completions", json={**BODY, "stop": ["!", "?", ".", ","]}).status_code == 200


# --- the queue check comes before tokenizing ------------------------------------------------------


def test_a_full_server_answers_429_without_tokenizing_and_gives_every_place_back() -> None:
    gate, encoder = Gate(), CountingEncoder()
    app = tiny_app(max_queue=1, max_batch=1, drafter_obj=GatedDrafter(gate), encode=encoder)
    queue = app.state.service.queue
    held = {**BODY, "max_tokens": 6, "ignore_eos": True}
    replies: list = []

    def post() -> None:
        with httpx.Client(base_url=server.url, timeout=60) as c:
            replies.append(c.post("/v1/completions", json=held))

    with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=30) as client:
        threads = [threading.Thread(target=post) for _ in range(2)]
        for t in threads:
            t.start()
            time.sleep(0.05)
        wait_for(lambda: gauges(client) == (1, 1), "one request decoding (held by the gate), one waiting")
        assert encoder.calls == 2
        for _ in range(3):
            r = client.post("/v1/completions", json={**BODY, "prompt": "abc " * 50})
            assert r.status_code == 429 and r.json()["error"]["code"] == "queue_full"
        assert encoder.calls == 2  # the refused requests cost no tokenizing
        gate.open()
        for t in threads:
            t.join(60)
        assert [r.status_code for r in replies] == [200, 200]
        # a request refused after encoding (prompt too long for the context) gives its place back
        r = client.post("/v1/completions", json={"prompt": "a" * (CONTEXT + 10), "max_tokens": 1})
        assert r.status_code == 400
        assert wait_idle(client)
        assert (queue.reserved, queue.taken, len(queue)) == (0, 0, 0)
        assert client.post("/v1/completions", json=BODY).status_code == 200


def test_reservations_count_against_capacity() -> None:
    q = JobQueue(maxsize=1, batch=1)
    assert q.reserve() and q.reserve() and not q.reserve()  # queue + batch places
    q.unreserve()
    assert q.reserve() and q.reserved == 2
    q.unreserve()
    q.unreserve()
    assert q.reserved == 0 and q.reserve()
    q.close()
    assert not q.reserve()


# --- a client that stops reading is dropped after the send timeout ------------------------------------


class FatTokenizer(CharTokenizer):
    """Every token decodes to ``WIDTH`` copies of its character: a stream of ~10 MB, more than the
    socket buffers between a server and a client that reads nothing take."""

    WIDTH = 40000

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(self.ALPHABET[i % len(self.ALPHABET)] * self.WIDTH for i in ids)


class SlowDrafter(NgramDrafter):
    """n-gram drafting that takes 25 ms a proposal: 240 tokens at gamma 1 decode for >= 3 s."""

    def fork(self) -> SlowDrafter:
        return SlowDrafter()

    def propose(self, context, gamma, params, rng):
        time.sleep(0.025)
        return super().propose(context, gamma, params, rng)


def fat_app(limits: Limits):
    tok = FatTokenizer()
    engine = Engine(tiny_model(5, vocab=len(tok.ALPHABET), n_layers=2, dim=32, max_seq_len=CONTEXT), tok,
                    eos_token_ids=[tok.encode("!")[0]], max_context=CONTEXT, name="tiny")
    return create_app(engine, "ngram", 1, model_name="tiny-serve", max_queue=1, max_batch=1, encode=tiny_encoder,
                      limits=limits, keep_records=KEEP, drafter=SlowDrafter())


def test_a_streaming_client_that_never_reads_is_dropped_and_its_slot_freed() -> None:
    """The request would decode for >= 3 s; its client reads nothing, so after ~1 MB the buffers are full
    and the send timeout (0.5 s) drops it: the job is cancelled mid-decode, its only slot serves the next."""
    app = fat_app(Limits(send_timeout_s=0.5))
    worker = app.state.service.worker
    body = json.dumps({"prompt": "abc abc", "max_tokens": 240, "temperature": 0, "ignore_eos": True,
                       "stream": True}).encode()
    with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=30) as client:
        parts = urlsplit(server.url)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: a small window
        sock.connect((parts.hostname, parts.port))
        try:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n" % len(body) + body)
            t0 = time.monotonic()
            wait_for(lambda: worker.aborted_rounds or worker.records, "the stream to end", tries=500)
            dropped_after = time.monotonic() - t0
            assert wait_idle(client), "the slot was not freed"
            assert not worker.records, "the stream finished instead of being dropped"
            assert 0.5 <= dropped_after < 3.0, dropped_after
            # the only slot is free: a new request is served at once
            r = client.post("/v1/completions", json={**BODY, "stream": True})
            assert r.status_code == 200 and "[DONE]" in r.text
            # the dropped connection is closed: what the client can still read ends early, without [DONE]
            sock.settimeout(10)
            got = b""
            try:
                while chunk := sock.recv(1 << 16):
                    got += chunk
            except ConnectionResetError:
                pass
            assert got.startswith(b"HTTP/1.1 200") and b"[DONE]" not in got
            assert len(got) < 240 * FatTokenizer.WIDTH
        finally:
            sock.close()
        assert app.state.service.queue.taken == 0


# --- web pages: JSON Content-Type on POST, Host allow-list (DNS rebinding) --------------------------


def test_post_needs_json_content_type_and_host_must_be_allowed() -> None:
    encoder = CountingEncoder()
    app = tiny_app(max_queue=4, encode=encoder)
    payload = json.dumps(BODY).encode()
    with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=30) as client:
        for ctype in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x",
                      "application/jsonx", None):
            headers = {"content-type": ctype} if ctype else {}
            r = client.post("/v1/completions", content=payload, headers=headers)
            assert r.status_code == 415, (ctype, r.text)
            assert r.json()["error"]["code"] == "unsupported_media_type" and "application/json" in r.text
        for ctype in ("application/json", "Application/JSON; charset=utf-8"):
            r = client.post("/v1/completions", content=payload, headers={"content-type": ctype})
            assert r.status_code == 200, (ctype, r.text)
        assert encoder.calls == 2  # the refused bodies were never read, let alone tokenized

        for host in ("evil.example", "evil.example:8000", "127.0.0.2", "localhost.evil.example", "[::2]:80"):
            for method, path in (("GET", "/v1/models"), ("GET", "/metrics"), ("POST", "/v1/completions")):
                r = client.request(method, path, content=payload, headers={"host": host,
                                                                           "content-type": "application/json"})
                assert r.status_code == 421, (host, path, r.text)
                assert r.json()["error"]["code"] == "host_not_allowed" and "--allow-host" in r.text
        for host in ("localhost", "LOCALHOST:8000", "127.0.0.1:1", "[::1]:8000", "localhost."):
            assert client.get("/v1/models", headers={"host": host}).status_code == 200, host
        answer = raw_request(server.url, b"GET /v1/models HTTP/1.0\r\n\r\n")  # no Host at all
        assert answer.startswith(b"HTTP/1.1 400") and b"host_missing" in answer
        assert encoder.calls == 2

    extra = tiny_app(max_queue=4, limits=Limits(allowed_hosts=LOOPBACK_HOSTS + ("box.lan",)))
    anyhost = tiny_app(max_queue=4, limits=Limits(allowed_hosts=("*",)))
    with ServerThread(extra) as s1, ServerThread(anyhost) as s2:
        assert httpx.get(s1.url + "/v1/models", headers={"host": "box.lan:9000"}).status_code == 200
        assert httpx.get(s1.url + "/v1/models", headers={"host": "evil.example"}).status_code == 421
        assert httpx.get(s2.url + "/v1/models", headers={"host": "evil.example"}).status_code == 200


def test_allowed_hosts_from_the_cli_options() -> None:
    assert allowed_hosts("127.0.0.1", None) == ("localhost", "127.0.0.1", "::1")
    assert allowed_hosts("0.0.0.0", ["box.lan", "*"]) == ("localhost", "127.0.0.1", "::1", "box.lan", "*")
    assert allowed_hosts("10.0.0.5", None)[-1] == "10.0.0.5"
    assert host_name("[::1]:80") == "::1" and host_name("Box.LAN.:1") == "box.lan" and host_name("::1") == "::1"
    with pytest.raises(SpecLedgerError, match="allow-host"):
        allowed_hosts("127.0.0.1", [" "])
    with pytest.raises(SpecLedgerError, match="keep-records"):
        check_serve_options(8000, "ngram", "4", 64, keep_records=-1)
    with pytest.raises(SpecLedgerError, match="send-timeout"):
        check_serve_options(8000, "ngram", "4", 64, send_timeout=0)


def test_serve_help_documents_the_new_options() -> None:
    res = CliRunner().invoke(cli_app, ["serve", "--help"], terminal_width=200)
    assert res.exit_code == 0
    for option in ("--keep-records", "--send-timeout", "--allow-host", "--access-log"):
        assert option in res.output, option


# --- bounded record retention ------------------------------------------------------------------------


def test_records_are_kept_only_when_asked_and_then_only_the_newest() -> None:
    default = create_app(tiny_engine(), "ngram", 4, model_name="tiny-serve", max_queue=4, encode=tiny_encoder)
    two = tiny_app(max_queue=4, keep_records=2)
    for app, want in ((default, 0), (two, 2)):
        worker = app.state.service.worker
        with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=30) as client:
            for i in range(5):
                assert client.post("/v1/completions", json={**BODY, "max_tokens": 2 + i}).status_code == 200
            with client.stream("POST", "/v1/completions", json={**BODY, "max_tokens": 200, "ignore_eos": True,
                                                                "stream": True}) as r:
                next(r.iter_bytes())  # then hang up: an aborted request
            assert wait_idle(client)
        assert len(app.state.records) == want and len(worker.batch.steps) <= want
        assert len(worker.aborted_rounds) <= 8 * want
        if want:  # the newest two: the last completion, then the hung-up stream if it finished before the
            outs = [rec.output_tokens for rec in app.state.records]  # hang-up was seen (a fast tiny model)
            assert outs == [5, 6] or (len(outs) == 2 and outs[0] == 6)
    with pytest.raises(SpecLedgerError, match="keep_records"):
        tiny_app(keep_records=-1)
    assert inspect.signature(serve).parameters["keep_records"].default == 0  # the CLI keeps none either


# --- a dead engine is reported -------------------------------------------------------------------------


def test_health_is_503_once_the_engine_thread_has_died(monkeypatch, caplog) -> None:
    """A batch step raises outside any one request, and so does rebuilding the scheduler in
    ``_fail_all``: the engine thread cannot go on. The request in flight gets an answer (not a hang),
    /health 503, new requests 503."""
    app = tiny_app(max_queue=4)
    worker = app.state.service.worker

    def broken(*args, **kwargs):
        raise RuntimeError("boom /secret/path")

    monkeypatch.setattr(worker.scheduler, "step", broken)
    monkeypatch.setattr(worker.batch, "scheduler", broken)
    with caplog.at_level(logging.ERROR, logger="specledger.serve"):
        with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=15) as client:
            assert client.get("/health").status_code == 200
            r = client.post("/v1/completions", json=BODY)
            assert r.status_code == 500 and "boom" not in r.text
            wait_for(lambda: not worker.alive, "the worker to be marked dead")
            health = client.get("/health")
            assert health.status_code == 503 and health.json()["error"]["code"] == "engine_stopped"
            r = client.post("/v1/completions", json=BODY)
            assert r.status_code == 503 and r.json()["error"]["code"] == "engine_stopped"
            assert wait_idle(client)
    assert isinstance(worker.error, RuntimeError)
    assert any(rec.levelno == logging.CRITICAL and "engine thread stopped" in rec.getMessage()
               for rec in caplog.records)


# --- the access log cannot be forged ---------------------------------------------------------------------


@given(st.text(max_size=600))
def test_log_safe_leaves_only_printable_characters(text: str) -> None:
    out = log_safe(text)
    assert all(c == " " or c.isprintable() for c in out)
    assert "\n" not in out and "\r" not in out and "\x1b" not in out
    if all(c == " " or (c.isprintable() and c != "\\") for c in text) and len(text) <= 512:
        assert out == text


def test_access_log_escapes_a_percent_decoded_path(caplog) -> None:
    app = tiny_app(max_queue=4)
    forged = b"/v1/x%0D%0A127.0.0.1:1%20%22GET%20/admin%22%20200%1B[2J%E2%80%A8end"
    with caplog.at_level(logging.INFO, logger="specledger.serve.access"):
        with ServerThread(app) as server:
            answer = raw_request(server.url, b"GET " + forged + b"?q=%0A HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                 b"Connection: close\r\n\r\n")
            assert answer.startswith(b"HTTP/1.1 404")
            httpx.post(server.url + "/v1/completions", json=BODY, timeout=30)
    lines = [rec.getMessage() for rec in caplog.records if rec.name == "specledger.serve.access"]
    assert len(lines) == 2, lines
    line = lines[0]
    assert not any(c in line for c in "\n\r\x1b\u2028"), line
    assert '/v1/x\\r\\n127.0.0.1:1 "GET /admin" 200\\x1b[2J\\u2028end?q=%0A" 404' in line
    assert '"POST /v1/completions" 200' in lines[1]
