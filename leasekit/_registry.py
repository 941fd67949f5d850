"""Finding backends by URL scheme: entry points, run-time registrations, built-ins.

Backends are discovered from the ``leasekit.backends`` entry-point group, whose
names are URL schemes and whose values are ``"module:Class"``. Listing reads only
metadata. A backend's module is imported the first time its scheme is asked for and
the class is cached: importing leasekit must stay cheap and must never pull in
redis, psycopg or grpc for a program that uses none of them (the same reason anyio
loads its event-loop backends lazily).
"""

from __future__ import annotations

import importlib
import re
import threading
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import metadata
from typing import Any, cast

from . import _hooks
from ._capabilities import Capabilities, capabilities_of
from ._contract import ManagedLeaseProvider
from ._detection import is_lease_provider
from ._errors import (
    BackendLacksCapability,
    BackendUnavailable,
    InvalidLeaseArgument,
    LeasekitWarning,
)
from .backend._urls import redact_url

__all__ = ["ENTRY_POINT_GROUP", "BackendInfo", "BackendRegistry"]

ENTRY_POINT_GROUP = "leasekit.backends"

_SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*$")
_URL_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")

# Built into leasekit itself, so they work even from a source tree with no metadata.
_BUILTINS = {
    "memory": "leasekit._memory:MemoryLeaseProvider",
    "noop": "leasekit._detection:NoopLeaseProvider",
}
_SELF = "leasekit"


@dataclass(frozen=True, slots=True)
class BackendInfo:
    """One backend as the registry sees it; listing never imports the backend.

    ``distribution`` is the installed distribution that declares it (``"leasekit"``
    for the built-ins, ``None`` for a :func:`leasekit.register` call). ``extras`` are
    the extras its entry point says it needs. ``loadable`` is ``None`` until checked,
    then whether importing it worked; ``error`` says why not. ``capabilities`` is what
    the loaded class declares (``None`` until checked, or if it declares them only per
    instance). ``url_forms`` are the URL shapes beyond the plain one that the class
    names in its ``url_forms`` attribute (a multi-host URL, say), once checked.
    """

    scheme: str
    target: str
    distribution: str | None
    extras: tuple[str, ...] = ()
    loadable: bool | None = None
    error: str | None = None
    capabilities: Capabilities | None = None
    url_forms: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class _Entry:
    scheme: str
    target: str | type
    distribution: str | None
    extras: tuple[str, ...] = ()

    @property
    def target_name(self) -> str:
        if isinstance(self.target, str):
            return self.target
        return f"{self.target.__module__}:{self.target.__qualname__}"

    def describe(self) -> str:
        source = f"distribution {self.distribution!r}" if self.distribution else "register()"
        return f"{self.target_name} from {source}"


def normalize_scheme(scheme: object) -> str:
    if not isinstance(scheme, str) or not _SCHEME.match(scheme.lower()):
        raise InvalidLeaseArgument.for_argument(
            "scheme",
            f"must be a URL scheme like 'redis' (a letter, then letters, digits, '+-.'), "
            f"got {scheme!r}",
        )
    return scheme.lower()


def scheme_of(url: object) -> str:
    if not isinstance(url, str):
        raise InvalidLeaseArgument.for_argument("url", f"must be a str, got {type(url).__name__}")
    match = _URL_SCHEME.match(url)
    if match is None:
        raise InvalidLeaseArgument.for_argument(
            "url", f"must start with a scheme such as 'memory://', got {redact_url(url)!r}"
        )
    return match.group(1).lower()


def _import_target(target: str) -> object:
    module_name, _, attr_path = target.partition(":")
    obj: object = importlib.import_module(module_name.strip())
    for attr in filter(None, attr_path.strip().split(".")):
        obj = getattr(obj, attr)
    return obj


def import_plugin(
    target: str,
    *,
    subject: str,
    described: str,
    scheme: str,
    distribution: str | None,
    extras: tuple[str, ...] = (),
) -> object:
    """Import an entry point's ``module:attr``; any failure is a BackendUnavailable.

    ``subject`` names what is imported in messages ("backend 'redis'"), ``described``
    where it comes from. A missing module is told apart: the plugin's own (a broken
    install) or one of its dependencies, with the ``pip install`` that adds it.
    """
    module = target.partition(":")[0].strip()
    try:
        return _import_target(target)
    except BackendUnavailable:
        raise  # the plugin already said what is missing and how to fix it
    except ModuleNotFoundError as exc:
        missing = exc.name or "?"
        if module == missing or module.startswith(missing + "."):
            raise BackendUnavailable(
                f"{subject} ({described}) is broken: its module {missing!r} is not "
                "installed; reinstall the distribution",
                scheme=scheme,
            ) from exc
        if distribution and extras:
            fix = f"pip install '{distribution}[{','.join(extras)}]'"
        elif distribution:
            fix = f"install the dependencies of {distribution!r}"
        else:
            fix = f"install the package that provides {missing!r}"
        raise BackendUnavailable(
            f"{subject} ({described}) needs {missing!r}, which is not installed: {fix}",
            scheme=scheme,
        ) from exc
    except Exception as exc:
        raise BackendUnavailable(
            f"{subject} ({described}) failed to import: {type(exc).__name__}: {exc}",
            scheme=scheme,
        ) from exc


