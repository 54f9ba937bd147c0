"""Soak (issue 12 item 8, issue 34): mixed good / bad / cancelled / never-reading requests against
``specledger serve`` in its own process (tests/soak_server.py: the verb's own function, with the
engine builder swapped for the tiny model), 32 at a time over loopback, then:

- zero 5xx answers and zero transport errors on requests the client did not abandon;
- nothing left behind: running == waiting == 0 once the traffic stops, no engine failures, no
  server connection still established although the never-reading clients keep their sockets
  open, and at shutdown no record, aborted round, batch step, taken or reserved place held
  (the server keeps no records by default);
- server RSS sampled every SAMPLE_EVERY requests (the curve is printed); over the second half of
  the run it stays within FLAT_MB (the first requests pay one-time costs: per-shape kernel caches,
  allocator arenas of the worker and encoder threads -- ~100 MB from idle);
- every good answer (streamed or not, completions and chat, extreme sampling values that are
  greedy) equal to its solo answer: text, finish reason, token count;
- no traceback in the server's log.

:func:`soak` runs any number of requests; the suite runs N_SUITE (bounded by BUDGET_S), and
``benchmarks/soak_serve.py`` the full 5,000 with the same checks. Run with ``-s`` to see the figures.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from specledger.probe.prometheus import counter_total, gauge_mean, parse_prometheus_text
from specledger.probe.sse import OpenAIStreamDecoder
from tests.soak_server import MAX_BODY_BYTES, MODEL, TOKENIZER, soak_encoder, soak_engine

N_SUITE = int(os.environ.get("SPECLEDGER_SOAK_REQUESTS", "5000"))
CONCURRENCY = 32
BUDGET_S = 170.0
FLAT_MB = 25.0  # RSS range allowed over the second half of the samples
SAMPLE_EVERY = 100
NEVER_READ_SHARE = 0.02  # streaming clients that send a request, then never read (socket kept open)
SERVER = Path(__file__).with_name("soak_server.py")

PROMPTS = [
    "abc abc abc abc", "the cat sat on the mat the cat", "0101010101", "hello world hello",
    "xyz", "aaaa bbbb aaaa bbbb", "def f(x): return x", "one two three one two",
    "A B C A B C", "spec spec spec", "[1, 2, 3, 1, 2, 3]", "qwerty",
]
#: extra fields that must leave a request greedy (issue 12 item 1: they made sampling throw)
GREEDY_EXTREMES = [
    {"temperature": 0}, {"temperature": 1e-40}, {"temperature": 1.0, "top_p": 1e-300, "seed": 1},
    {"temperature": 1.5, "top_k": 1, "seed": 2}, {"temperature": 0.0, "top_p": 5e-324},
]


def _bad_requests() -> list[tuple[str, str, bytes, int]]:
    """(method, path, body, expected status) of the malformed, refused and unsupported requests."""
    def js(obj: Any) -> bytes:
        return json.dumps(obj).encode()

    post, chat = "/v1/completions", "/v1/chat/completions"
    return [
        ("POST", post, b"{", 400), ("POST", post, b"not json", 400), ("POST", post, b"[1, 2]", 400),
        ("POST", post, b"", 400), ("POST", post, b"[" * 50000, 400),
        ("POST", post, js({"prompt": 5}), 400), ("POST", post, js({"prompt": ["a", "b"]}), 400),
        ("POST", post, js({"prompt": "abc", "max_tokens": "8"}), 400),
        ("POST", post, js({"prompt": "abc", "temperature": -1}), 400),
        ("POST", post, js({"prompt": "abc", "temperature": 2.5}), 400),
        ("POST", post, js({"prompt": "abc", "top_p": 0}), 400),
        ("POST", post, js({"prompt": "abc", "n": 2}), 400),
        ("POST", post, js({"prompt": "abc", "max_tokens": 0}), 400),
        ("POST", post, js({"prompt": "abc", "max_tokens": 10**9}), 400),
        ("POST", post, js({"prompt": "abc " * 2000, "max_tokens": 8}), 400),
        ("POST", post, js({"prompt": "", "max_tokens": 4}), 400),
        ("POST", post, js({"prompt": "\u00e9t\u00e9", "max_tokens": 4}), 400),
        ("POST", post, b'{"prompt": "ab\\ud800", "max_tokens": 4}', 400),
        ("POST", post, js({"prompt": "abc", "stop": 7}), 400),
        ("POST", post, js({"prompt": "abc", "logprobs": 2}), 400),
        ("POST", post, js({"prompt": "abc", "response_format": {"type": "json_object"}}), 400),
        ("POST", chat, js({"messages": [{"role": "user", "content": "a"}], "tools": [{"type": "function"}]}), 400),
        ("POST", chat, js({"messages": []}), 400),
        ("POST", chat, js({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}), 400),
        ("POST", chat, js({"model": "../../weights.gguf", "messages": [{"role": "user", "content": "a"}]}), 404),
        ("POST", post, js({"prompt": "a" * (MAX_BODY_BYTES + 1000)}), 413),
        ("GET", "/v1/nothing", b"", 404), ("GET", post, b"", 405), ("DELETE", "/v1/models", b"", 405),
    ]


@dataclass(frozen=True)
class Good:
    path: str
    body: dict[str, Any]
    key: tuple  # the solo reference's key


@dataclass
class Tally:
    by_class: Counter = field(default_factory=Counter)  # good / bad / cancel: requests sent
    outcomes: Counter = field(default_factory=Counter)  # "good 200", "bad 400", "cancel hung-up", ...
    five_xx: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # transport errors on requests not abandoned
    mismatches: list[str] = field(default_factory=list)
    held: list[socket.socket] = field(default_factory=list)  # the never-reading clients' sockets, open
    done: int = 0
    rss: list[tuple[int, float]] = field(default_factory=list)  # (requests done, server RSS MB)


def solo_references() -> dict[tuple, tuple[str, str, int]]:
    """(prompt, chat, max_tokens, stop, ignore_eos) -> (text, finish_reason, completion tokens),
    from the solo engine on the server's model."""
    engine = soak_engine()
    refs = {}
    for prompt in PROMPTS:
        for chat in (False, True):
            ids = soak_encoder(None, [{"role": "user", "content": prompt}]) if chat else TOKENIZER.encode(prompt)
            plain = engine.generate(ids, max_tokens=12, ignore_eos=True).text
            for max_tokens in (6, 12):
                for stop in ((), (plain[3:5],)):
                    for ignore_eos in (False, True):
                        rec = engine.generate(ids, max_tokens=max_tokens, stop=list(stop), ignore_eos=ignore_eos)
                        finish = "length" if rec.stop_reason == "length" else "stop"
                        refs[(prompt, chat, max_tokens, stop, ignore_eos)] = (rec.text, finish, rec.output_tokens)
    return refs


