"""The backend registry against real (fake) installed distributions (docs/backends.md).

Each test installs tiny distributions into a temporary directory on ``sys.path``:
a ``*.dist-info`` with ``METADATA`` and ``entry_points.txt``, plus the plugin's
module files. ``importlib.metadata`` finds them exactly as it finds a pip install.
Tests use fresh :class:`BackendRegistry` instances, or swap the one behind the public
functions, so the process-wide registry never caches a fake distribution.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import textwrap
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import leasekit
from leasekit import (
    BackendInfo,
    BackendLacksCapability,
    BackendUnavailable,
    Capabilities,
    InvalidLeaseArgument,
    LeaseError,
    LeasekitWarning,
    LeaseProviderClosed,
    MemoryLeaseProvider,
)
from leasekit._registry import BackendRegistry

# A complete, working backend: the memory provider behind a different scheme, which
# remembers what from_url was given.
WORKING_BACKEND = """
import leasekit

class FakeBackend(leasekit.MemoryLeaseProvider):
    @classmethod
    def from_url(cls, url, **options):
        provider = cls()
        provider.url = url
        provider.options = options
        return provider
"""


class WeakBackend(MemoryLeaseProvider):
    """A backend that declares no fencing and no atomic transfer."""

    capabilities = Capabilities(ttl_resolution_ms=1)

    @classmethod
    def from_url(cls, url: str, **options: Any) -> WeakBackend:
        return cls()


class UndeclaredBackend(MemoryLeaseProvider):
    """A backend that declares no capabilities at all: the defaults apply."""

    capabilities = None  # type: ignore[assignment]

    @classmethod
    def from_url(cls, url: str, **options: Any) -> UndeclaredBackend:
        return cls()


class FakeSite:
    """A site directory that fake distributions and plain modules are written into."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.prefix = f"fakeplugin_{uuid.uuid4().hex[:8]}"
        self.modules: list[str] = []

    def module(self, label: str, source: str) -> str:
        """Write an importable top-level module and return its (unique) name."""
        name = f"{self.prefix}_{label}"
        (self.root / f"{name}.py").write_text(textwrap.dedent(source), encoding="utf-8")
        self.modules.append(name)
        importlib.invalidate_caches()
        return name

    def distribution(self, name: str, entry_points: dict[str, str]) -> None:
        """Install distribution ``name`` declaring ``entry_points`` (scheme -> value)."""
        info = self.root / f"{name.replace('-', '_')}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n", encoding="utf-8"
        )
        lines = ["[leasekit.backends]"]
        lines += [f"{scheme} = {value}" for scheme, value in entry_points.items()]
        (info / "entry_points.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
        importlib.invalidate_caches()

    def imported(self, name: str) -> bool:
        return name in sys.modules


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeSite]:
    root = tmp_path / "site-packages"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    fake = FakeSite(root)
    yield fake
    for name in list(sys.modules):
        if name.startswith(fake.prefix):
            del sys.modules[name]
    # monkeypatch restores sys.path after this; forget the directory's contents now.
    importlib.invalidate_caches()


@pytest.fixture
def public_registry(monkeypatch: pytest.MonkeyPatch) -> BackendRegistry:
    """A fresh registry behind leasekit.connect/register/available_backends."""
    registry = BackendRegistry()
    monkeypatch.setattr(leasekit, "_registry", registry)
    return registry


