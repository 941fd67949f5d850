"""Every developer task: ``nox -s lint types tests docs`` is what CI runs."""

from __future__ import annotations

import os

import nox

nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = True
nox.options.error_on_missing_interpreters = False
nox.options.sessions = ["lint", "types", "tests", "docs"]

PYTHON = "3"  # whichever python3 runs nox; CI pins nothing more
# leasekit's own test needs and every backend's driver, so the suite runs against each and
# mypy sees their types.
TEST_EXTRAS = "self-test,redis,postgres,etcd,mysql"
# Pinned: a new mypy release must not turn CI red by itself. The types session runs it;
# the tests session needs it too, for the backend guide's strict type check of its
# example package (tests/test_docs_backend_guide.py), which skips without it.
MYPY = "mypy==2.4.1"


def install_and_run(session: nox.Session, extras: str, *command: str) -> None:
    """Install leasekit with ``extras`` (editable) into the session, then run ``command``.

    ``nox -s lint types tests docs -- ARGS`` gives every session the same ARGS, so a
    session passes ``session.posargs`` on only where they mean something (pytest).
    """
    session.install("-e", f".[{extras}]" if extras else ".")
    session.run(*command)


@nox.session(python=PYTHON, tags=["memory"])
def tests(session: nox.Session) -> None:
    """The test suite: core units, the conformance suite on every available backend."""
    # hatchling builds the example third-party backend offline, as a user's pip would.
    session.install("hatchling", MYPY)
    # Two pytest-xdist workers per core: most of the suite waits on servers and TTLs,
    # not the CPU (docs/testing.md, Suite time: four workers on two cores ran the etcd
    # and SQLite conformance files in half the time of two). Each worker starts its own
    # servers, on first use. `-- -n 0` runs it in one process; LEASEKIT_TEST_WORKERS
    # sets the count.
    # --dist worksteal: each worker starts on its own contiguous share of the suite in
    # file order (so it starts only the servers of its share) and takes tests from the
    # end of another's queue when its own runs out, so no worker idles at the end behind
    # one that was handed the long etcd and process checks (docs/testing.md, Suite time).
    workers = os.environ.get("LEASEKIT_TEST_WORKERS") or str(2 * (os.cpu_count() or 1))
    install_and_run(
        session, TEST_EXTRAS, "pytest", "-n", workers, "--dist", "worksteal", *session.posargs
    )


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff: lint rules and formatting."""
    session.install("ruff==0.17.6")  # pinned: a new ruff release must not turn CI red by itself
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(python=PYTHON)
def types(session: nox.Session) -> None:
    """mypy --strict over leasekit, the backends and the conformance suite."""
    session.install(MYPY)
    install_and_run(session, TEST_EXTRAS, "mypy")


@nox.session(python=PYTHON)
def docs(session: nox.Session) -> None:
    """A strict mkdocs build of docs/."""
    session.install("mkdocs>=1.6")
    session.run("mkdocs", "build", "--strict", "--site-dir", session.create_tmp() + "/site")


@nox.session(python=PYTHON, tags=["redis"])
def bench(session: nox.Session) -> None:
    """leasekit vs redis-py and peer lock libraries on its own redis-server; not run by CI.

    ``nox -s bench -- --seconds 3 --rounds 3`` passes options on to ``leasekit bench``;
    a first argument with ``://`` (``redis://host:port``) benchmarks that server instead.
    """
    # The test extra: tests/servers.py, which starts the redis-server, imports pytest.
    install_and_run(
        session, "redis,bench,test", "python", "benchmarks/redis_bench.py", *session.posargs
    )