def make_plan(refs: dict[tuple, Any], n: int, seed: int = 12) -> list[tuple[str, Any]]:
    """``n`` requests: about 50% good, 30% bad, 18% abandoned by their client and 2% streams whose
    client never reads, shuffled (seeded)."""
    rng = random.Random(seed)
    bad = _bad_requests()
    keys = sorted(refs, key=repr)
    plan: list[tuple[str, Any]] = []
    for i in range(n):
        roll = rng.random()
        if roll < 0.5:
            key = rng.choice(keys)
            prompt, chat, max_tokens, stop, ignore_eos = key
            body: dict[str, Any] = {"model": MODEL, "max_tokens": max_tokens, "stop": list(stop),
                                    "ignore_eos": ignore_eos, "stream": rng.random() < 0.5,
                                    **rng.choice(GREEDY_EXTREMES)}
            if chat:
                body["messages"] = [{"role": "user", "content": prompt}]
            else:
                body["prompt"] = prompt
            plan.append(("good", Good("/v1/chat/completions" if chat else "/v1/completions", body, key)))
        elif roll < 0.8:
            plan.append(("bad", bad[i % len(bad)]))
        elif roll < 0.8 + NEVER_READ_SHARE:
            plan.append(("never-read", {"prompt": rng.choice(PROMPTS), "max_tokens": 60, "temperature": 0,
                                        "ignore_eos": True, "stream": True}))
        else:
            how = rng.choice(["hang-up", "timeout", "cancel"])
            prompt = rng.choice(PROMPTS)
            plan.append(("cancel", (how, {"prompt": prompt, "max_tokens": 200, "temperature": 0, "ignore_eos": True,
                                          "stream": how == "hang-up"}, rng.uniform(0.0, 0.03))))
    return plan