@contextlib.contextmanager
def warnings_recorded() -> Iterator[list[warnings.WarningMessage]]:
    """Record every warning in the block, overriding ``filterwarnings = error``."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield caught


def _info(infos: list[BackendInfo], scheme: str) -> BackendInfo:
    matches = [i for i in infos if i.scheme == scheme]
    assert len(matches) == 1, infos
    return matches[0]


# -- discovery is lazy -------------------------------------------------------------


def test_listing_reads_metadata_and_imports_nothing(site: FakeSite) -> None:
    ok = site.module("ok", WORKING_BACKEND)
    broken = site.module("broken", "raise RuntimeError('must not be imported by listing')\n")
    site.distribution("fakedist", {"fakeok": f"{ok}:FakeBackend", "fakebroken": f"{broken}:X"})
    registry = BackendRegistry()

    infos = registry.available()

    assert _info(infos, "fakeok") == BackendInfo(
        scheme="fakeok", target=f"{ok}:FakeBackend", distribution="fakedist"
    )
    assert _info(infos, "fakebroken").loadable is None
    assert _info(infos, "memory").distribution == "leasekit"
    assert _info(infos, "noop").distribution == "leasekit"
    assert not site.imported(ok)
    assert not site.imported(broken)
    assert [i.scheme for i in infos] == sorted(i.scheme for i in infos)


def test_check_imports_and_reports_loadable(site: FakeSite) -> None:
    ok = site.module("ok", WORKING_BACKEND)
    site.distribution("fakedist", {"fakeok": f"{ok}:FakeBackend"})
    registry = BackendRegistry()

    infos = registry.available(check=True)

    assert _info(infos, "fakeok").loadable is True
    assert _info(infos, "fakeok").error is None
    assert _info(infos, "memory").loadable is True
    assert site.imported(ok)


@pytest.mark.anyio
async def test_entry_point_backend_connects_on_first_use(site: FakeSite) -> None:
    ok = site.module("ok", WORKING_BACKEND)
    site.distribution("fakedist", {"fakeok": f"{ok}:FakeBackend"})
    registry = BackendRegistry()
    assert not site.imported(ok)

    async with registry.connect("fakeok://somewhere/db", pool_size=3) as provider:
        assert site.imported(ok)
        assert type(provider).__module__ == ok
        assert provider.url == "fakeok://somewhere/db"  # type: ignore[attr-defined]
        assert provider.options == {"pool_size": 3}  # type: ignore[attr-defined]
        assert (await provider.acquire_lease("k", "a", 60_000)).acquired
    with pytest.raises(LeaseProviderClosed):
        await provider.get_lease_owner("k")
    assert registry.load("fakeok") is registry.load("FAKEOK")  # cached, case-insensitive


@pytest.mark.anyio
async def test_entry_point_with_extras_loads_when_the_extra_is_installed(site: FakeSite) -> None:
    ok = site.module("ok", WORKING_BACKEND)
    site.distribution("fakedist", {"fakeextra": f"{ok}:FakeBackend [extra1]"})
    registry = BackendRegistry()

    info = _info(registry.available(), "fakeextra")
    assert info.extras == ("extra1",)
    assert info.target == f"{ok}:FakeBackend"
    async with registry.connect("fakeextra://") as provider:
        assert (await provider.acquire_lease("k", "a", 60_000)).acquired
    assert _info(registry.available(check=True), "fakeextra").loadable is True


def test_entry_point_with_an_invalid_scheme_name_is_ignored_with_a_warning(
    site: FakeSite,
) -> None:
    ok = site.module("ok", WORKING_BACKEND)
    site.distribution("fakedist", {"bad_scheme": f"{ok}:FakeBackend"})
    registry = BackendRegistry()
    with pytest.warns(LeasekitWarning, match="'bad_scheme' from distribution 'fakedist'"):
        infos = registry.available()
    assert "bad_scheme" not in {i.scheme for i in infos}


# -- a missing optional dependency ---------------------------------------------------

NEEDS_MISSING = """
import {missing}

class FakeBackend:
    @classmethod
    def from_url(cls, url, **options):
        raise AssertionError("unreachable")