class BackendRegistry:
    """Maps URL schemes to backend classes. ``leasekit.connect`` uses one shared instance."""

    def __init__(self, group: str = ENTRY_POINT_GROUP) -> None:
        self._group = group
        self._lock = threading.RLock()
        self._discovered: dict[str, list[_Entry]] | None = None
        self._registered: dict[str, _Entry] = {}
        self._loaded: dict[str, type] = {}
        self._warned: set[str] = set()

    # -- discovery: metadata only ------------------------------------------------

    def _entries(self) -> dict[str, list[_Entry]]:
        with self._lock:
            if self._discovered is None:
                found: dict[str, list[_Entry]] = {
                    scheme: [_Entry(scheme, target, _SELF)] for scheme, target in _BUILTINS.items()
                }
                for ep in metadata.entry_points(group=self._group):
                    dist = ep.dist.name if ep.dist is not None else None
                    try:
                        scheme = normalize_scheme(ep.name)
                    except InvalidLeaseArgument:
                        warnings.warn(
                            f"ignoring leasekit backend entry point {ep.name!r} from "
                            f"distribution {dist!r}: not a valid URL scheme",
                            LeasekitWarning,
                            stacklevel=3,
                        )
                        continue
                    # ep.value keeps a trailing " [extra1]"; the import target must not.
                    target = f"{ep.module}:{ep.attr}" if ep.attr else ep.module
                    entry = _Entry(scheme, target, dist, tuple(ep.extras))
                    claims = found.setdefault(scheme, [])
                    # The same distribution seen twice (say, an editable install
                    # shadowing a wheel) is one claim, not a conflict.
                    if all(c.distribution != dist for c in claims):
                        claims.append(entry)
                    elif dist == _SELF:
                        claims[:] = [c for c in claims if c.distribution != dist] + [entry]
                self._discovered = found
            return self._discovered

    def _candidates(self) -> dict[str, list[_Entry]]:
        merged = dict(self._entries())
        for scheme, entry in self._registered.items():
            merged[scheme] = [entry]
        return merged

    def register(self, scheme: str, target: str | type) -> None:
        """Serve ``scheme`` with ``target`` (``"module:Class"`` or a class) from now on.

        Takes precedence over entry points and built-ins, which also settles a scheme
        that two distributions claim. Nothing is imported until the scheme is used.
        """
        scheme = normalize_scheme(scheme)
        if isinstance(target, str):
            if not re.match(r"^[\w.]+:[\w.]+$", target.strip()):
                raise InvalidLeaseArgument.for_argument(
                    "target", f"must look like 'package.module:ClassName', got {target!r}"
                )
        elif not isinstance(target, type):
            raise InvalidLeaseArgument.for_argument(
                "target", f"must be a 'module:Class' string or a class, got {target!r}"
            )
        with self._lock:
            self._registered[scheme] = _Entry(scheme, target, None)
            self._loaded.pop(scheme, None)

    # -- loading: imports, on demand ---------------------------------------------

    def _unknown(self, scheme: str) -> BackendUnavailable:
        known = ", ".join(sorted(self._candidates())) or "none"
        return BackendUnavailable(
            f"no leasekit backend for scheme {scheme!r}; known schemes: {known}. "
            "Install the plugin that provides it, or call leasekit.register()",
            scheme=scheme,
        )

    def load(self, scheme: str) -> type:
        """Return the backend class for ``scheme``, importing it on first use."""
        scheme = normalize_scheme(scheme)
        with self._lock:
            cached = self._loaded.get(scheme)
            if cached is not None:
                return cached
            claims = self._candidates().get(scheme)
            if not claims:
                raise self._unknown(scheme)
            if len(claims) > 1:
                names = " and ".join(c.describe() for c in claims)
                raise BackendUnavailable(
                    f"scheme {scheme!r} is claimed by two backends: {names}. Uninstall "
                    "one, or pick one with leasekit.register(scheme, 'module:Class')",
                    scheme=scheme,
                )
            cls = self._import(claims[0])
            self._loaded[scheme] = cls
            return cls

    def _import(self, entry: _Entry) -> type:
        if isinstance(entry.target, type):
            obj: object = entry.target
        else:
            obj = import_plugin(
                entry.target,
                subject=f"backend {entry.scheme!r}",
                described=entry.describe(),
                scheme=entry.scheme,
                distribution=entry.distribution,
                extras=entry.extras,
            )
        if not isinstance(obj, type) or not callable(getattr(obj, "from_url", None)):
            raise BackendUnavailable(
                f"backend {entry.scheme!r} ({entry.describe()}) is not a class with a "
                "from_url(url, **options) classmethod",
                scheme=entry.scheme,
            )
        return obj

    # -- public operations ---------------------------------------------------------

    def available(self, *, check: bool = False) -> list[BackendInfo]:
        """List every known scheme; with ``check=True`` also try to import each one.

        A backend that fails to import for any reason but a missing optional
        dependency is reported with one :class:`LeasekitWarning` and listed as not
        loadable; other schemes are unaffected.
        """
        infos: list[BackendInfo] = []
        for scheme, claims in sorted(self._candidates().items()):
            for entry in claims:
                loadable: bool | None = None
                error: str | None = None
                capabilities: Capabilities | None = None
                url_forms: tuple[str, ...] = ()
                if len(claims) > 1:
                    loadable = False
                    error = "scheme claimed by " + " and ".join(
                        repr(c.distribution) for c in claims
                    )
                elif check:
                    try:
                        cls = self.load(scheme)
                    except BackendUnavailable as exc:
                        loadable, error = False, str(exc)
                        cause = exc.__cause__
                        # A missing module is an extra not installed, which is normal;
                        # any other failure (ImportError of a name included) is a bug.
                        if cause is not None and not isinstance(cause, ModuleNotFoundError):
                            self._warn_once(scheme, str(exc))
                    else:
                        loadable = True
                        declared = getattr(cls, "capabilities", None)
                        if isinstance(declared, Capabilities):
                            capabilities = declared
                        forms = getattr(cls, "url_forms", ())
                        if isinstance(forms, tuple):
                            url_forms = tuple(str(form) for form in forms)
                infos.append(
                    BackendInfo(
                        scheme=scheme,
                        target=entry.target_name,
                        distribution=entry.distribution,
                        extras=entry.extras,
                        loadable=loadable,
                        error=error,
                        capabilities=capabilities,
                        url_forms=url_forms,
                    )
                )
        return infos

    def _warn_once(self, scheme: str, message: str) -> None:
        with self._lock:
            if scheme in self._warned:
                return
            self._warned.add(scheme)
        warnings.warn(f"skipping backend: {message}", LeasekitWarning, stacklevel=4)

    def connect(
        self, url: str, *, require: Iterable[str] | str = (), **options: Any
    ) -> ManagedLeaseProvider:
        """Build the provider for ``url``; see :func:`leasekit.connect`."""
        scheme = scheme_of(url)
        wanted = _validate_require(require)
        cls = self.load(scheme)
        provider: object = cls.from_url(url, **options)  # type: ignore[attr-defined]
        lifecycle = ("aclose", "__aenter__", "__aexit__")
        if not is_lease_provider(provider) or not all(
            callable(getattr(provider, name, None)) for name in lifecycle
        ):
            raise BackendUnavailable(
                f"backend {scheme!r} returned {type(provider).__name__}, which is not "
                f"a lease provider with aclose() and async with support",
                scheme=scheme,
            )
        caps = capabilities_of(provider)
        missing = tuple(name for name in wanted if not getattr(caps, name))
        if missing:
            # from_url does no I/O, so there is nothing to close yet.
            raise BackendLacksCapability(backend=scheme, missing=missing)
        # The backend's provider itself unless an event plugin is registered: no
        # plugin, no per-operation cost.
        return _hooks.wrap(cast("ManagedLeaseProvider", provider), scheme)


def _validate_require(require: Iterable[str] | str) -> tuple[str, ...]:
    if isinstance(require, str):
        names: tuple[object, ...] = (require,)
    else:
        try:
            names = tuple(require)
        except TypeError:
            raise InvalidLeaseArgument.for_argument(
                "require", f"must be capability names, got {require!r}"
            ) from None
    flags = Capabilities.flag_names()
    checked: list[str] = []
    for name in names:
        if not isinstance(name, str) or name not in flags:
            raise InvalidLeaseArgument.for_argument(
                "require", f"unknown capability {name!r}; choose from {', '.join(flags)}"
            )
        checked.append(name)
    return tuple(checked)
