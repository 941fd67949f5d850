"""Every script in benchmarks/ imports: the docs and closing notes cite their commands."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = sorted((ROOT / "benchmarks").glob("*.py"))


@pytest.mark.parametrize("script", SCRIPTS, ids=[path.name for path in SCRIPTS])
def test_benchmark_script_imports(script: Path) -> None:
    # Imported, not run (each runs only under __main__): a stale import of a module
    # that moved fails here rather than in a reader's shell.
    code = (
        "import importlib.util, sys\n"
        f"sys.path.insert(0, {str(script.parent)!r})\n"
        f"spec = importlib.util.spec_from_file_location('bench_script', {str(script)!r})\n"
        "module = importlib.util.module_from_spec(spec)\n"
        "sys.modules['bench_script'] = module  # dataclasses look their module up\n"
        "spec.loader.exec_module(module)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