"""


@pytest.mark.parametrize(
    ("extras", "pip"),
    [
        ("[extra1]", "pip install 'fakedist[extra1]'"),
        ("[extra1,extra2]", "pip install 'fakedist[extra1,extra2]'"),
    ],
)
def test_missing_dependency_names_the_pip_command(site: FakeSite, extras: str, pip: str) -> None:
    missing = f"{site.prefix}_not_installed"
    mod = site.module("needy", NEEDS_MISSING.format(missing=missing))
    site.distribution("fakedist", {"fakemissing": f"{mod}:FakeBackend {extras}"})
    registry = BackendRegistry()

    with pytest.raises(BackendUnavailable) as info:
        registry.connect("fakemissing://")

    message = str(info.value)
    assert pip in message
    assert repr(missing) in message
    assert info.value.scheme == "fakemissing"
    assert isinstance(info.value.__cause__, ModuleNotFoundError)
    assert isinstance(info.value, LeaseError)


def test_missing_dependency_is_listed_not_loadable_without_a_warning(site: FakeSite) -> None:
    mod = site.module("needy", NEEDS_MISSING.format(missing=f"{site.prefix}_not_installed"))
    site.distribution("fakedist", {"fakemissing": f"{mod}:FakeBackend [extra1]"})
    registry = BackendRegistry()

    with warnings_recorded() as caught:
        info = _info(registry.available(check=True), "fakemissing")

    assert caught == []  # an uninstalled extra is normal, not a broken plugin
    assert info.loadable is False
    assert info.extras == ("extra1",)
    assert info.error is not None
    assert "pip install 'fakedist[extra1]'" in info.error


def test_missing_dependency_without_extras_names_the_distribution(site: FakeSite) -> None:
    mod = site.module("needy", NEEDS_MISSING.format(missing=f"{site.prefix}_not_installed"))
    site.distribution("fakedist", {"fakemissing": f"{mod}:FakeBackend"})
    with pytest.raises(BackendUnavailable, match="install the dependencies of 'fakedist'"):
        BackendRegistry().connect("fakemissing://")


def test_plugin_whose_own_module_is_gone_says_reinstall(site: FakeSite) -> None:
    site.distribution("fakedist", {"fakegone": f"{site.prefix}_gone:FakeBackend"})
    with pytest.raises(BackendUnavailable, match="reinstall the distribution") as info:
        BackendRegistry().connect("fakegone://")
    assert isinstance(info.value.__cause__, ModuleNotFoundError)


# -- a broken plugin is isolated -----------------------------------------------------


@pytest.mark.anyio
async def test_broken_plugin_is_skipped_with_one_warning_and_fails_only_when_asked(
    site: FakeSite,
) -> None:
    ok = site.module("ok", WORKING_BACKEND)
    broken = site.module("broken", "raise RuntimeError('plugin exploded at import')\n")
    site.distribution("fakedist", {"fakeok": f"{ok}:FakeBackend"})
    site.distribution("fakebrokendist", {"fakebroken": f"{broken}:FakeBackend"})
    registry = BackendRegistry()

    with pytest.warns(LeasekitWarning) as record:
        infos = registry.available(check=True)

    assert len(record) == 1
    warning = str(record[0].message)
    assert "'fakebroken'" in warning
    assert "plugin exploded at import" in warning
    broken_info = _info(infos, "fakebroken")
    assert broken_info.loadable is False
    assert broken_info.distribution == "fakebrokendist"
    assert broken_info.error is not None
    assert "RuntimeError: plugin exploded at import" in broken_info.error
    assert _info(infos, "fakeok").loadable is True
    assert _info(infos, "memory").loadable is True

    # Listing again does not warn again.
    with warnings_recorded() as caught:
        again = registry.available(check=True)
    assert caught == []
    assert _info(again, "fakebroken").loadable is False

    # Other schemes keep working; the broken one fails only when asked for.
    async with registry.connect("fakeok://") as provider:
        assert (await provider.acquire_lease("k", "a", 1_000)).acquired
    async with registry.connect("memory://") as provider:
        assert (await provider.acquire_lease("k", "a", 1_000)).acquired
    with pytest.raises(BackendUnavailable) as info:
        registry.connect("fakebroken://")
    assert isinstance(info.value.__cause__, RuntimeError)
    assert str(info.value.__cause__) == "plugin exploded at import"
    assert "fakebrokendist" in str(info.value)


@pytest.mark.parametrize(
    ("source", "cause"),
    [
        ("from leasekit import NameFromAFutureLeasekit\n", ImportError),
        ("def broken(:\n", SyntaxError),
        ("import leasekit\nleasekit.no_such_attribute\n", AttributeError),
    ],
    ids=["incompatible-import", "syntax-error", "attribute-error"],
)
def test_other_import_failures_also_count_as_broken(
    site: FakeSite, source: str, cause: type[BaseException]
) -> None:
    broken = site.module("broken", source)
    site.distribution("fakedist", {"fakebroken": f"{broken}:FakeBackend"})
    registry = BackendRegistry()
    with pytest.warns(LeasekitWarning, match="'fakebroken'"):
        info = _info(registry.available(check=True), "fakebroken")
    assert info.loadable is False
    with pytest.raises(BackendUnavailable) as raised:
        registry.connect("fakebroken://")
    assert type(raised.value.__cause__) is cause


def test_broken_plugin_fails_on_connect_without_listing_first(site: FakeSite) -> None:
    broken = site.module("broken", "raise RuntimeError('boom')\n")
    site.distribution("fakedist", {"fakebroken": f"{broken}:FakeBackend"})
    with warnings_recorded() as caught, pytest.raises(BackendUnavailable) as info:
        BackendRegistry().connect("fakebroken://")
    assert caught == []
    assert isinstance(info.value.__cause__, RuntimeError)


@pytest.mark.parametrize(
    ("source", "target_attr", "complaint"),
    [
        (WORKING_BACKEND, "NoSuchClass", "AttributeError"),
        ("FakeBackend = 42\n", "FakeBackend", "not a class with a from_url"),
        ("class FakeBackend:\n    pass\n", "FakeBackend", "not a class with a from_url"),
    ],
    ids=["attribute-missing", "not-a-class", "no-from-url"],
)
def test_entry_point_not_pointing_at_a_backend_class(
    site: FakeSite, source: str, target_attr: str, complaint: str
) -> None:
    mod = site.module("odd", source)
    site.distribution("fakedist", {"fakeodd": f"{mod}:{target_attr}"})
    with pytest.raises(BackendUnavailable, match=complaint):
        BackendRegistry().connect("fakeodd://")


# -- two distributions claiming one scheme ------------------------------------------


@pytest.mark.anyio
async def test_two_distributions_claiming_one_scheme_is_an_error_naming_both(
    site: FakeSite,
) -> None:
    one = site.module("one", WORKING_BACKEND)
    two = site.module("two", WORKING_BACKEND)
    site.distribution("fakedist-one", {"fakedup": f"{one}:FakeBackend"})
    site.distribution("fakedist-two", {"fakedup": f"{two}:FakeBackend"})
    registry = BackendRegistry()

    with pytest.raises(BackendUnavailable) as info:
        registry.connect("fakedup://")
    message = str(info.value)
    assert "'fakedist-one'" in message
    assert "'fakedist-two'" in message
    assert info.value.scheme == "fakedup"
    assert not site.imported(one)
    assert not site.imported(two)

    claims = [i for i in registry.available(check=True) if i.scheme == "fakedup"]
    assert {c.distribution for c in claims} == {"fakedist-one", "fakedist-two"}
    for claim in claims:
        assert claim.loadable is False
        assert claim.error is not None
        assert "fakedist-one" in claim.error
        assert "fakedist-two" in claim.error

    # register() settles the conflict.
    registry.register("fakedup", f"{two}:FakeBackend")
    async with registry.connect("fakedup://") as provider:
        assert type(provider).__module__ == two
    assert not site.imported(one)


def test_a_distribution_claiming_a_built_in_scheme_conflicts(site: FakeSite) -> None:
    ok = site.module("ok", WORKING_BACKEND)
    site.distribution("fakedist", {"memory": f"{ok}:FakeBackend"})
    with pytest.raises(BackendUnavailable, match=r"'leasekit'.*'fakedist'|'fakedist'.*'leasekit'"):
        BackendRegistry().connect("memory://")


# -- register() --------------------------------------------------------------------


@pytest.mark.anyio
async def test_register_module_string_is_lazy_and_works(site: FakeSite) -> None:
    mod = site.module("registered", WORKING_BACKEND)
    registry = BackendRegistry()
    registry.register("fakereg", f"{mod}:FakeBackend")
    info = _info(registry.available(), "fakereg")
    assert info == BackendInfo(scheme="fakereg", target=f"{mod}:FakeBackend", distribution=None)
    assert not site.imported(mod)

    async with registry.connect("fakereg://x") as provider:
        assert type(provider).__name__ == "FakeBackend"
        assert (await provider.acquire_lease("k", "a", 1_000)).acquired
    assert site.imported(mod)


@pytest.mark.anyio
async def test_register_class_and_override() -> None:
    registry = BackendRegistry()
    registry.register("fakereg", WeakBackend)
    async with registry.connect("fakereg://") as first:
        assert type(first) is WeakBackend
    assert _info(registry.available(), "fakereg").target == f"{__name__}:WeakBackend"

    # A second register() replaces the first, even after it was loaded and cached.
    registry.register("fakereg", UndeclaredBackend)
    async with registry.connect("fakereg://") as second:
        assert isinstance(second, UndeclaredBackend)


@pytest.mark.anyio
async def test_register_overrides_a_built_in_scheme() -> None:
    registry = BackendRegistry()
    async with registry.connect("memory://") as before:
        assert type(before) is MemoryLeaseProvider
    registry.register("MEMORY", WeakBackend)
    async with registry.connect("memory://") as after:
        assert type(after) is WeakBackend


@pytest.mark.parametrize(
    ("scheme", "target", "argument"),
    [
        ("", WeakBackend, "scheme"),
        ("1abc", WeakBackend, "scheme"),
        ("with space", WeakBackend, "scheme"),
        ("under_score", WeakBackend, "scheme"),
        (42, WeakBackend, "scheme"),
        ("fakereg", "no_colon_here", "target"),
        ("fakereg", "module:", "target"),
        ("fakereg", "mod:Class extra", "target"),
        ("fakereg", 42, "target"),
        ("fakereg", WeakBackend(), "target"),
    ],
)
def test_register_rejects_bad_arguments(scheme: Any, target: Any, argument: str) -> None:
    registry = BackendRegistry()
    with pytest.raises(InvalidLeaseArgument) as info:
        registry.register(scheme, target)
    assert info.value.argument == argument
    assert "fakereg" not in {i.scheme for i in registry.available()}


def test_registered_module_that_does_not_exist_fails_on_connect() -> None:
    registry = BackendRegistry()
    registry.register("fakereg", f"nonexistent_{uuid.uuid4().hex}:Backend")
    with pytest.raises(BackendUnavailable) as info:
        registry.connect("fakereg://")
    assert isinstance(info.value.__cause__, ModuleNotFoundError)


def test_backend_returning_a_non_provider_is_refused() -> None:
    class NotAProvider:
        @classmethod
        def from_url(cls, url: str, **options: Any) -> object:
            return object()

    registry = BackendRegistry()
    registry.register("fakereg", NotAProvider)
    with pytest.raises(BackendUnavailable, match="not a lease provider"):
        registry.connect("fakereg://")


def test_backend_without_lifecycle_is_refused() -> None:
    class Bare:
        async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> None: ...
        async def get_lease_owner(self, key: str) -> None: ...
        async def release_lease(self, key: str, owner: str) -> None: ...
        async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> None: ...
        async def transfer_lease(self, key: str, a: str, b: str, ttl_ms: int) -> None: ...

        @classmethod
        def from_url(cls, url: str, **options: Any) -> Bare:
            return cls()

    registry = BackendRegistry()
    registry.register("fakereg", Bare)
    with pytest.raises(BackendUnavailable, match="aclose"):
        registry.connect("fakereg://")


# -- unknown schemes and malformed input --------------------------------------------


def test_unknown_scheme_lists_the_known_ones() -> None:
    registry = BackendRegistry()
    registry.register("fakereg", WeakBackend)
    with pytest.raises(BackendUnavailable) as info:
        registry.connect("nosuchscheme://host")
    message = str(info.value)
    assert "'nosuchscheme'" in message
    known = message.split("known schemes: ", 1)[1].split(".", 1)[0].split(", ")
    assert {"fakereg", "memory", "noop"} <= set(known)
    assert known == sorted(known)
    assert "leasekit.register" in message
    assert info.value.scheme == "nosuchscheme"


@pytest.mark.parametrize(
    "url",
    [
        "memory",
        "",
        "://memory",
        "memory:/x",
        "1memory://",
        "mem ory://",
        "/tmp/leases.db",
        42,
        None,
    ],
)
def test_malformed_url_is_an_invalid_argument(url: Any) -> None:
    with pytest.raises(InvalidLeaseArgument) as info:
        BackendRegistry().connect(url)
    assert info.value.argument == "url"


@pytest.mark.parametrize(
    ("url", "options"),
    [
        ("redis:/user:s3cret@host", {}),  # one slash: refused by the registry itself
        ("user:s3cret@host", {}),
        ("://user:s3cret@host", {}),
        (" redis://user:s3cret@host", {}),
        ("nosuchscheme://user:s3cret@host", {}),
        ("memory://user:s3cret@host", {"require": ("persistent",)}),
        ("memory://user:s3cret@host", {"require": ("nonsense",)}),
    ],
)
def test_no_registry_error_shows_the_urls_password(url: str, options: dict[str, Any]) -> None:
    with pytest.raises(LeaseError) as info:
        BackendRegistry().connect(url, **options)
    error: BaseException | None = info.value
    while error is not None:  # the error and everything chained to it
        for shown in (str(error), repr(error), repr(vars(error))):
            assert "s3cret" not in shown
        error = error.__cause__ or error.__context__


@pytest.mark.parametrize(
    "require",
    [("nonsense",), ("fencing", "fast"), ("ttl_resolution_ms",), "Fencing", (None,)],
)
def test_bad_require_names_are_invalid_arguments(require: Any) -> None:
    with pytest.raises(InvalidLeaseArgument) as info:
        BackendRegistry().connect("memory://", require=require)
    assert info.value.argument == "require"
    assert "fencing" in str(info.value)  # the message lists what may be required


def test_bad_require_is_reported_before_importing_the_backend(site: FakeSite) -> None:
    mod = site.module("registered", WORKING_BACKEND)
    registry = BackendRegistry()
    registry.register("fakereg", f"{mod}:FakeBackend")
    with pytest.raises(InvalidLeaseArgument):
        registry.connect("fakereg://", require=("nonsense",))
    assert not site.imported(mod)


# -- require= ----------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize(
    "require", ["fencing", ("fencing",), ("fencing", "atomic_transfer", "server_clock"), [], ()]
)
async def test_memory_satisfies_its_declared_capabilities(require: Any) -> None:
    async with BackendRegistry().connect("memory://", require=require) as provider:
        assert (await provider.acquire_lease("k", "a", 1_000)).token is not None


def test_require_refuses_a_backend_lacking_the_capability() -> None:
    registry = BackendRegistry()
    registry.register("fakeweak", WeakBackend)
    registry.connect("fakeweak://", require=())  # usable when nothing is required
    with pytest.raises(BackendLacksCapability) as info:
        registry.connect("fakeweak://", require=("atomic_transfer", "fencing", "server_clock"))
    assert info.value.backend == "fakeweak"
    assert info.value.missing == ("atomic_transfer", "fencing", "server_clock")
    assert "fencing" in str(info.value)
    assert isinstance(info.value, LeaseError)


def test_require_on_memory_refuses_what_memory_lacks() -> None:
    with pytest.raises(BackendLacksCapability) as info:
        BackendRegistry().connect("memory://", require=("fencing", "persistent"))
    assert info.value.missing == ("persistent",)


def test_undeclared_capabilities_count_as_absent() -> None:
    registry = BackendRegistry()
    registry.register("fakebare", UndeclaredBackend)
    with pytest.raises(BackendLacksCapability) as info:
        registry.connect("fakebare://", require="fencing")
    assert info.value.missing == ("fencing",)


# -- the public functions ----------------------------------------------------------


@pytest.mark.anyio
async def test_public_connect_and_listing_with_the_real_registry() -> None:
    schemes = {i.scheme: i for i in leasekit.available_backends()}
    assert schemes["memory"].distribution == "leasekit"
    assert schemes["noop"].distribution == "leasekit"
    async with leasekit.connect("memory://", require=("fencing",)) as provider:
        assert (await provider.acquire_lease("k", "a", 1_000)).acquired


@pytest.mark.anyio
async def test_public_register_connect_and_available(public_registry: BackendRegistry) -> None:
    leasekit.register("fakepublic", WeakBackend)
    info = _info(leasekit.available_backends(check=True), "fakepublic")
    assert info.loadable is True
    assert info.distribution is None
    async with leasekit.connect("fakepublic://") as provider:
        assert type(provider) is WeakBackend
    with pytest.raises(BackendLacksCapability):
        leasekit.connect("fakepublic://", require="fencing")
    assert "fakepublic" in {i.scheme for i in public_registry.available()}


def test_public_register_string_target(public_registry: BackendRegistry) -> None:
    leasekit.register("fakepublic", "leasekit._memory:MemoryLeaseProvider")
    assert _info(leasekit.available_backends(), "fakepublic").target == (
        "leasekit._memory:MemoryLeaseProvider"
    )
    with pytest.raises(BackendUnavailable, match=r"known schemes: .*\bfakepublic\b"):
        leasekit.connect("elsewhere://")
