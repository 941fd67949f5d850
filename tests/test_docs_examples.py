"""The documentation's code is tested code: the quickstart, the README and every page.

Each example runs in a fresh interpreter, the way a reader would run it, so state
cannot leak between examples and an example cannot lean on the test process.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

import leasekit

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
QUICKSTART = ROOT / "examples" / "quickstart.py"

# A fenced block: ```lang, the body, ```. The README example is followed by a
# ```text block holding exactly what it prints.
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def fenced_blocks(path: Path) -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) for m in FENCE.finditer(path.read_text(encoding="utf-8"))]


def doc_files() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def python_blocks() -> list[pytest.ParameterSet]:
    params = []
    for path in doc_files():
        blocks = [body for lang, body in fenced_blocks(path) if lang == "python"]
        for index, body in enumerate(blocks, 1):
            rel = path.relative_to(ROOT)
            params.append(pytest.param(body, id=f"{rel}#{index}"))
    return params


def run_python(*args: str, cwd: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-W", "error", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    assert done.stderr == ""
    return done.stdout


def test_quickstart_runs_and_reports_each_step(tmp_path: Path) -> None:
    out = run_python(str(QUICKSTART), cwd=tmp_path)
    assert out.splitlines() == [
        "worker-a acquire: acquired=True owner=worker-a",
        "worker-b acquire: acquired=False owner=worker-a",
        "transfer worker-a -> worker-b: True",
        "owner now: worker-b",
        "worker-b token is newer than worker-a's: True",
        "worker-a renew: False",
        "owner after worker-a's release: worker-b",
        "owner after worker-b's release: None",
    ]


def test_readme_example_prints_what_the_readme_shows(tmp_path: Path) -> None:
    blocks = fenced_blocks(README)
    langs = [lang for lang, _ in blocks]
    first = langs.index("python")
    assert langs[first + 1] == "text", "the README example must be followed by its output"
    code, shown = blocks[first][1], blocks[first + 1][1]
    assert "leasekit.connect(" in code
    assert run_python("-c", code, cwd=tmp_path) == shown


@pytest.mark.parametrize("code", python_blocks())
def test_doc_python_block_compiles_and_complete_programs_run(code: str, tmp_path: Path) -> None:
    # Fragments (a method, a sketch around a made-up driver) must at least be valid
    # Python; blocks that are whole programs, the ones calling asyncio.run, must run.
    compile(code, "<doc block>", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    if "asyncio.run(" in code:
        run_python("-c", code, cwd=tmp_path)


# Dotted names in the docs that are not attributes of the leasekit package.
NOT_ATTRIBUTES = {"backends", "db", "postgres"}  # entry-point group, leasekit.db, a logger


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_leasekit_name_the_docs_mention_exists(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    names = set(re.findall(r"\bleasekit\.([A-Za-z_]\w*)", text)) - NOT_ATTRIBUTES
    missing = sorted(name for name in names if not hasattr(leasekit, name))
    assert not missing, f"{path.name} documents names leasekit does not have: {missing}"


def test_contract_page_fencing_example_refuses_the_stale_writer(tmp_path: Path) -> None:
    blocks = [body for lang, body in fenced_blocks(DOCS / "contract.md") if lang == "python"]
    (fencing,) = [body for body in blocks if "class Ledger" in body]
    out = run_python("-c", fencing, cwd=tmp_path).splitlines()
    assert out[0].startswith("refused: stale fencing token")
    assert out[1] == "['a: started', 'b: started']"


def test_toml_blocks_parse_and_declare_entry_points() -> None:
    # The backend guide's own pyproject is checked further, by building it
    # (tests/test_docs_backend_guide.py).
    tomllib = pytest.importorskip("tomllib")
    entry_points = []
    for path in doc_files():
        for lang, body in fenced_blocks(path):
            if lang == "toml":
                entry_points.append(
                    tomllib.loads(body)
                    .get("project", {})
                    .get("entry-points", {})
                    .get("leasekit.backends")
                )
    assert entry_points
    assert all(isinstance(ep, dict) and ep for ep in entry_points)


def test_readme_commands_name_things_that_exist() -> None:
    tomllib = pytest.importorskip("tomllib")
    text = README.read_text(encoding="utf-8")
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert ".venv/bin/leasekit demo" in text
    assert "leasekit" in pyproject["project"]["scripts"]

    ci_commands = [
        line.strip()
        for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
        if "nox -s" in line and not line.lstrip().startswith("#")
    ]
    assert ci_commands, ".ci/run no longer runs nox"
    for line in ci_commands:
        assert line in text, f"CI runs {line!r}, which the README does not show"

    command = re.search(r"nox -s ([\w ]+)", text)
    assert command is not None
    noxfile = (ROOT / "noxfile.py").read_text(encoding="utf-8")
    for session in command.group(1).split():
        defined = rf"def {session}\(|name=[\"']{session}[\"']"
        assert re.search(defined, noxfile), f"README runs nox session {session!r}; none defined"


def test_readme_links_point_at_files_that_exist() -> None:
    # The site build checks the pages' links; the README is outside it.
    targets = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README.read_text(encoding="utf-8"))
    local = [t for t in targets if "://" not in t]
    assert local
    missing = [t for t in local if not (ROOT / t).exists()]
    assert not missing, f"README links to missing files: {missing}"


def test_readme_lists_every_documentation_page() -> None:
    text = README.read_text(encoding="utf-8")
    section = text.split("## Documentation", 1)[1]
    linked = set(re.findall(r"\]\((docs/[^)#]+)", section))
    pages = {str(p.relative_to(ROOT)) for p in DOCS.rglob("*.md")} - {"docs/index.md"}
    assert "docs/index.md" in linked
    assert not pages - linked, f"the README's documentation list leaves out {pages - linked}"


def test_the_project_cites_only_files_it_contains() -> None:
    # The architecture is docs/architecture.md; a design note outside the repository
    # is no reference for a reader of this one.
    outside = "DESIGN" + ".md"
    citing = [
        str(path.relative_to(ROOT))
        for top in (
            "leasekit",
            "backends",
            "contract_tests",
            "tests",
            "docs",
            "examples",
            "benchmarks",
            ".ci",
        )
        for path in (ROOT / top).rglob("*")
        if path.is_file()
        and path.suffix in {"", ".py", ".md", ".toml", ".yml"}
        and outside in path.read_text(encoding="utf-8", errors="replace")
    ]
    citing += [
        name
        for name in ("pyproject.toml", "README.md", "noxfile.py", "mkdocs.yml", "CHANGELOG.md")
        if outside in (ROOT / name).read_text(encoding="utf-8")
    ]
    assert not citing, f"{outside} is not in the repository, yet cited by {citing}"


@pytest.mark.parametrize("store", ["memory", "sqlite"])
def test_election_page_prints_what_it_shows_on_memory_and_on_sqlite(
    store: str, tmp_path: Path
) -> None:
    # SQLite has no release notifications: the successor is elected at a poll, later
    # than on memory://. The page's output must not depend on that.
    blocks = fenced_blocks(DOCS / "election.md")
    index = next(i for i, (lang, body) in enumerate(blocks) if "leasekit.elect(" in body)
    (code_lang, code), (shown_lang, shown) = blocks[index], blocks[index + 1]
    assert (code_lang, shown_lang) == ("python", "text")
    if store == "sqlite":
        code = code.replace('"memory://"', repr(f"sqlite:///{tmp_path / 'election.db'}"))
        assert "sqlite:///" in code
    assert run_python("-c", code, cwd=tmp_path) == shown


def test_overview_names_every_in_tree_backend() -> None:
    text = (DOCS / "index.md").read_text(encoding="utf-8")
    pages = sorted(p.relative_to(DOCS).as_posix() for p in (DOCS / "backends").glob("*.md"))
    assert "backends/mysql.md" in pages
    missing = [page for page in pages if f"]({page})" not in text]
    assert not missing, f"docs/index.md does not link the backend pages {missing}"
    (stores,) = [line for line in text.splitlines() if line.startswith("| stores |")]
    assert "MySQL/MariaDB" in stores.split("|")[2]  # leasekit's column of the comparison
