"""The backend guide, followed as written: its files make a package that passes the suite.

``docs/writing-a-backend.md`` shows every file of its example plugin whole, each code
block starting with a ``# file: PATH`` line. These tests write those blocks into a
fresh directory, exactly as a reader would save them, and then do what the page says:
run the conformance suite on the package through both drivers (a pytest subprocess
with the page's own pytest configuration), install it and reach it through its entry
point by URL, and type-check it strictly. Nothing comes from ``examples/`` or from the test process.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

import pytest
from leasekit_contract import (
    BATCHED_RENEWAL_CHECKS,
    BLOCKING_DRIVER_SKIPS,
    FAIR_WAITING_CHECKS,
    RELEASE_GRANT_CHECK,
    ROUTING_CHECKS,
    SLOT_CHECKS,
    WAKE_UP_CHECKS,
)

ROOT = Path(__file__).resolve().parent.parent
GUIDE = ROOT / "docs" / "writing-a-backend.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
MARKER = re.compile(r"# file: (\S+)")
PACKAGE_FILES = {"pyproject.toml", "leasekit_tinystore/__init__.py", "tests/test_conformance.py"}
RUN_TIMEOUT_S = 600


def guide_files() -> dict[str, str]:
    """The page's code blocks that start with ``# file: PATH``, by path."""
    files: dict[str, str] = {}
    for match in FENCE.finditer(GUIDE.read_text(encoding="utf-8")):
        first_line = match.group(2).partition("\n")[0]
        marker = MARKER.fullmatch(first_line)
        if marker is not None:
            assert marker.group(1) not in files, f"{marker.group(1)} is shown twice"
            files[marker.group(1)] = match.group(2)
    return files


def _env(pythonpath: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTEST_ADDOPTS", None)
    env["PYTHONPATH"] = str(pythonpath)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _run(command: list[str], *, cwd: Path, pythonpath: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command,
        cwd=cwd,
        env=_env(pythonpath),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )


@pytest.fixture(scope="module")
def guide_package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The page's files saved under their names, plus the empty py.typed it touches."""
    root = tmp_path_factory.mktemp("guide") / "leasekit-tinystore"
    for name, body in guide_files().items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body, encoding="utf-8")
    (root / "leasekit_tinystore" / "py.typed").touch()
    return root


def test_guide_shows_every_file_of_its_package() -> None:
    text = GUIDE.read_text(encoding="utf-8")
    assert set(guide_files()) == PACKAGE_FILES
    assert "touch leasekit_tinystore/py.typed" in text
    # leasekit is not on PyPI: the page must say how to install it before the plugin.
    assert text.index("pip install -e '/path/to/leasekit[test]'") < text.index(
        "pip install -e '.[test]'"
    )


@pytest.mark.slow
def test_guide_package_passes_the_conformance_suite(guide_package: Path) -> None:
    report = guide_package / "junit.xml"
    proc = _run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", f"--junitxml={report}"],
        cwd=guide_package,
        pythonpath=guide_package,
    )
    output = proc.stdout[-6000:] + proc.stderr[-3000:]
    assert proc.returncode == 0, output
    # By class: the suite runs twice, through the async and the blocking driver.
    outcomes: dict[str, dict[str, str]] = {}
    for case in ET.parse(report).iter("testcase"):
        tags = {child.tag for child in case}
        outcome = next(
            (
                o
                for tag, o in (("failure", "failed"), ("error", "error"), ("skipped", "skipped"))
                if tag in tags
            ),
            "passed",
        )
        cls = case.get("classname", "").rpartition(".")[2]
        outcomes.setdefault(cls, {})[case.get("name", "")] = outcome
    assert set(outcomes) == {"TestTinyLeaseProvider", "TestTinyLeaseProviderBlocking"}, output
    for cls, by_name in outcomes.items():
        counts = Counter(by_name.values())
        assert counts["failed"] == counts["error"] == 0, output
        assert counts["passed"] >= 100, f"{cls}: the suite hardly ran: {dict(counts)}\n{output}"
        # An in-process store without notifications, metadata or slots: only the
        # multi-process, the wake-up, the routing, slot and fair-waiting checks, and (without
        # renew_leases or release_grant) the batched-renewal and release_grant checks
        # may skip; through the blocking driver, also the checks that cannot apply to a
        # blocking call.
        blocking = cls.endswith("Blocking")
        skipped = sorted(name for name, outcome in by_name.items() if outcome == "skipped")
        assert all(
            "processes" in name
            or name in WAKE_UP_CHECKS
            or name.split("[")[0] in BATCHED_RENEWAL_CHECKS
            or name == RELEASE_GRANT_CHECK
            or name.split("[")[0] in ROUTING_CHECKS
            or name.split("[")[0] in SLOT_CHECKS
            or name.split("[")[0] in FAIR_WAITING_CHECKS
            or (blocking and name.split("[")[0] in BLOCKING_DRIVER_SKIPS)
            for name in skipped
        ), (cls, skipped)
        assert "test_aclose_with_operations_in_flight_settles_every_caller" in by_name
    # The blocking driver's own lifecycle checks ran, on leasekit.sync's facade.
    blocking_outcomes = outcomes["TestTinyLeaseProviderBlocking"]
    assert blocking_outcomes["test_blocking_provider_repr_shows_it_closed"] == "passed"
    assert blocking_outcomes["test_blocking_provider_is_a_context_manager_that_closes_it"] == (
        "passed"
    )


