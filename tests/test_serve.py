"""`specgen serve` against a live server on a free loopback port, with the real `openai` and
`ollama` client packages: answers equal `specgen run`'s, the APIs' shapes and errors, the
queue, disconnects, the history, metrics, a load test, a fuzz test and clean shutdown."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import ollama
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from specgen.app.session import open_session
from specgen.app.store import load_runs
from specgen.cli import app
from specgen.profiles import load_profile
from specgen.serve.server import Server, is_loopback

SRC = str(Path(__file__).resolve().parents[1] / "src")
LONG = 2000  # tokens: a generation that runs for seconds on the tiny pair (it never ends early)


def start(session, **options) -> tuple[Server, threading.Thread]:
    server = Server(session, "127.0.0.1", 0, **options)
    server.bind()
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not server.started and time.time() < deadline:
        time.sleep(0.02)
    assert server.started
    return server, thread


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("serve") / "history.sqlite3"


@pytest.fixture(scope="module")
def server(tiny_profile, db):
    session = open_session(load_profile(str(tiny_profile)))
    server, thread = start(session, stats_db=db)
    yield server
    server.stop()
    thread.join(30)
    assert not thread.is_alive()


@pytest.fixture
def oa(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture
def ol(server) -> ollama.Client:
    return ollama.Client(host=server.url)


@pytest.fixture
def http(server):
    with httpx.Client(base_url=server.url, timeout=60) as client:
        yield client


def serve_runs(db: Path) -> list[dict]:
    return [r for r in load_runs(db) if r["command"] == "serve"]


def run_cli(profile, *args) -> dict:
    """`specgen run --format json` in this process, with its own history file."""
    result = CliRunner().invoke(app, ["run", "-p", str(profile), "--format", "json", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.fixture(autouse=True)
def _no_history_in_home(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECGEN_STATS_DB", str(tmp_path / "cli-history.sqlite3"))


# --- the answers are specgen run's --------------------------------------------------------

def test_chat_answers_equal_specgen_run(tiny_profile, oa, ol):
    expected = run_cli(tiny_profile, "--max-new-tokens", "20", "def quicksort(xs):")["text"]
    messages = [{"role": "user", "content": "def quicksort(xs):"}]
    whole = oa.chat.completions.create(model="tiny", messages=messages, max_tokens=20)
    assert whole.choices[0].message.content == expected
    assert whole.choices[0].finish_reason == "length"
    streamed = oa.chat.completions.create(model="tiny", messages=messages, max_tokens=20, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == expected
    assert ol.chat(model="tiny", messages=messages, options={"num_predict": 20}).message.content == expected
    parts = ol.chat(model="tiny", messages=messages, options={"num_predict": 20}, stream=True)
    assert "".join(p.message.content for p in parts) == expected
    assert ol.generate(model="tiny", prompt="def quicksort(xs):", options={"num_predict": 20}).response == expected


def test_raw_completions_equal_specgen_run_raw(tiny_profile, oa, ol):
    expected = run_cli(tiny_profile, "--raw", "--max-new-tokens", "16", "The cache holds")["text"]
    whole = oa.completions.create(model="tiny", prompt="The cache holds", max_tokens=16)
    assert whole.choices[0].text == expected
    streamed = oa.completions.create(model="tiny", prompt="The cache holds", max_tokens=16, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == expected
    parts = ol.generate(model="tiny", prompt="The cache holds", raw=True, stream=True,
                        options={"num_predict": 16})
    assert "".join(p.response for p in parts) == expected


def test_seeded_sampling_is_reproducible_and_ollama_matches_openai(server, oa, ol, monkeypatch):
    # Adaptive K follows measured timings, and the draws follow K: a fixed K makes seeds repeat.
    monkeypatch.setattr(server.worker.session.generator, "adaptive", False)

    def ask_openai():
        return oa.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                          max_tokens=12, temperature=0.9, top_p=0.95, seed=7)

    first, second = ask_openai(), ask_openai()
    assert first.choices[0].message.content == second.choices[0].message.content
    via_ollama = ol.chat(model="tiny", messages=[{"role": "user", "content": "hi"}],
                         options={"num_predict": 12, "temperature": 0.9, "top_p": 0.95, "seed": 7})
    assert via_ollama.message.content == first.choices[0].message.content


# --- shapes -------------------------------------------------------------------------------

def test_usage_and_the_specgen_extension(oa):
    r = oa.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hello"}],
                                   max_tokens=15)
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-") and r.model == "tiny"
    assert r.usage.completion_tokens == 15
    assert r.usage.total_tokens == r.usage.prompt_tokens + 15
    ext = r.model_extra["specgen"]
    assert sum(ext["tokens"].values()) == 15
    assert set(ext["tokens"]) == {"accepted", "resampled", "bonus"}
    assert ext["accepted"] == ext["tokens"]["accepted"] <= ext["proposed"]
    assert ext["tau"] == pytest.approx(15 / ext["target_passes"], rel=1e-4)
    for key in ("acceptance_rate", "speedup_estimate", "k_max", "cached_tokens", "tokens_per_second"):
        assert key in ext


def test_stream_chunks_carry_sources_and_the_usage_chunk(oa):
    chunks = list(oa.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hello"}], max_tokens=15, stream=True,
        stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    content = [c for c in chunks if c.choices and c.choices[0].delta.content]
    sources = [s for c in content for s in c.model_extra["specgen"]["sources"]]
    assert set(sources) <= {"accepted", "resampled", "bonus"}
    final = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(final) == 1 and final[0].choices[0].finish_reason == "length"
    assert sum(final[0].model_extra["specgen"]["tokens"].values()) == 15
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 15
    assert all(c.usage is None for c in chunks[:-1])


def test_sse_framing_ends_with_done(http):
    body = {"model": "tiny", "prompt": "x", "max_tokens": 4, "stream": True}
    with http.stream("POST", "/v1/completions", json=body) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        text = r.read().decode()
    events = [e for e in text.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    assert json.loads(events[-2][6:])["choices"][0]["finish_reason"] == "length"


def test_ollama_ndjson_lines_and_final_counts(http):
    body = {"model": "tiny", "prompt": "hello", "options": {"num_predict": 6}}  # streams by default
    with http.stream("POST", "/api/generate", json=body) as r:
        assert r.headers["content-type"].startswith("application/x-ndjson")
        lines = r.read().decode().splitlines()
    objs = [json.loads(line) for line in lines]
    assert all(line for line in lines) and not any(o["done"] for o in objs[:-1])
    last = objs[-1]
    assert last["done"] and last["done_reason"] == "length" and last["eval_count"] == 6
    assert last["response"] == "" and last["total_duration"] >= last["eval_duration"] > 0
    assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", last["created_at"])


def test_listings_version_and_health(oa, ol, http):
    assert [m.id for m in oa.models.list()] == ["tiny"]
    assert oa.models.retrieve("tiny").id == "tiny"
    (listed,) = ol.list().models
    assert listed.model == "tiny" and listed.size > 0 and listed.details.family == "llama"
    assert ol.ps().models[0].model == "tiny"
    assert ol.show("tiny").modelinfo["llama.context_length"] == 4096
    assert http.get("/api/version").json()["version"]
    health = http.get("/health").json()
    assert health["status"] == "ok" and health["model"] == "tiny"


def test_ollama_empty_prompt_loads_and_latest_tag_is_accepted(ol):
    done = ol.generate(model="tiny:latest", prompt="")
    assert done.done and done.done_reason == "load" and done.response == ""


def test_stop_strings_cut_the_text_before_them(oa, ol):
    messages = [{"role": "user", "content": "stop here"}]
    full = oa.chat.completions.create(model="tiny", messages=messages, max_tokens=30).choices[0].message.content
    stop = full[8:11]
    cut = full[:full.index(stop)]
    r = oa.chat.completions.create(model="tiny", messages=messages, max_tokens=30, stop=[stop])
    assert r.choices[0].message.content == cut and r.choices[0].finish_reason == "stop"
    streamed = oa.chat.completions.create(model="tiny", messages=messages, max_tokens=30, stop=stop,
                                          stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == cut
    via_ollama = ol.chat(model="tiny", messages=messages, options={"num_predict": 30, "stop": [stop]})
    assert via_ollama.message.content == cut and via_ollama.done_reason == "stop"


def test_a_follow_up_turn_reuses_the_cached_prefix(oa):
    turn1 = [{"role": "user", "content": "first question"}]
    a1 = oa.chat.completions.create(model="tiny", messages=turn1, max_tokens=10)
    turn2 = turn1 + [{"role": "assistant", "content": a1.choices[0].message.content},
                     {"role": "user", "content": "and then?"}]
    a2 = oa.chat.completions.create(model="tiny", messages=turn2, max_tokens=10)
    cached = a2.usage.prompt_tokens_details.cached_tokens
    assert cached == a2.model_extra["specgen"]["cached_tokens"]
    assert cached >= a1.usage.prompt_tokens  # at least the first prompt was not run again


# --- refusals: 4xx in each API's own shape, and the server goes on ---------------------------

@pytest.mark.parametrize("kwargs, status, param", [
    (dict(model="gpt-4"), 404, "model"),
    (dict(max_tokens=5000), 400, "max_tokens"),
    (dict(max_tokens=0), 400, "max_tokens"),
    (dict(n=2), 400, "n"),
    (dict(temperature=-1), 400, "temperature"),
    (dict(top_p=0), 400, "top_p"),
    (dict(presence_penalty=0.5), 400, "presence_penalty"),
    (dict(logit_bias={"1": 5}), 400, "logit_bias"),
    (dict(tools=[{"type": "function", "function": {"name": "f"}}]), 400, "tools"),
    (dict(stop=[""]), 400, "stop"),
    (dict(seed=-3), 400, "seed"),
])
def test_openai_refusals(oa, http, kwargs, status, param):
    args = {"model": "tiny", "messages": [{"role": "user", "content": "x"}], **kwargs}
    with pytest.raises(openai.APIStatusError) as e:
        oa.chat.completions.create(**args)
    assert e.value.status_code == status and e.value.param == param
    assert e.value.body["message"] and e.value.type
    assert http.get("/health").status_code == 200


@pytest.mark.parametrize("kwargs, status", [
    (dict(model="llama3"), 404),
    (dict(options={"num_predict": 5000}), 400),
    (dict(options={"repeat_penalty": 1.1}), 400),
    (dict(options={"temperature": "hot"}), 400),
    (dict(format="json"), 400),
    (dict(messages=[{"role": "tool", "content": "x"}]), 400),
])
def test_ollama_refusals(ol, kwargs, status):
    args = {"model": "tiny", "messages": [{"role": "user", "content": "x"}], **kwargs}
    with pytest.raises(ollama.ResponseError) as e:
        ol.chat(**args)
    assert e.value.status_code == status and e.value.error


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/api/generate", "/api/chat"])
@pytest.mark.parametrize("raw", [
    b"", b"{", b"[1, 2]", b'"text"', b"null", b'{"model": "tiny", "max_tokens": NaN}',
    b'{"model": "tiny", "temperature": Infinity}', b'{"model": "tiny", "temperature": 1e999}',
    b'{"model": "tiny", "max_tokens": ' + b"9" * 5000 + b"}", b"\xff\xfe\x00{", b'{"prompt": "\xff"}',
    b"[" * 100_000, b'{"model": "tiny", "prompt": "\\ud800", "messages": [{"role": "user", "content": "\\ud800"}]}',
    b'{"model": 7}', b'{"model": "tiny", "messages": "hi", "prompt": 5}',
])
def test_malformed_bodies_get_400_in_the_apis_shape(http, path, raw):
    r = http.post(path, content=raw)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    if path.startswith("/api/"):
        assert isinstance(error, str) and error
    else:
        assert error["message"] and error["type"] == "invalid_request_error"


def test_unknown_routes_and_methods_answer_in_the_apis_shape(http):
    assert http.get("/v1/nothing").json()["error"]["message"]
    assert isinstance(http.get("/api/nothing").json()["error"], str)
    assert http.get("/v1/chat/completions").status_code == 405
    assert http.post("/v1/completions", content=b"x" * (9 * 1024 * 1024)).status_code == 413


# --- the queue, disconnects, order ----------------------------------------------------------

def open_stream(server: Server, path: str, body: dict) -> socket.socket:
    """A raw streaming request, read up to its first generated chunk: a client that can be
    killed at any moment (closing the socket)."""
    host, port = "127.0.0.1", server.port
    data = json.dumps(body).encode()
    sock = socket.create_connection((host, port), timeout=60)
    sock.sendall(b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 + f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    got = b""
    while b'"content"' not in got and b'"response"' not in got and b'"text":"' not in got:
        chunk = sock.recv(4096)
        assert chunk, got
        got += chunk
    return sock


def test_a_full_queue_answers_429_or_503_with_retry_after(server, oa, ol, monkeypatch):
    monkeypatch.setattr(server.worker, "max_queue", 0)
    sock = open_stream(server, "/v1/chat/completions", {
        "model": "tiny", "messages": [{"role": "user", "content": "busy"}], "max_tokens": LONG,
        "stream": True})
    try:
        with pytest.raises(openai.RateLimitError) as e:
            oa.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}])
        assert int(e.value.response.headers["retry-after"]) >= 1
        with pytest.raises(ollama.ResponseError) as e:
            ol.generate(model="tiny", prompt="x")
        assert e.value.status_code == 503
    finally:
        sock.close()
    monkeypatch.undo()
    r = oa.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=3)
    assert r.usage.completion_tokens == 3


@pytest.mark.parametrize("streamed", [True, False])
def test_a_disconnected_client_stops_its_generation(server, db, oa, streamed):
    before = len(serve_runs(db))
    body = {"model": "tiny", "prompt": "go on", "options": {"num_predict": LONG}, "stream": streamed}
    if streamed:
        sock = open_stream(server, "/api/generate", body)
    else:  # nothing comes back before the end: wait until it generates
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=60)
        data = json.dumps(body).encode()
        sock.sendall(b"POST /api/generate HTTP/1.1\r\nHost: x\r\n"
                     + f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
        deadline = time.time() + 30
        while not server.worker.busy and time.time() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)
    sock.close()
    started = time.time()
    r = oa.completions.create(model="tiny", prompt="next", max_tokens=3)  # starts promptly
    assert r.usage.completion_tokens == 3
    assert time.time() - started < 30
    runs = serve_runs(db)[before:]
    assert [r["ended"] for r in runs] == ["interrupted", "completed"]
    assert 0 < runs[0]["new_tokens"] < LONG and runs[0]["stop_reason"] == "interrupted"


def test_a_client_that_leaves_the_queue_is_never_run(server, db, oa):
    before = len(serve_runs(db))
    running = open_stream(server, "/api/generate", {"model": "tiny", "prompt": "first",
                                                    "options": {"num_predict": LONG}})
    waiting = socket.create_connection(("127.0.0.1", server.port), timeout=60)
    data = json.dumps({"model": "tiny", "prompt": "never", "max_tokens": 5}).encode()
    waiting.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                    + f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    deadline = time.time() + 30
    while server.worker.queue_length == 0 and time.time() < deadline:
        time.sleep(0.01)
    waiting.close()
    while server.worker.queue_length == 1 and time.time() < deadline:
        time.sleep(0.01)
    assert server.worker.queue_length == 0 and server.worker.busy  # dropped from the queue
    running.close()
    oa.completions.create(model="tiny", prompt="after", max_tokens=2)
    assert [r["ended"] for r in serve_runs(db)[before:]] == ["interrupted", "completed"]


def test_requests_run_one_at_a_time_in_arrival_order(server, db, oa, monkeypatch):
    monkeypatch.setattr(server.worker, "record_prompt", True)  # the history names each request
    before = len(serve_runs(db))
    first = open_stream(server, "/v1/completions", {"model": "tiny", "prompt": "slow",
                                                    "max_tokens": LONG, "stream": True})

    def ask(i: int) -> None:
        oa.completions.create(model="tiny", prompt=f"request {i}", max_tokens=2)

    threads = []
    deadline = time.time() + 30
    for i in range(4):  # arrival order 0, 1, 2, 3, all while the first still runs
        threads.append(threading.Thread(target=ask, args=(i,)))
        threads[-1].start()
        while server.worker.queue_length < i + 1 and time.time() < deadline:
            time.sleep(0.005)
    assert server.worker.busy and server.worker.queue_length == 4
    first.close()
    for t in threads:
        t.join(60)
    runs = serve_runs(db)[before:]  # in the order they ran (rows are appended as each ends)
    assert [r["prompt"] for r in runs] == ["slow"] + [f"request {i}" for i in range(4)]
    assert runs[0]["ended"] == "interrupted"
    starts = [r["created_at"] - r["wall_seconds"] for r in runs]
    ends = [r["created_at"] for r in runs]
    assert all(end <= start + 1e-3 for end, start in zip(ends, starts[1:]))  # never overlapping


# --- history and metrics --------------------------------------------------------------------

def test_every_request_is_recorded_and_prompts_only_when_asked(server, db, oa, monkeypatch):
    before = len(serve_runs(db))
    r = oa.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "secret"}],
                                   max_tokens=4, temperature=0.5, seed=1)
    monkeypatch.setattr(server.worker, "record_prompt", True)
    oa.completions.create(model="tiny", prompt="shown", max_tokens=4)
    quiet, shown = serve_runs(db)[before:]
    assert quiet["prompt"] is None and quiet["temperature"] == 0.5 and quiet["profile"] == "tiny"
    assert quiet["new_tokens"] == r.usage.completion_tokens and quiet["ended"] == "completed"
    assert shown["prompt"] == "shown"


def test_metrics_are_prometheus_text(server, http, oa):
    oa.completions.create(model="tiny", prompt="count me", max_tokens=8)
    r = http.get("/metrics")
    assert r.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    text = r.text
    assert text.endswith("\n")
    samples = {}
    for line in text.splitlines():
        if line.startswith("#"):
            assert re.match(r"# (HELP|TYPE) specgen_\w+ ", line)
            continue
        name, value = line.rsplit(" ", 1)
        assert re.match(r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{(\w+="[^"]*",?)+\})?$', name)
        samples[name] = float(value)
    assert samples['specgen_requests_total{endpoint="/v1/completions",status="200"}'] >= 1
    generated = sum(v for k, v in samples.items() if k.startswith("specgen_generated_tokens_total"))
    assert generated >= 8 and samples["specgen_queue_length"] == 0
    assert samples['specgen_draft_position_proposed_total{position="1"}'] >= \
        samples['specgen_draft_position_accepted_total{position="1"}']
    assert samples["specgen_draft_tokens_accepted_total"] <= samples["specgen_draft_tokens_proposed_total"]


def test_api_key(tiny_profile, tmp_path):
    session = open_session(load_profile(str(tiny_profile)))
    server, thread = start(session, api_key="s3cret", stats_db=tmp_path / "h.sqlite3")
    try:
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0).models.list()
        good = openai.OpenAI(base_url=server.url + "/v1", api_key="s3cret", max_retries=0)
        assert good.completions.create(model="tiny", prompt="x", max_tokens=2).usage.completion_tokens == 2
        with pytest.raises(ollama.ResponseError) as e:
            ollama.Client(host=server.url).list()
        assert e.value.status_code == 401
        authed = ollama.Client(host=server.url, headers={"Authorization": "Bearer s3cret"})
        assert authed.list().models
        assert httpx.get(server.url + "/metrics").status_code == 401
        assert httpx.get(server.url + "/health").status_code == 200
    finally:
        server.stop()
        thread.join(30)


def test_binding_beyond_loopback_without_a_key_warns(tiny_profile, monkeypatch):
    import specgen.cli.serve as cli_serve
    import specgen.serve.server as server_module

    class FakeServer:
        url = "http://0.0.0.0:1"

        def __init__(self, *args) -> None:
            pass

        def bind(self) -> None:
            pass

        def run(self) -> None:
            pass

    monkeypatch.setattr(server_module, "Server", FakeServer)
    monkeypatch.setattr(cli_serve, "load_session", lambda prof: None)
    runner = CliRunner()
    wide = runner.invoke(app, ["serve", "-p", str(tiny_profile), "--host", "0.0.0.0"])
    assert wide.exit_code == 0 and "without an API key" in wide.stderr
    keyed = runner.invoke(app, ["serve", "-p", str(tiny_profile), "--host", "0.0.0.0", "--api-key", "k"])
    assert keyed.exit_code == 0 and "without an API key" not in keyed.stderr
    for bad, message in (("--max-queue=-1", "--max-queue must be 0 or more"),
                         ("--port=70000", "--port must be from 0 to 65535")):
        refused = runner.invoke(app, ["serve", "-p", str(tiny_profile), bad])
        assert refused.exit_code == 2 and message in refused.stderr
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.2")


# --- load ---------------------------------------------------------------------------------

def test_eight_streaming_clients_times_four_requests(server, db):
    prompts = {(c, i): f"client {c} request {i}: {'abcdefgh'[c] * (i + 1)}" for c in range(8) for i in range(4)}
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    sequential = {key: client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": p}], max_tokens=12).choices[0].message.content
        for key, p in prompts.items()}
    before = len(serve_runs(db))

    victim = open_stream(server, "/v1/chat/completions", {
        "model": "tiny", "messages": [{"role": "user", "content": "victim"}], "max_tokens": LONG,
        "stream": True})
    answers: dict = {}
    errors: list = []

    def run_client(c: int) -> None:
        mine = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        try:
            for i in range(4):
                chunks = mine.chat.completions.create(
                    model="tiny", messages=[{"role": "user", "content": prompts[c, i]}],
                    max_tokens=12, stream=True)
                answers[c, i] = "".join(ch.choices[0].delta.content or "" for ch in chunks)
        except Exception as e:  # reported below, with the others
            errors.append(e)

    threads = [threading.Thread(target=run_client, args=(c,)) for c in range(8)]
    for t in threads:
        t.start()
    time.sleep(0.3)
    victim.close()  # killed mid-stream while the others wait behind it
    for t in threads:
        t.join(120)
    assert not errors and answers == sequential
    runs = serve_runs(db)[before:]
    completed = [r for r in runs if r["ended"] == "completed"]
    (killed,) = [r for r in runs if r["ended"] == "interrupted"]
    assert len(completed) == 32 and len(runs) == 33
    assert killed["new_tokens"] < LONG


# --- fuzz ---------------------------------------------------------------------------------

def test_fuzzed_bodies_never_get_5xx(server, http):
    scalars = (st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False)
               | st.text(max_size=20) | st.sampled_from(["tiny", "user", "system", "text", ""]))
    values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                          | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=8)
    message = st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant", "tool", 3]),
                                     "content": values})
    keys = ["max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stream", "n", "options",
            "prompt", "raw", "system", "stream_options", "logprobs", "presence_penalty"]
    body = st.fixed_dictionaries(
        {"model": st.sampled_from(["tiny", "tiny:latest", "other", None, 1])},
        optional={"messages": st.lists(message | values, max_size=3),
                  **{k: values for k in keys},
                  "options": st.dictionaries(st.sampled_from(
                      ["num_predict", "temperature", "top_p", "top_k", "seed", "stop", "repeat_penalty"]),
                      values, max_size=3)})
    # Near-valid bodies reach the generator, and the checks of each value's range.
    text = st.text(max_size=12)
    near = st.fixed_dictionaries(
        {"model": st.just("tiny"), "messages": st.lists(st.fixed_dictionaries(
            {"role": st.sampled_from(["user", "system", "assistant"]), "content": text}), min_size=1, max_size=2),
         "prompt": text},
        optional={"max_tokens": st.integers(-3, 8), "temperature": st.floats(-1, 3),
                  "top_p": st.floats(-0.5, 1.5), "top_k": st.integers(-2, 50),
                  "seed": st.integers(-5, 2**64), "stop": text | st.lists(text, max_size=3),
                  "stream": st.booleans(), "raw": st.booleans(),
                  "options": st.fixed_dictionaries({}, optional={
                      "num_predict": st.integers(-3, 8), "temperature": st.floats(-1, 3),
                      "top_k": st.integers(-2, 50), "seed": st.integers(-5, 2**64),
                      "stop": st.lists(text, max_size=2)})})
    paths = st.sampled_from(["/v1/chat/completions", "/v1/completions", "/api/generate", "/api/chat"])
    raw = st.binary(max_size=64) | (body | near | near).map(lambda b: json.dumps(b).encode())

    @settings(max_examples=120, deadline=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(paths, raw)
    def post(path: str, content: bytes) -> None:
        try:
            data = json.loads(content)
            for fields in (data, data.get("options")) if isinstance(data, dict) else ():
                for key in ("max_tokens", "num_predict"):  # keep valid requests short
                    value = fields.get(key) if isinstance(fields, dict) else None
                    if isinstance(value, int) and (value > 8 or value in (-1, -2)):
                        fields[key] = 8
            content = json.dumps(data).encode()
        except ValueError:
            pass
        with http.stream("POST", path, content=content) as r:
            r.read()
        assert r.status_code < 500, (r.status_code, content, r.text)

    post()
    assert http.get("/health").json()["status"] == "ok"


# --- shutdown -------------------------------------------------------------------------------

@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_generation_records_it_and_exits_0(tiny_profile, tmp_path, sig):
    db = tmp_path / "h.sqlite3"
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1", "SPECGEN_STATS_DB": str(db)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "specgen", "serve", "-p", str(tiny_profile), "--port", "0"],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, env=env, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        url = None
        for line in proc.stderr:
            found = re.search(r"http://127\.0\.0\.1:\d+", line)
            if found:
                url = found.group(0)
                break
        assert url, "the server did not start"
        port = int(url.rsplit(":", 1)[1])
        fake = type("S", (), {"port": port})()
        sock = open_stream(fake, "/api/chat", {"model": "tiny", "options": {"num_predict": LONG},
                                               "messages": [{"role": "user", "content": "go"}]})
        proc.send_signal(sig)
        tail = b""
        while chunk := sock.recv(65536):
            tail += chunk
        sock.close()
        assert proc.wait(timeout=60) == 0
        rest = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert b"shutting down" in tail and "Traceback" not in rest
    (run,) = load_runs(db)
    assert run["command"] == "serve" and run["ended"] == "interrupted" and run["new_tokens"] < LONG



def test_stop_text_never_sends_a_part_of_a_stop_string():
    from specgen.serve.worker import StopText

    def feed(stops, pieces):
        stopper, out = StopText(stops), ""
        for piece in pieces:
            text, hit = stopper.push(piece)
            out += text
            if hit:
                return out, True
        return out + stopper.flush(), False

    assert feed(["END"], ["ab", "cE", "N", "Dxyz"]) == ("abc", True)
    assert feed(["END"], ["ab", "cE", "N", "x"]) == ("abcENx", False)
    assert feed(["xy", "abc"], ["zab", "xy"]) == ("zab", True)  # the earliest stop wins
    assert feed(["aab"], ["a", "a", "a", "b"]) == ("a", True)
    assert feed([], ["a", "b"]) == ("ab", False)
