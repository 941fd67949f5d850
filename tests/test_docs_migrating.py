"""docs/migrating.md: each before/after pair runs on real servers and prints what the page shows.

The page's programs name ``localhost`` and the stores' default ports; here those become
the harness's Redis and etcd. "Before" runs the other library (redis-py,
python-redis-lock, tooz, python-etcd3), "after" runs leasekit; both must print the
``text`` block that follows them, exactly.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from servers import require_module

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "migrating.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)

# Runs a block as `python -m asyncio` would: top-level await allowed.
RUNNER = """
import ast, asyncio, sys
flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
code = compile(sys.stdin.read(), "<docs/migrating.md>", "exec", flags=flags)
result = eval(code, {"__name__": "__main__"})
if asyncio.iscoroutine(result):
    asyncio.run(result)
"""

# The library each section's "before" program needs, by the section's title.
PEERS = {
    "redis-py's `Lock`": ("redis", "redis"),
    "redis-py's asyncio `Lock`": ("redis", "redis"),
    "python-redis-lock": ("redis_lock", "redis"),
    "tooz": ("tooz", "redis"),
    "python-etcd3": ("etcd3", "etcd"),
}


def pairs() -> list[pytest.ParameterSet]:
    text = PAGE.read_text(encoding="utf-8")
    found = []
    for section in re.split(r"^## ", text, flags=re.MULTILINE)[1:]:
        title = section.splitlines()[0].strip()
        blocks = [(m.group(1), m.group(2)) for m in FENCE.finditer(section)]
        assert [lang for lang, _ in blocks] == ["python", "python", "text"], title
        (_, before), (_, after), (_, shown) = blocks
        found.append(pytest.param(title, before, after, shown, id=title.replace("`", "")))
    return found


def test_the_page_has_a_pair_for_each_library() -> None:
    assert [p.values[0] for p in pairs()] == list(PEERS)


def run(code: str, *, strict: bool) -> str:
    env = {**os.environ, "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION": "python"}
    done = subprocess.run(
        [sys.executable, *(["-W", "error"] if strict else []), "-c", RUNNER],
        input=code,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    if strict:
        assert done.stderr == ""
    return done.stdout


@pytest.mark.slow  # two interpreters per pair, and the peers' start-up (python-redis-lock: 10 s)
@pytest.mark.parametrize(("title", "before", "after", "shown"), pairs())
def test_before_and_after_print_the_same(
    request: pytest.FixtureRequest, title: str, before: str, after: str, shown: str
) -> None:
    module, store = PEERS[title]
    if module == "etcd3":  # imports only with pure-Python protobuf: look, do not import
        if importlib.util.find_spec(module) is None:
            require_module(module, extra="self-test")  # skips, or fails under CI
    else:
        require_module(module, extra="self-test")
    if store == "redis":
        require_module("redis", extra="redis")
        where = urlsplit(request.getfixturevalue("redis_url"))
        replace = {
            "redis://localhost:6379/0": f"redis://{where.hostname}:{where.port}/0",
            "redis://localhost:6379": f"redis://{where.hostname}:{where.port}",
        }
    else:
        require_module("aetcd", extra="etcd")
        where = urlsplit(request.getfixturevalue("etcd_url"))
        replace = {
            'host="localhost", port=2379': f'host="{where.hostname}", port={where.port}',
            "etcd://localhost:2379": f"etcd://{where.hostname}:{where.port}",
        }

    def here(code: str) -> str:
        for old, new in replace.items():
            code = code.replace(old, new)
        assert "localhost" not in code

        return code

    assert run(here(before), strict=False) == shown  # third-party libraries may warn
    assert run(here(after), strict=True) == shown
