"""The leasekit conformance suite, and the pytest plugin that runs it against a URL.

A backend proves it implements the lease contract with one test class::

    from leasekit_contract import LeaseProviderContract

    class TestMyBackend(LeaseProviderContract):
        @pytest.fixture
        async def provider(self):
            async with MyLeaseProvider(...) as p:
                yield p

This module is also a pytest plugin, loaded only on request (there is no ``pytest11``
entry point: it would add options to every pytest run in every environment)::

    pytest -p leasekit_contract --leasekit-url redis://localhost:6379/0

runs the whole suite, and nothing else, against the backend ``leasekit.connect(URL)``
opens, and again through the blocking driver on what ``leasekit.sync.connect(URL)``
opens. A bare ``memory://`` becomes a named ``memory://leasekit-check-...`` store so
the suite's reconnect checks can reach it.
"""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest

import leasekit
from leasekit.backend import redact_url

# The suite's helpers state expectations with assert; pytest rewrites them for readable
# failures only if told before they are imported.
pytest.register_assert_rewrite(
    *(
        f"{__name__}.{module}"
        for module in (
            "_base",
            "_batch",
            "_blocking",
            "_cancellation",
            "_concurrency",
            "_expiry",
            "_fair",
            "_fencing",
            "_history",
            "_input",
            "_lifecycle",
            "_model",
            "_notifications",
            "_routing",
            "_semantics",
            "_slots",
            "_suite",
            "_url_suite",
            "_workers",
        )
    )
)

from ._base import URL_KEY  # noqa: E402  (after the rewrite registration)
from ._batch import BATCHED_RENEWAL_CHECKS  # noqa: E402
from ._blocking import (  # noqa: E402
    BLOCKING_DRIVER_REASON,
    BLOCKING_DRIVER_SKIPS,
    BlockingLeaseProviderContract,
    BlockingProviderAsAsync,
    BlockingProviderFactory,
    blocking_provider_factory,
)
from ._cancellation import CANCEL_CHECKS, RELEASE_GRANT_CHECK  # noqa: E402
from ._fair import FAIR_WAITING_CHECKS  # noqa: E402
from ._notifications import WAKE_UP_CHECKS  # noqa: E402
from ._routing import GRANT_HINT_CHECKS, ROUTING_CHECKS  # noqa: E402
from ._slots import SLOT_CHECKS  # noqa: E402
from ._suite import LeaseProviderContract  # noqa: E402

__all__ = [
    "BATCHED_RENEWAL_CHECKS",
    "BLOCKING_DRIVER_REASON",
    "BLOCKING_DRIVER_SKIPS",
    "CANCEL_CHECKS",
    "FAIR_WAITING_CHECKS",
    "GRANT_HINT_CHECKS",
    "RELEASE_GRANT_CHECK",
    "ROUTING_CHECKS",
    "SLOT_CHECKS",
    "WAKE_UP_CHECKS",
    "BlockingLeaseProviderContract",
    "BlockingProviderAsAsync",
    "BlockingProviderFactory",
    "LeaseProviderContract",
    "blocking_provider_factory",
    "url_under_test",
]

_SUITE_PATH = str(Path(__file__).with_name("_url_suite.py"))


def url_under_test(config: pytest.Config) -> str | None:
    """The URL the plugin runs the suite against, or ``None`` without ``--leasekit-url``."""
    return config.stash.get(URL_KEY, None)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("leasekit", "leasekit conformance suite")
    group.addoption(
        "--leasekit-url",
        dest="leasekit_url",
        metavar="URL",
        default=None,
        help="run the leasekit conformance suite, and only it, against the backend "
        "that leasekit.connect(URL) opens",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config, args: list[str]) -> None:
    # Swap the suite in as the only path before pytest looks for conftest files, so
    # the project's own tests and conftests in the current directory stay out of it.
    namespace = early_config.known_args_namespace
    if getattr(namespace, "leasekit_url", None) is None:
        return
    if namespace.file_or_dir:
        raise pytest.UsageError(
            "--leasekit-url runs the conformance suite alone; drop the paths "
            f"{namespace.file_or_dir} (select tests with -k instead)"
        )
    args.append(_SUITE_PATH)
    namespace.file_or_dir = [_SUITE_PATH]


def pytest_configure(config: pytest.Config) -> None:
    url: str | None = config.getoption("leasekit_url")
    if url is None:
        return
    if url.lower() == "memory://":
        # A private memory store cannot be reached again; a named one can.
        url = f"memory://leasekit-check-{secrets.token_hex(6)}"
    try:
        # Fails fast on an unknown scheme or a missing extra; connect() does no I/O.
        leasekit.connect(url)
    except leasekit.LeaseError as exc:
        raise pytest.UsageError(f"--leasekit-url {redact_url(url)}: {exc}") from exc
    config.stash[URL_KEY] = url
    manager = config.pluginmanager
    if not manager.has_plugin("anyio") and not manager.is_blocked("anyio"):
        # Plugin autoloading was disabled; the suite cannot run without anyio's.
        manager.import_plugin("anyio.pytest_plugin")


def pytest_report_header(config: pytest.Config) -> str | None:
    url = url_under_test(config)
    if url is None:
        return None
    return f"leasekit conformance suite against {redact_url(url)}"