def read_stream(text: str) -> tuple[str, str | None, bool, list[str]]:
    decoder = OpenAIStreamDecoder()
    parts, finish, done, errors = [], None, False, []
    for chunk in decoder.feed(text) + decoder.close():
        if chunk.kind == "error":
            errors.append(chunk.error or "?")
        done = done or chunk.kind == "done"
        parts.append(chunk.text)
        finish = chunk.finish_reason or finish
    return "".join(parts), finish, done, errors


async def send_good(client: httpx.AsyncClient, good: Good, refs: dict, tally: Tally) -> None:
    r = await client.post(good.path, json=good.body)
    tally.outcomes[f"good {r.status_code}"] += 1
    if r.status_code >= 500:
        tally.five_xx.append(f"{r.status_code} {good.body}: {r.text[:200]}")
        return
    want_text, want_finish, want_tokens = refs[good.key]
    if r.status_code != 200:
        tally.mismatches.append(f"{good.body}: HTTP {r.status_code} {r.text[:200]}")
        return
    if good.body["stream"]:
        text, finish, done, errors = read_stream(r.text)
        got = (text, finish, done, errors)
        want: tuple = (want_text, want_finish, True, [])
    else:
        out = r.json()
        choice = out["choices"][0]
        text = choice["text"] if "text" in choice else choice["message"]["content"]
        got = (text, choice["finish_reason"], out["usage"]["completion_tokens"])
        want = (want_text, want_finish, want_tokens)
    if got != want:
        tally.mismatches.append(f"{good.body}: got {got!r}, solo {want!r}")


async def send_bad(client: httpx.AsyncClient, bad: tuple[str, str, bytes, int], tally: Tally) -> None:
    method, path, body, status = bad
    r = await client.request(method, path, content=body or None, headers={"content-type": "application/json"})
    tally.outcomes[f"bad {r.status_code}"] += 1
    if r.status_code >= 500:
        tally.five_xx.append(f"{r.status_code} {method} {path} {body[:60]!r}: {r.text[:200]}")
    elif r.status_code != status or set(r.json()) != {"error"} or "Traceback" in r.text:
        tally.mismatches.append(f"{method} {path} {body[:60]!r}: want {status}, got {r.status_code} {r.text[:200]}")


async def send_cancelled(client: httpx.AsyncClient, spec: tuple[str, dict, float], tally: Tally) -> None:
    how, body, delay = spec
    if how == "hang-up":  # a stream whose client leaves after the first chunk
        async with client.stream("POST", "/v1/completions", json=body) as r:
            if r.status_code >= 500:
                tally.five_xx.append(f"{r.status_code} hang-up stream")
            async for _ in r.aiter_bytes():
                break
        tally.outcomes[f"cancel hang-up {r.status_code}"] += 1
    elif how == "timeout":  # a non-streaming client that gives up
        try:
            r = await client.post("/v1/completions", json=body, timeout=0.01 + delay)
            tally.outcomes[f"cancel timeout-answered {r.status_code}"] += 1
            if r.status_code >= 500:
                tally.five_xx.append(f"{r.status_code} impatient request: {r.text[:200]}")
        except httpx.TimeoutException:
            tally.outcomes["cancel timeout"] += 1
    else:  # the client's task is cancelled mid-request
        task = asyncio.ensure_future(client.post("/v1/completions", json={**body, "stream": delay < 0.015}))
        await asyncio.sleep(delay)
        task.cancel()
        try:
            r = await task
            tally.outcomes[f"cancel task-answered {r.status_code}"] += 1
            if r.status_code >= 500:
                tally.five_xx.append(f"{r.status_code} cancelled task: {r.text[:200]}")
        except asyncio.CancelledError:
            tally.outcomes["cancel task"] += 1


