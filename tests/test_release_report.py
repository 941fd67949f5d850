"""``release_if_held`` (``SupportsReleaseReport``) on every backend, and ``leasekit release``.

The contract's ``release_lease`` returns nothing; ``release_if_held`` is the same one
atomic step and says what it found, which is how ``leasekit release --json`` reports
``released`` without a racy read before or after.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from test_sync import backend_url

import leasekit
from leasekit._cli import main
from leasekit._registry import BackendRegistry
from leasekit.backend import SupportsReleaseReport, supports

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["memory", "sqlite", "redis", "postgres", "mysql", "etcd"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return backend_url(request.param, request, tmp_path)


async def test_release_if_held_says_whether_the_owner_held_the_key(url: str) -> None:
    async with leasekit.connect(url) as leases:
        assert supports(leases, SupportsReleaseReport)
        report: Any = leases
        assert await report.release_if_held("k", "a") is False  # free
        assert (await leases.acquire_lease("k", "a", 60_000)).acquired
        assert await report.release_if_held("k", "b") is False  # someone else's
        assert await leases.get_lease_owner("k") == "a"  # untouched
        assert await report.release_if_held("k", "a") is True
        assert await leases.get_lease_owner("k") is None
        assert await report.release_if_held("k", "a") is False  # released already
        # Expired, by the store's clock: nothing left to release.
        ttl_ms = leasekit.capabilities_of(leases).min_ttl_ms
        assert (await leases.acquire_lease("k", "a", max(ttl_ms, 50))).acquired
        while await leases.get_lease_owner("k") is not None:  # noqa: ASYNC110 (the store decides)
            await asyncio.sleep(0.02)
        assert await report.release_if_held("k", "a") is False
        with pytest.raises(leasekit.InvalidLeaseArgument, match="key"):
            await report.release_if_held("", "a")


def release_json(url: str, owner: str, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert main(["release", url, "job", owner, "--json"]) == 0
    payload: dict[str, Any] = json.loads(capsys.readouterr().out)
    return payload


def test_cli_release_json_says_whether_it_released(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    assert main(["acquire", url, "job", "alice", "--ttl-ms", "60000"]) == 0
    capsys.readouterr()
    assert release_json(url, "bob", capsys) == {"key": "job", "released": False}
    assert main(["owner", url, "job"]) == 0
    assert capsys.readouterr().out == "alice\n"
    assert release_json(url, "alice", capsys) == {"key": "job", "released": True}
    assert release_json(url, "alice", capsys) == {"key": "job", "released": False}
    assert main(["release", url, "job", "alice"]) == 0
    assert capsys.readouterr().out == "not released: alice did not hold it\n"


def test_cli_release_on_a_backend_that_cannot_tell_says_so(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A third-party backend with the contract alone: released is unknown, not True.
    registry = BackendRegistry()
    registry.register("contractonly", ContractOnly)
    monkeypatch.setattr(leasekit, "_registry", registry)
    assert main(["release", "contractonly://", "job", "alice", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"key": "job", "released": None}


class ContractOnly:
    """The five contract methods over a dict, and nothing more."""

    def __init__(self) -> None:
        self.owners: dict[str, str] = {}

    @classmethod
    def from_url(cls, url: str, **options: object) -> ContractOnly:
        return cls()

    async def __aenter__(self) -> ContractOnly:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        return None

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> leasekit.LeaseResult:
        holder = self.owners.setdefault(key, owner)
        return leasekit.LeaseResult(holder == owner, holder)

    async def get_lease_owner(self, key: str) -> str | None:
        return self.owners.get(key)

    async def release_lease(self, key: str, owner: str) -> None:
        if self.owners.get(key) == owner:
            del self.owners[key]

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        return self.owners.get(key) == owner

    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool:
        if self.owners.get(key) != from_owner:
            return False
        self.owners[key] = to_owner
        return True