@pytest.mark.slow
def test_guide_package_installs_and_is_found_by_its_scheme(
    guide_package: Path, tmp_path: Path
) -> None:
    if importlib.util.find_spec("pip") is None or importlib.util.find_spec("hatchling") is None:
        pytest.skip("installing the guide's package offline needs pip and hatchling")
    target = tmp_path / "installed"
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    proc = _run(
        [*pip, "--no-index", "--no-build-isolation", "--no-deps", "--target", str(target), "."],
        cwd=guide_package,
        pythonpath=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    script = (
        "import asyncio, leasekit\n"
        "async def main():\n"
        "    async with leasekit.connect('tinystore://jobs?timeout_s=2&max_keys=10') as leases:\n"
        "        print(type(leases).__name__, leases.timeout_s, leases.max_keys)\n"
        "        print(await leases.acquire_lease('thread-42', 'worker-1', 30_000))\n"
        "        print([(r.key, r.owner, r.token) for r in await leases.inspect('thread-')])\n"
        "    print(repr(leases))\n"
        "    try:\n"
        "        leasekit.connect('tinystore://jobs?colour=blue')\n"
        "    except leasekit.InvalidLeaseArgument as exc:\n"
        "        print('refused', exc.argument)\n"
        "asyncio.run(main())\n"
    )
    run = _run([sys.executable, "-W", "error", "-c", script], cwd=tmp_path, pythonpath=target)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.splitlines() == [
        "TinyLeaseProvider 2.0 10",
        "LeaseResult(acquired=True, owner='worker-1', token=1)",
        "[('thread-42', 'worker-1', 1)]",
        "TinyLeaseProvider('jobs', closed)",
        "refused url",
    ]


@pytest.mark.slow
def test_guide_package_type_checks_strictly(guide_package: Path) -> None:
    if importlib.util.find_spec("mypy") is None:
        pytest.skip("mypy is not installed")
    proc = _run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "leasekit_tinystore"],
        cwd=guide_package,
        pythonpath=guide_package,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def renew_leases_snippet() -> str:
    """The optional ``renew_leases`` block, as additions to the package's two classes."""
    (block,) = [
        body
        for lang, body in FENCE.findall(GUIDE.read_text(encoding="utf-8"))
        if lang == "python" and "async def renew_leases" in body
    ]
    # The block shows additions to the classes of leasekit_tinystore/__init__.py: as
    # subclasses appended to that module, they add exactly that.
    for header, subclass in (
        ("class Store:\n", "class Store(Store):\n"),
        (
            "class TinyLeaseProvider(BackendProvider):\n",
            "class TinyLeaseProvider(TinyLeaseProvider):\n",
        ),
    ):
        assert header in block, f"the renew_leases block no longer adds to {header.strip()}"
        block = block.replace(header, subclass)
    return block


@pytest.mark.slow
def test_guide_renew_leases_block_runs_on_the_guide_store(
    guide_package: Path, tmp_path: Path
) -> None:
    """The optional batch renewal, added as the page says, passes the suite's batch checks."""
    package = tmp_path / "leasekit-tinystore"
    shutil.copytree(guide_package, package)
    init = package / "leasekit_tinystore" / "__init__.py"
    init.write_text(init.read_text(encoding="utf-8") + "\n\n" + renew_leases_snippet())
    selected = " or ".join(sorted(BATCHED_RENEWAL_CHECKS))
    proc = _run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-q",
            "-rs",
            "-k",
            f"TestTinyLeaseProvider and not Blocking and ({selected})",
        ],
        cwd=package,
        pythonpath=package,
    )
    output = proc.stdout[-6000:] + proc.stderr[-3000:]
    assert proc.returncode == 0, output
    assert re.search(r"\b\d+ passed\b", output), output
    assert "skipped" not in output, output