async def send_never_read(url: str, body: dict, tally: Tally) -> None:
    """A streaming request on a raw socket (small receive buffer) that is never read; the socket
    stays open until the soak ends (the server must let go of it by itself)."""
    parts = url.split("//", 1)[1]
    host, port = parts.rsplit(":", 1)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, (host, int(port)))
    data = json.dumps(body).encode()
    await loop.sock_sendall(sock, b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                  b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(data) + data)
    tally.held.append(sock)
    tally.outcomes["never-read sent"] += 1
    await asyncio.sleep(0.2)  # the next request of this client waits a little; this one is never read


async def run_soak(url: str, plan: list[tuple[str, Any]], refs: dict, tally: Tally, pid: int | None = None) -> None:
    limits = httpx.Limits(max_connections=CONCURRENCY, max_keepalive_connections=CONCURRENCY)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:
        work = iter(plan)

        async def worker() -> None:
            for cls, spec in work:
                tally.by_class[cls] += 1
                try:
                    if cls == "good":
                        await send_good(client, spec, refs, tally)
                    elif cls == "bad":
                        await send_bad(client, spec, tally)
                    elif cls == "never-read":
                        await send_never_read(url, spec, tally)
                    else:
                        await send_cancelled(client, spec, tally)
                except (httpx.HTTPError, OSError) as exc:
                    tally.errors.append(f"{cls} {type(exc).__name__}: {exc}")
                tally.done += 1
                if pid is not None and tally.done % SAMPLE_EVERY == 0:
                    tally.rss.append((tally.done, rss_mb(pid)))

        await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def metrics(client: httpx.Client) -> dict:
    return parse_prometheus_text(client.get("/metrics").text)


def established_on(port: int) -> int:
    """Established TCP connections whose local port is ``port`` (the server's side), from /proc/net/tcp*."""
    count = 0
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "01":
                count += 1
    return count


def flat_range(rss: list[tuple[int, float]]) -> float:
    """max - min of the RSS samples over the second half of the run (MB)."""
    last = rss[-1][0]
    half = [mb for n, mb in rss if n > last / 2]
    return max(half) - min(half) if half else 0.0


@dataclass
class SoakResult:
    n: int
    wall_s: float
    tally: Tally
    running: float
    waiting: float
    failures: float
    served: float
    open_connections: int
    rss_idle: float
    state: dict
    server_log: str


