"""The framework recipes (examples/recipes/, docs/recipes.md) run against the real frameworks.

Each recipe runs as its users run it, in its own processes on loopback: a prefork
``celery worker``, a ``uvicorn`` server driven over HTTP, Django's ``manage.py``. What
each test asserts is what the store or the server observed (the order of a Redis list,
the owner the store names, the tokens it issued), never how long something took.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from apps.exclusive import stop_on_sigterm
from faults import PATIENCE_S
from servers import LOOPBACK, free_port, require_module
from test_sync import backend_url

import leasekit.sync

RECIPES = Path(__file__).resolve().parent.parent / "examples" / "recipes"
APPS = Path(__file__).resolve().parent / "apps"


def recipe_env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(RECIPES), **extra}


# -- Celery ------------------------------------------------------------------------------------

RUNS = 8


@pytest.mark.slow
def test_celery_task_invocations_never_overlap(
    redis_url: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Concurrent invocations on a prefork pool run one at a time, in token order."""
    celery = require_module("celery", extra="self-test")
    redis = require_module("redis", extra="redis")
    broker = redis_url.split("?", 1)[0]
    runs_list = f"leasekit-test-recipe-{uuid.uuid4().hex[:8]}"
    queue = f"leasekit-recipe-{uuid.uuid4().hex[:8]}"
    log = tmp_path / "celery.log"
    env = recipe_env(
        LEASEKIT_URL=backend_url("redis", request, tmp_path),
        CELERY_BROKER_URL=broker,
        RECIPE_RUNS_LIST=runs_list,
    )
    argv = [
        sys.executable, "-m", "celery", "-A", "celery_single_run", "worker", "--pool",
        "prefork", "--concurrency", "4", "--queues", queue, "--without-heartbeat",
        "--without-gossip", "--without-mingle", "--loglevel", "INFO", "--logfile", str(log),
    ]  # fmt: skip
    worker = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    client = celery.Celery("client", broker=broker, backend=broker)
    try:
        results = [
            client.send_task("recipes.rebuild_index", args=[f"run-{n}"], queue=queue)
            for n in range(RUNS)
        ]
        answers: list[dict[str, Any]] = [r.get(timeout=12 * PATIENCE_S) for r in results]
    finally:
        client.close()
        code = stop_on_sigterm(worker, log, "the Celery worker")
    with redis.Redis.from_url(broker) as server:
        entries = [e.decode() for e in server.lrange(runs_list, 0, -1)]
        server.delete(runs_list)
    text = log.read_text()
    assert code == 0, text
    assert "Traceback" not in text, text
    assert len(answers) == RUNS
    assert len({a["pid"] for a in answers}) > 1, "one pool child ran everything"
    # The order Redis received the entries in: each start is followed by its own end.
    assert len(entries) == 2 * RUNS, entries
    starts, ends = entries[0::2], entries[1::2]
    for start, end in zip(starts, ends, strict=True):
        assert start.split()[0] == "start", entries
        assert end == start.replace("start", "end", 1), f"two runs overlapped: {entries}"
    tokens = [int(start.split()[2]) for start in starts]
    assert tokens == sorted(tokens), entries
    assert len(set(tokens)) == RUNS, entries


# -- FastAPI -----------------------------------------------------------------------------------


@pytest.fixture
def fastapi_server(
    redis_url: str, request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[str, str]]:
    """The FastAPI recipe served by a real uvicorn (two workers): its base URL, its store."""
    require_module("fastapi", extra="self-test")
    require_module("uvicorn", extra="self-test")
    url = backend_url("redis", request, tmp_path)
    port = free_port()
    log = tmp_path / "uvicorn.log"
    argv = [
        sys.executable, "-m", "uvicorn", "fastapi_conversations:app", "--host", LOOPBACK,
        "--port", str(port), "--workers", "2", "--timeout-graceful-shutdown",
        str(int(3 * PATIENCE_S)),
    ]  # fmt: skip
    with log.open("wb") as out:
        server = subprocess.Popen(argv, env=recipe_env(LEASEKIT_URL=url), stdout=out, stderr=out)
    base = f"http://{LOOPBACK}:{port}"
    try:
        deadline = time.monotonic() + 6 * PATIENCE_S
        while post(base, "probe")[0] != 200:
            assert server.poll() is None, log.read_text()
            assert time.monotonic() < deadline, f"uvicorn did not answer:\n{log.read_text()}"
            time.sleep(0.05)
        yield base, url
    finally:
        code = stop_on_sigterm(server, log, "uvicorn")
    text = log.read_text()
    assert code == 0, text
    assert "Traceback" not in text, text
    assert text.count("Application shutdown complete") == 2, text  # both lifespans ended


