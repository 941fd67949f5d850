"""The conformance suite against ``memory://``, through the mixin and through the plugin.

Through both drivers: the async provider, and ``leasekit.sync.connect`` (the facade
running the async provider on its loop thread: memory has no native blocking provider).
``memory://`` is not shared across processes, so the suite's two multi-process checks
skip here; ``test_contract_sqlite.py`` runs them.
"""

from __future__ import annotations

import asyncio
import functools
import os
import subprocess
import sys
import threading
import uuid
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from leasekit_contract import (
    BATCHED_RENEWAL_CHECKS,
    BLOCKING_DRIVER_REASON,
    BLOCKING_DRIVER_SKIPS,
    BlockingLeaseProviderContract,
    BlockingProviderAsAsync,
    LeaseProviderContract,
)

import leasekit
import leasekit.sync
from leasekit import LeaseProvider
from leasekit.testing import FakeClock

# -- memory:// through the mixin -------------------------------------------------------


class TestMemoryBackend(LeaseProviderContract):
    @pytest.fixture
    def memory_url(self) -> str:
        return f"memory://contract-{uuid.uuid4().hex}"

    @pytest.fixture
    async def provider(self, memory_url: str) -> AsyncIterator[LeaseProvider]:
        async with leasekit.connect(memory_url) as provider:
            yield provider

    @pytest.fixture
    def provider_factory(self, memory_url: str) -> Callable[[], LeaseProvider]:
        return functools.partial(leasekit.connect, memory_url)


class TestMemoryBackendBlocking(BlockingLeaseProviderContract):
    @pytest.fixture
    def blocking_factory(self) -> Callable[[], leasekit.sync.SyncLeaseProvider]:
        return functools.partial(leasekit.sync.connect, f"memory://contract-{uuid.uuid4().hex}")


class TestMemoryOnATickingFakeClock(LeaseProviderContract):
    """The memory store on a ``leasekit.testing.FakeClock``: the suite waits in real time,
    so the clock ticks with it (and a test may still jump it forward with advance())."""

    @pytest.fixture
    async def provider(self) -> AsyncIterator[LeaseProvider]:
        async with leasekit.connect("memory://", clock=FakeClock(ticking=True)) as provider:
            yield provider


# -- memory:// through the plugin ------------------------------------------------------


def suite_size(only: str | None = None) -> int:
    """How many tests ``LeaseProviderContract`` holds (or its check ``only`` has),
    parametrizations included."""
    size = 0
    for name in dir(LeaseProviderContract):
        if name.startswith("test_") and only in (None, name):
            count = 1
            for mark in getattr(getattr(LeaseProviderContract, name), "pytestmark", []):
                if mark.name == "parametrize":
                    count *= len(mark.args[1])
            size += count
    return size


@pytest.mark.slow  # the whole suite, in a child pytest
def test_plugin_runs_only_the_suite_against_a_url(tmp_path: Path) -> None:
    # A project of its own, whose tests and conftests the plugin must keep out of the
    # run (either conftest fails the run if loaded); its settings still apply.
    project = tmp_path / "project"
    (project / "tests").mkdir(parents=True)
    (project / "pyproject.toml").write_text(
        '[tool.pytest.ini_options]\ntestpaths = ["tests"]\nfilterwarnings = ["error"]\n'
    )
    for conftest in (project / "conftest.py", project / "tests" / "conftest.py"):
        conftest.write_text(f"raise RuntimeError('the plugin loaded {conftest}')\n")
    (project / "tests" / "test_unrelated.py").write_text("def test_unrelated():\n    pass\n")
    report = tmp_path / "report.xml"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "leasekit_contract",
            "--leasekit-url",
            "memory://",
            "-p",
            "no:cacheprovider",
            f"--junitxml={report}",
            "-q",
        ],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    output = completed.stdout + completed.stderr
    assert completed.returncode == 0, output
    suite = ET.parse(report).getroot().find("testsuite")
    assert suite is not None, output
    counts = {
        name: int(suite.get(name, "0")) for name in ["tests", "failures", "errors", "skipped"]
    }
    by_class: dict[str, list[ET.Element]] = {}
    for case in suite.iter("testcase"):
        by_class.setdefault(case.get("classname", "").rpartition(".")[2], []).append(case)
    assert set(by_class) == {"TestLeaseProviderAtURL", "TestLeaseProviderAtURLBlocking"}, output
    # Through the async driver, the three multi-process checks skip (memory:// is not
    # shared across processes; the third is the slots'), and so does the lost-channel
    # check, which needs a fixture a URL cannot give.
    assert len(by_class["TestLeaseProviderAtURL"]) == suite_size()
    assert skips_of(by_class["TestLeaseProviderAtURL"]) == {
        "the backend declares shared_across_processes=False": 3,
        "override the 'break_notifications' fixture to run this check": 1,
    }
    # Through the blocking driver (leasekit.sync's facade over memory://): the suite and
    # the blocking provider's two lifecycle checks; the same three multi-process checks,
    # the checks that cannot apply to a blocking call, and the extras the facade does not
    # offer (renew_leases, release_grant) skip.
    assert len(by_class["TestLeaseProviderAtURLBlocking"]) == suite_size() + 2
    assert skips_of(by_class["TestLeaseProviderAtURLBlocking"]) == {
        "the backend declares shared_across_processes=False": 3,
        BLOCKING_DRIVER_REASON: sum(suite_size(name) for name in BLOCKING_DRIVER_SKIPS),
        "the backend has no renew_leases (leasekit.backend.SupportsRenewMany)": sum(
            suite_size(name) for name in BATCHED_RENEWAL_CHECKS
        ),
        "the backend does not offer release_grant (SupportsReleaseGrant)": 1,
    }
    assert counts["tests"] == 2 * suite_size() + 2, output
    assert counts["failures"] == counts["errors"] == 0, output


