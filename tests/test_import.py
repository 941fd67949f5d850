"""Importing leasekit stays cheap: no backend driver or backend package is loaded.

Checked in a fresh interpreter, since this test process has imported plenty already.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import leasekit

# Drivers that belong to backends only, never to the core.
DRIVERS = ("redis", "psycopg", "psycopg_pool", "aetcd", "etcd3", "grpc", "aiosqlite")

PROBE = textwrap.dedent(
    """
    import json, sys

    def top_level():
        return sorted({name.partition(".")[0] for name in sys.modules})

    import leasekit
    stages = {"import": top_level()}

    leasekit.available_backends()
    stages["list"] = top_level()

    import asyncio

    async def main():
        async with leasekit.connect("memory://") as provider:
            result = await provider.acquire_lease("k", "owner", 1000)
            assert result.acquired, result

    asyncio.run(main())
    stages["connect"] = top_level()
    print(json.dumps(stages))
    """
)


@pytest.fixture(scope="module")
def loaded_modules(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """Top-level modules loaded after each stage, in a fresh interpreter."""
    cwd: Path = tmp_path_factory.mktemp("import-probe")
    completed = subprocess.run(
        [sys.executable, "-c", PROBE],
        capture_output=True,
        text=True,
        check=False,
        cwd=cwd,
        timeout=60,
    )
    assert completed.returncode == 0, completed.stderr
    stages: dict[str, list[str]] = json.loads(completed.stdout)
    return stages


@pytest.mark.parametrize("stage", ["import", "list", "connect"])
def test_no_backend_driver_is_imported(loaded_modules: dict[str, list[str]], stage: str) -> None:
    modules = set(loaded_modules[stage])
    assert "leasekit" in modules  # the probe really ran
    assert modules.isdisjoint(DRIVERS), sorted(modules.intersection(DRIVERS))


@pytest.mark.parametrize("stage", ["import", "list", "connect"])
def test_no_backend_package_is_imported(loaded_modules: dict[str, list[str]], stage: str) -> None:
    backends = [name for name in loaded_modules[stage] if name.startswith("leasekit_")]
    assert backends == []


def test_the_probe_sees_what_it_imports(loaded_modules: dict[str, list[str]]) -> None:
    # Guards the two tests above against a probe that reports nothing useful.
    assert "asyncio" in loaded_modules["connect"]
    assert "json" in loaded_modules["import"]


def _leasekit_imports(module: Path) -> set[str]:
    """The leasekit modules ``module`` imports, at top level or inside functions."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(module.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                found.add(node.module.partition(".")[0])
            else:
                found.update(alias.name for alias in node.names)
    return found


def test_hooks_and_plugins_share_state_without_importing_each_other() -> None:
    package = Path(leasekit.__file__).parent
    assert "plugins" not in _leasekit_imports(package / "_hooks.py")
    assert "_hooks" not in _leasekit_imports(package / "plugins.py")
    state = _leasekit_imports(package / "_plugin_state.py")
    assert state.isdisjoint({"_hooks", "plugins"}), state


def test_dir_shows_the_public_api_and_not_what_the_package_imports_for_itself() -> None:
    shown = dir(leasekit)
    assert not {"Any", "Iterable", "TYPE_CHECKING", "annotations", "importlib"} & set(shown)
    assert set(leasekit.__all__) <= set(shown)
    assert {"sync", "fencing", "testing", "plugins", "backend"} <= set(shown)
    assert shown == sorted(shown)
    for name in shown:
        getattr(leasekit, name)  # every name shown is there