def post(base: str, conversation: str, query: str = "") -> tuple[int, dict[str, Any]]:
    """POST a message to ``conversation``: the status and the decoded body (0: no answer)."""
    body = json.dumps({"text": "hello"}).encode()
    target = f"{base}/conversations/{conversation}/messages{query}"
    headers = {"content-type": "application/json"}
    req = urllib.request.Request(target, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=3 * PATIENCE_S) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())
    except OSError:
        return 0, {}


@pytest.mark.slow
def test_fastapi_answers_a_conversation_under_its_lease(fastapi_server: tuple[str, str]) -> None:
    base, url = fastapi_server
    with leasekit.sync.connect(url) as leases:
        # Another replica holds c1: this one refuses with 409 and names it.
        assert leases.acquire_lease("conversation:c1", "other-replica", 60_000).acquired
        status, body = post(base, "c1")
        assert (status, body["detail"]["holder"]) == (409, "other-replica")
        assert leases.get_lease_owner("conversation:c1") == "other-replica"
        leases.release_lease("conversation:c1", "other-replica")

        # Free: answered while the store named this request's owner, released after.
        status, body = post(base, "c1")
        assert status == 200, body
        assert body["reply"] == "olleh"
        assert body["holder"] == body["owner"]
        assert leases.get_lease_owner("conversation:c1") is None

        # Many turns of one conversation at once, with ?wait=:
        # each ran while the store named it the holder, each under its own grant.
        with ThreadPoolExecutor(12) as pool:
            replies = list(pool.map(lambda _: post(base, "c2", "?wait=30"), range(24)))
        assert [status for status, _ in replies] == [200] * 24, replies
        assert all(body["holder"] == body["owner"] for _, body in replies)
        assert len({body["token"] for _, body in replies}) == 24
        assert leases.get_lease_owner("conversation:c2") is None

        # A key leasekit refuses (over 1024 bytes) is the client's error.
        status, body = post(base, "x" * 2000)
        assert status == 400, body
        assert "key" in body["detail"]["error"]


# -- Django ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_django_command_runs_on_one_host_when_two_race(
    redis_url: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Two ``manage.py send_digest`` at once: one sends, the other names it and skips."""
    require_module("django", extra="self-test")
    url = backend_url("redis", request, tmp_path)
    gate = tmp_path / "gate"
    gate.mkdir()
    env = {
        **recipe_env(LEASEKIT_URL=url, RECIPE_GATE=str(gate)),
        "PYTHONPATH": os.pathsep.join([str(RECIPES / "django_digest"), str(APPS)]),
        "DJANGO_EMAIL_BACKEND": "gated_email.GatedEmailBackend",
    }
    argv = [sys.executable, str(RECIPES / "django_digest" / "manage.py"), "send_digest"]
    hosts = [
        subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for _ in range(2)
    ]
    try:
        # The sender waits at the gate until it is opened: the other one must finish
        # first, having found the lease held.
        deadline = time.monotonic() + 6 * PATIENCE_S
        while not (entered := list(gate.glob("entered-*"))) or all(
            host.poll() is None for host in hosts
        ):
            assert time.monotonic() < deadline, "neither host skipped while one was sending"
            time.sleep(0.01)
        (sender,) = [host for host in hosts if host.pid == int(entered[0].name.split("-")[1])]
        (skipper,) = [host for host in hosts if host is not sender]
        out, err = skipper.communicate(timeout=3 * PATIENCE_S)
        assert (skipper.returncode, err) == (0, b""), err.decode()
        with leasekit.sync.connect(url) as leases:
            holder = leases.get_lease_owner("send-digest")
            assert holder is not None
            assert holder.startswith("digest@")
            assert out.decode() == f"skipped: {holder} is sending the digest\n"
            (gate / "open").touch()
            out, err = sender.communicate(timeout=3 * PATIENCE_S)
            assert (sender.returncode, err) == (0, b""), err.decode()
            assert out.decode().startswith(f"digest sent by {holder} (token ")
            assert leases.get_lease_owner("send-digest") is None
        assert [p.name for p in gate.glob("sent-*")] == [f"sent-{sender.pid}"]
    finally:
        for host in hosts:
            if host.poll() is None:
                host.kill()
                host.communicate()


def test_the_recipes_page_quotes_the_recipes_as_they_are() -> None:
    page = (RECIPES.parent.parent / "docs" / "recipes.md").read_text(encoding="utf-8")
    blocks = re.findall(r"^```python\n(.*?)^```$", page, re.MULTILINE | re.DOTALL)
    sources = [p.read_text(encoding="utf-8") for p in sorted(RECIPES.rglob("*.py"))]
    assert len(blocks) == 4
    stale = [block for block in blocks if not any(block in source for source in sources)]
    assert not stale, f"docs/recipes.md quotes code the recipes no longer have: {stale}"