def soak(tmp_path: Path, n: int, budget_s: float = BUDGET_S) -> SoakResult:
    """Run ``n`` planned requests against a fresh soak server; print the figures and the RSS curve."""
    refs = solo_references()
    plan = make_plan(refs, n)
    port_file, log_file = tmp_path / "port", tmp_path / "server.log"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with open(log_file, "wb") as log:
        server = subprocess.Popen([sys.executable, str(SERVER), str(port_file)], stdout=log, stderr=log, env=env)
    tally = Tally()
    try:
        deadline = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text()):
            assert server.poll() is None and time.monotonic() < deadline, log_file.read_text()
            time.sleep(0.05)
        port = int(port_file.read_text())
        url = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=url, timeout=30) as client:
            while True:
                try:
                    if client.get("/health").status_code == 200:
                        break
                except httpx.TransportError:
                    assert time.monotonic() < deadline, log_file.read_text()
                    time.sleep(0.05)
            rss_idle = rss_mb(server.pid)
            t0 = time.perf_counter()
            asyncio.run(asyncio.wait_for(run_soak(url, plan, refs, tally, server.pid), budget_s))
            wall = time.perf_counter() - t0
            running = waiting = -1.0
            for _ in range(200):  # the last abandoned requests leave at their next step boundary
                snap = metrics(client)
                running = gauge_mean(snap, "vllm:num_requests_running")
                waiting = gauge_mean(snap, "vllm:num_requests_waiting")
                if running == 0 and waiting == 0:
                    break
                time.sleep(0.05)
            failures = counter_total(snap, "specledger:request_failures")
            served = counter_total(snap, "vllm:request_success")
            # still serving, and exactly, after the soak
            after = client.post("/v1/completions", json={"prompt": PROMPTS[0], "max_tokens": 12,
                                                         "ignore_eos": True, "temperature": 0})
            assert after.json()["choices"][0]["text"] == refs[(PROMPTS[0], False, 12, (), True)][0]
        # every client of ours is closed but the never-reading ones: the server must have let go of those
        # too (keep-alive 5 s after their answers; the send timeout if their answers could not be sent)
        open_connections = -1
        for _ in range(100):
            open_connections = established_on(port)
            if open_connections == 0:
                break
            time.sleep(0.1)
    finally:
        for sock in tally.held:
            sock.close()
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(5)
    server_log = log_file.read_text(errors="replace")
    states = [line.split(" ", 1)[1] for line in server_log.splitlines() if line.startswith("soak-state ")]
    state = json.loads(states[-1]) if states else {}

    print(f"\nsoak: {sum(tally.by_class.values())} requests in {wall:.1f} s "
          f"({sum(tally.by_class.values()) / wall:.0f} req/s, concurrency {CONCURRENCY}); "
          f"by class {dict(tally.by_class)}")
    print(f"soak: outcomes {dict(sorted(tally.outcomes.items()))}; engine-finished requests {served:.0f}")
    print(f"soak: 5xx {len(tally.five_xx)}, transport errors {len(tally.errors)}, mismatches {len(tally.mismatches)}, "
          f"leaked slots running={running:.0f} waiting={waiting:.0f}, engine failures {failures:.0f}, "
          f"server connections left {open_connections}, held at shutdown {state}")
    curve = " ".join(f"{k}:{mb:.0f}" for k, mb in tally.rss)
    print(f"soak: server RSS MB, idle {rss_idle:.1f}; by requests done: {curve}")
    print(f"soak: RSS range over the second half {flat_range(tally.rss):.1f} MB (limit {FLAT_MB:.0f})")
    return SoakResult(n, wall, tally, running, waiting, failures, served, open_connections, rss_idle, state,
                      server_log)


def check_soak(res: SoakResult) -> None:
    """The soak's pass criteria (module docstring)."""
    tally = res.tally
    assert sum(tally.by_class.values()) == res.n
    assert len(tally.by_class) == 4 and min(tally.by_class.values()) >= res.n * NEVER_READ_SHARE / 3
    assert tally.five_xx == [], tally.five_xx[:5]
    assert tally.errors == [], tally.errors[:5]
    assert tally.mismatches == [], tally.mismatches[:5]
    assert tally.outcomes["good 200"] == tally.by_class["good"]  # no 429 either: 32 in flight < queue + batch
    assert (res.running, res.waiting) == (0, 0) and res.failures == 0
    assert res.open_connections == 0
    assert res.state and all(v == 0 for v in res.state.values()), res.state
    assert len(tally.rss) >= 4 and flat_range(tally.rss) < FLAT_MB
    assert "Traceback" not in res.server_log, res.server_log[-3000:]


def test_soak_mixed_requests(tmp_path) -> None:
    check_soak(soak(tmp_path, N_SUITE))
