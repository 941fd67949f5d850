"""What leasekit ships: the sdist carries what its tests and README use, the wheel its
license and typing markers, and the extra third-party authors install stays minimal.

The distributions are built with hatchling's own build hooks, offline, from this checkout.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterator
from email.message import Message
from email.parser import Parser
from pathlib import Path

import pytest
from servers import require_module

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
README = ROOT / "README.md"

BUILD = "import sys, hatchling.build as b; print(getattr(b, 'build_' + sys.argv[1])(sys.argv[2]))"


def build(kind: str, out: Path) -> Path:
    """Build the ``sdist`` or ``wheel`` of this checkout into ``out``; its path."""
    require_module("hatchling", install="pip install hatchling")
    done = subprocess.run(
        [sys.executable, "-c", BUILD, kind, str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return out / done.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def sdist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sdist, unpacked: the directory a user gets from ``tar xzf``."""
    out = tmp_path_factory.mktemp("sdist")
    archive = build("sdist", out)
    with tarfile.open(archive) as tar:
        # The "data" filter (refuse links out of the tree) where this Python has it.
        if hasattr(tarfile, "data_filter"):
            tar.extractall(out, filter="data")
        else:
            tar.extractall(out)  # our own archive, built a moment ago
    (top,) = (p for p in out.iterdir() if p.is_dir())
    return top


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[zipfile.ZipFile]:
    with zipfile.ZipFile(build("wheel", tmp_path_factory.mktemp("wheel"))) as archive:
        yield archive


def used_by_the_tests() -> set[str]:
    """Every path the tests read from the checkout (``ROOT / "a" / "b"``), and the tests."""
    used = {str(p.relative_to(ROOT)) for p in TESTS.glob("*.py")}
    for source in TESTS.glob("*.py"):
        for chain in re.findall(r"ROOT((?:\s*/\s*\"[^\"]+\")+)", source.read_text("utf-8")):
            used.add("/".join(re.findall(r"\"([^\"]+)\"", chain)))
    return used


def used_by_the_readme() -> set[str]:
    """The files the README links to and the scripts and paths its commands name."""
    text = README.read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text)
    paths = re.findall(r"(?<![\w/.])((?:benchmarks|examples|docs|\.ci)/[\w./-]*\w)", text)
    return {"README.md", *links, *paths}


def test_the_sdist_ships_every_file_the_tests_and_the_readme_use(sdist: Path) -> None:
    used = used_by_the_tests() | used_by_the_readme()
    assert "benchmarks/hooks_overhead.py" in used  # the scan finds what it must
    assert "benchmarks/redis_bench.py" in used
    assert ".ci/run" in used
    missing = sorted(
        path for path in used if (ROOT / path).exists() and not (sdist / path).exists()
    )
    assert not missing, f"the sdist lacks files the tests or the README use: {missing}"


@pytest.mark.slow  # a child pytest, and the hooks benchmark in it
def test_tests_pass_from_the_unpacked_sdist(sdist: Path) -> None:
    # Tests that read benchmarks/, examples/, docs/, .ci/run and the README, run from
    # the sdist's own tree (leasekit itself is the one installed here).
    tests = [
        "tests/test_hooks.py::test_the_overhead_benchmark_runs",
        "tests/test_docs_examples.py::test_readme_links_point_at_files_that_exist",
        "tests/test_docs_examples.py::test_readme_commands_name_things_that_exist",
    ]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests],
        cwd=sdist,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{len(tests)} passed" in done.stdout, done.stdout


def test_the_license_ships_in_the_sdist_and_the_wheel(sdist: Path, wheel: zipfile.ZipFile) -> None:
    license_text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert license_text.startswith("MIT License")
    assert (sdist / "LICENSE").read_text(encoding="utf-8") == license_text
    (licensed,) = (n for n in wheel.namelist() if n.endswith(".dist-info/licenses/LICENSE"))
    assert wheel.read(licensed).decode() == license_text
    metadata = wheel_metadata(wheel)
    assert metadata["License-Expression"] == "MIT"
    urls = dict(url.split(", ", 1) for url in metadata.get_all("Project-URL") or [])
    assert {"Homepage", "Documentation", "Source", "Issues", "Changelog"} <= set(urls)


def test_every_package_in_the_wheel_is_typed(wheel: zipfile.ZipFile) -> None:
    names = wheel.namelist()
    packages = {n.split("/", 1)[0] for n in names if n.endswith("/__init__.py")}
    assert {"leasekit", "leasekit_sqlite", "leasekit_redis", "leasekit_contract"} <= packages
    untyped = sorted(p for p in packages if f"{p}/py.typed" not in names)
    assert not untyped, f"packages without py.typed: {untyped}"


def test_the_test_extra_for_backend_authors_stays_minimal(wheel: zipfile.ZipFile) -> None:
    requires = wheel_metadata(wheel).get_all("Requires-Dist") or []

    def extra(name: str) -> set[str]:
        marker = f"extra == '{name}'"
        chosen = (r.split(";")[0] for r in requires if marker in r.replace('"', "'"))
        return {re.split(r"[\s<>=!~\[]", r.strip(), maxsplit=1)[0] for r in chosen}

    assert extra("test") == {"pytest", "anyio", "hypothesis"}
    assert "opentelemetry-sdk" in extra("self-test")
    assert extra("test") < extra("self-test")  # leasekit[test], plus leasekit's own needs


def wheel_metadata(wheel: zipfile.ZipFile) -> Message:
    (name,) = (n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    return Parser().parsestr(wheel.read(name).decode())
