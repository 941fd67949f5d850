"""Finding a URL scheme's floor and peers: the ``leasekit.bench`` entry-point group.

Each backend distribution declares, per URL scheme, where its
:class:`~leasekit.bench.SchemeBench` lives::

    [project.entry-points."leasekit.bench"]
    redis = "leasekit_redis._bench:BENCH [redis]"

Listing reads metadata only; the module is imported when a URL of that scheme is
benchmarked, and no other scheme's is, so the drivers and peer libraries that one
backend's benchmark needs never load for another's (the same lazy rule as the
``leasekit.backends`` group). A scheme that no distribution claims (``memory://``)
benchmarks leasekit alone. :func:`register_scheme` serves a scheme from code
instead, ahead of any entry point.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import metadata

from .._errors import BackendUnavailable
from .._registry import import_plugin, normalize_scheme
from ._model import SchemeBench

__all__ = ["ENTRY_POINT_GROUP", "register_scheme", "scheme_bench"]

ENTRY_POINT_GROUP = "leasekit.bench"

# register_scheme's: scheme -> a SchemeBench, or the "module:attribute" of one.
_REGISTERED: dict[str, str | SchemeBench] = {}


@dataclass(frozen=True, slots=True)
class _Claim:
    target: str
    distribution: str | None
    extras: tuple[str, ...] = ()

    def describe(self) -> str:
        source = f"distribution {self.distribution!r}" if self.distribution else "register_scheme()"
        return f"{self.target} from {source}"


def register_scheme(scheme: str, bench: str | SchemeBench) -> None:
    """Benchmark URLs of ``scheme`` with ``bench`` (a :class:`SchemeBench` or its path).

    Wins over the ``leasekit.bench`` entry points; a path (``"package.module:BENCH"``)
    is imported only when that scheme is benchmarked.
    """
    _REGISTERED[normalize_scheme(scheme)] = bench


def _claims(scheme: str) -> list[_Claim]:
    """The entry points that claim ``scheme``, one per distribution; metadata only."""
    claims: list[_Claim] = []
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name.lower() != scheme:
            continue
        dist = ep.dist.name if ep.dist is not None else None
        # ep.value may end in " [extra]"; the import target must not.
        target = f"{ep.module}:{ep.attr}" if ep.attr else ep.module
        # One distribution seen twice (an editable install beside a wheel) is one claim.
        if all(claim.distribution != dist for claim in claims):
            claims.append(_Claim(target, dist, tuple(ep.extras)))
    return claims


def scheme_bench(scheme: str) -> SchemeBench:
    """The :class:`SchemeBench` for ``scheme``, imported now; empty if none is declared.

    Raises :class:`~leasekit.BackendUnavailable` when two distributions claim the
    scheme, or when its module does not import (naming the missing package and the
    ``pip install`` that adds it) or holds no :class:`SchemeBench`.
    """
    scheme = normalize_scheme(scheme)
    registered = _REGISTERED.get(scheme)
    if isinstance(registered, SchemeBench):
        return registered
    if registered is not None:
        claim = _Claim(registered, None)
    else:
        claims = _claims(scheme)
        if not claims:
            return SchemeBench()
        if len(claims) > 1:
            names = " and ".join(claim.describe() for claim in claims)
            raise BackendUnavailable(
                f"the benchmark of scheme {scheme!r} is claimed twice: {names}; uninstall "
                "one, or pick one with leasekit.bench.register_scheme()",
                scheme=scheme,
            )
        claim = claims[0]
    return _load(scheme, claim)


def _load(scheme: str, claim: _Claim) -> SchemeBench:
    bench = import_plugin(
        claim.target,
        subject=f"the benchmark of scheme {scheme!r}",
        described=claim.describe(),
        scheme=scheme,
        distribution=claim.distribution,
        extras=claim.extras,
    )
    if not isinstance(bench, SchemeBench):
        raise BackendUnavailable(
            f"the benchmark of scheme {scheme!r} ({claim.describe()}) is not a "
            f"leasekit.bench.SchemeBench but {type(bench).__name__}",
            scheme=scheme,
        )
    return bench