def skips_of(cases: list[ET.Element]) -> dict[str, int]:
    """How many of ``cases`` skipped, by reason."""
    return dict(Counter(skip.get("message", "") for case in cases for skip in case.iter("skipped")))


# -- the suite on a store that stalls: a slow machine must not fail a correct backend -----


class StallingProvider:
    """A correct provider (``memory://``) whose every call first stalls for ``stall_s``:
    longer than the suite's short TTL, as on a loaded machine or a store paused by GC."""

    def __init__(self, inner: leasekit.MemoryLeaseProvider, stall_s: float) -> None:
        self.inner = inner
        self.stall_s = stall_s
        self.capabilities = inner.capabilities

    async def _stalled(self, name: str, *args: object) -> Any:
        await asyncio.sleep(self.stall_s)
        return await getattr(self.inner, name)(*args)

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> leasekit.LeaseResult:
        return await self._stalled("acquire_lease", key, owner, ttl_ms)

    async def get_lease_owner(self, key: str) -> str | None:
        return await self._stalled("get_lease_owner", key)

    async def release_lease(self, key: str, owner: str) -> None:
        await self._stalled("release_lease", key, owner)

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        return await self._stalled("renew_lease", key, owner, ttl_ms)

    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        return await self._stalled("transfer_lease", key, from_owner, to_owner, ttl_ms)


NEEDS_THE_SHORT_LEASE_LIVE = [
    "test_denied_acquire_leaves_holders_ttl_alone",
    "test_renew_by_holder_resets_ttl_to_the_new_value",
    "test_renew_by_non_owner_returns_false_and_changes_nothing",
    "test_transfer_by_holder_sets_fresh_ttl_for_new_owner",
    "test_transfer_to_same_owner_behaves_like_renew",
]


@pytest.mark.anyio
@pytest.mark.parametrize("check", NEEDS_THE_SHORT_LEASE_LIVE)
async def test_checks_that_need_a_short_lease_live_pass_on_a_stalling_store(check: str) -> None:
    # Every call stalls 150 ms, more than the 100 ms short TTL: the first try cannot
    # tell, the next one (a 400 ms TTL) can, and the check passes instead of failing.
    async with leasekit.connect(f"memory://stall-{uuid.uuid4().hex}") as memory:
        assert isinstance(memory, leasekit.MemoryLeaseProvider)
        stalling = StallingProvider(memory, stall_s=0.15)
        await getattr(LeaseProviderContract(), check)(stalling)


# -- the blocking driver's adapter ---------------------------------------------------------


class BarrierBlockingProvider:
    """``leasekit.sync``'s facade over ``memory://`` whose reads first meet at a barrier:
    they only return if ``parties`` of them run at the same time, in different threads."""

    def __init__(self, inner: leasekit.sync.SyncLeaseProvider, parties: int) -> None:
        self.inner = inner
        self.barrier = threading.Barrier(parties, timeout=30)
        self.threads: set[int] = set()
        self.capabilities = inner.capabilities

    def get_lease_owner(self, key: str) -> str | None:
        self.threads.add(threading.get_ident())
        self.barrier.wait()
        return self.inner.get_lease_owner(key)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@pytest.mark.anyio
async def test_the_blocking_adapter_runs_concurrent_calls_in_threads_at_once() -> None:
    # The concurrency checks race tasks; through the blocking driver those must be
    # blocking calls running at the same time, or the checks would prove nothing.
    parties = 16
    blocking = BarrierBlockingProvider(leasekit.sync.connect("memory://"), parties)
    async with BlockingProviderAsAsync(blocking) as provider:  # type: ignore[arg-type]
        owners = await asyncio.gather(*(provider.get_lease_owner(f"k{i}") for i in range(parties)))
        assert owners == [None] * parties
        assert len(blocking.threads) == parties
        assert provider.capabilities == blocking.capabilities
        assert repr(blocking) in repr(provider)  # the adapter names what it drives
    assert blocking.inner.closed
