"""The noxfile's sessions: ``nox -s lint types tests docs -- ARGS`` gives ARGS to pytest only.

nox hands the same posargs to every session named on its command line; a session that
passed them on to mypy or ruff would fail with "unrecognized arguments". The noxfile
is loaded with a stand-in ``nox`` module that records what each session would run, so
this needs neither nox nor virtualenvs.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
ARGS = ("-k", "transfer", "-x")


class RecordingSession:
    """What a nox session receives, recording every command it runs."""

    def __init__(self, posargs: tuple[str, ...]) -> None:
        self.posargs = list(posargs)
        self.runs: list[tuple[str, ...]] = []

    def install(self, *args: str) -> None:
        pass

    def run(self, *args: str) -> None:
        self.runs.append(args)

    def create_tmp(self) -> str:
        return "/tmp/nox-session"  # never written: the run is only recorded


@pytest.fixture
def sessions(monkeypatch: pytest.MonkeyPatch) -> dict[str, Callable[[Any], None]]:
    """The noxfile's session functions, by name."""
    fake = types.ModuleType("nox")
    registered: dict[str, Callable[[Any], None]] = {}

    def session(**_: object) -> Callable[[Callable[[Any], None]], Callable[[Any], None]]:
        def register(func: Callable[[Any], None]) -> Callable[[Any], None]:
            registered[func.__name__] = func
            return func

        return register

    fake.session = session  # type: ignore[attr-defined]
    fake.options = types.SimpleNamespace()  # type: ignore[attr-defined]
    fake.Session = RecordingSession  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "nox", fake)
    spec = importlib.util.spec_from_file_location("leasekit_noxfile", ROOT / "noxfile.py")
    assert spec is not None
    assert spec.loader is not None
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    return registered


def test_posargs_reach_pytest_and_nothing_else(
    sessions: dict[str, Callable[[Any], None]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LEASEKIT_TEST_WORKERS", raising=False)
    ran: dict[str, list[tuple[str, ...]]] = {}
    for name in ("lint", "types", "tests", "docs"):
        session = RecordingSession(ARGS)
        sessions[name](session)
        ran[name] = session.runs
    workers = str(2 * (os.cpu_count() or 1))
    assert ran["tests"] == [("pytest", "-n", workers, "--dist", "worksteal", *ARGS)]
    for name in ("lint", "types", "docs"):
        for command in ran[name]:
            assert not set(ARGS) & set(command), f"nox -s {name} passed posargs to {command}"
    assert ran["types"] == [("mypy",)]


def test_the_tests_session_installs_leasekits_own_test_extra(
    sessions: dict[str, Callable[[Any], None]],
) -> None:
    installed: list[tuple[str, ...]] = []
    session = RecordingSession(())
    session.install = lambda *args: installed.append(args)  # type: ignore[method-assign]
    sessions["tests"](session)
    extras = next(a[-1] for a in installed if a[0] == "-e")
    assert extras.startswith(".[")
    assert "self-test" in extras[2:-1].split(",")


def test_the_tests_session_installs_mypy_so_the_guides_type_check_runs(
    sessions: dict[str, Callable[[Any], None]],
) -> None:
    # Without mypy, tests/test_docs_backend_guide.py's strict check of the guide's
    # package skips, and a reader's `mypy --strict` could fail unnoticed.
    installed: dict[str, list[str]] = {}
    for name in ("tests", "types"):
        session = RecordingSession(())
        packages: list[str] = []
        session.install = lambda *args, into=packages: into.extend(args)  # type: ignore[method-assign]
        sessions[name](session)
        installed[name] = [p for p in packages if p.startswith("mypy")]
    assert installed["tests"], "nox -s tests does not install mypy"
    assert installed["tests"] == installed["types"]  # one pin for both
