"""The third-party path, end to end: a plugin passes the suite, broken backends fail it.

``examples/third_party_backend`` is a separate distribution (``leasekit-dictstore``)
built the way an outside author would build one. It must pass the conformance suite
through the mixin class (its own ``tests/``) and through the pytest plugin with
``--leasekit-url dictstore://...``, resolved by its real ``leasekit.backends`` entry
point after a real ``pip install``. Every backend in ``examples/broken_backends`` is
that example with one mistake; the suite must fail each one in the tests that guard
what it breaks.

Each suite run is a pytest subprocess, so the suite sees a fresh interpreter exactly
as an author's run would; outcomes are read from its JUnit XML report.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import uuid
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from leasekit_contract import (
    BATCHED_RENEWAL_CHECKS,
    BLOCKING_DRIVER_SKIPS,
    FAIR_WAITING_CHECKS,
    RELEASE_GRANT_CHECK,
    ROUTING_CHECKS,
    SLOT_CHECKS,
    WAKE_UP_CHECKS,
)

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "third_party_backend"
BROKEN = ROOT / "examples" / "broken_backends"
BROKEN_RUNNER = BROKEN / "contract_against_broken.py"

RUN_TIMEOUT_S = 600

# Run in every broken backend's class alongside its expected failures: they must pass,
# which shows the class was set up correctly and fails only where it is broken.
CONTROLS = (
    "test_provider_is_detected_and_declares_capabilities",
    "test_get_lease_owner_of_unused_key_is_none",
)

# Broken backend (a class in leasekit_broken) -> suite tests that must fail against it.
# A bare name means every parametrization of that test must fail; "name[id]" one case.
CAUGHT: dict[str, tuple[str, ...]] = {
    "ReleaseWithoutOwnerCheck": ("test_release_by_non_owner_leaves_holder_in_place",),
    "ReacquireIssuesNewToken": (
        "test_reacquire_by_holder_succeeds_and_keeps_token",
        "test_fencing_token_is_kept_by_reacquire_renew_and_self_transfer",
    ),
    "RenewAfterExpiry": ("test_renew_after_expiry_returns_false_and_does_not_revive",),
    "NonAtomicTransfer": (
        "test_transfer_never_lets_racing_acquirers_in",
        "test_transfer_under_racing_acquirers_hands_over_or_fails_cleanly",
    ),
    "DeniedAcquireReportsCaller": ("test_acquire_held_key_is_denied_and_names_holder",),
    "DeniedAcquireReportsNone": ("test_acquire_held_key_is_denied_and_names_holder",),
    "DeniedAcquireLeaksToken": ("test_acquire_held_key_is_denied_and_names_holder",),
    "PerKeyTokenCounter": (
        "test_fencing_tokens_increase_across_release_and_reacquire",
        "test_fencing_tokens_continue_after_reconnecting",
    ),
    "NoValidation": ("test_invalid_argument_is_refused_and_nothing_changes",),
    "TransferSkipsToOwnerValidation": tuple(
        f"test_invalid_argument_is_refused_and_nothing_changes[transfer_lease-to_owner-{label}]"
        for label in (
            "empty",
            "None",
            "int",
            "bytes",
            "1025-ascii-bytes",
            "1026-utf8-bytes",
            "lone-surrogate",
        )
    ),
    "IgnoresTtl": (
        "test_lease_is_free_once_its_ttl_has_passed",
        "test_acquire_after_expiry_by_new_owner_succeeds",
    ),
    "OwnerVisibleAfterExpiry": ("test_lease_is_free_once_its_ttl_has_passed",),
    "ReacquireKeepsOldExpiry": ("test_reacquire_by_holder_resets_ttl_to_the_new_value",),
    "TransferKeepsToken": (
        "test_fencing_tokens_increase_across_transfers",
        "test_transfer_by_holder_hands_lease_to_new_owner",
    ),
    "RenewNeverShortens": ("test_renew_by_holder_resets_ttl_to_the_new_value",),
    "TransferAfterExpiry": ("test_transfer_after_expiry_returns_false_and_does_not_revive",),
    "CheckThenSetAcquire": ("test_racing_tasks_get_exactly_one_winner_per_round",),
    "CloseIsNoop": (
        "test_operations_after_aclose_raise_lease_error",
        "test_leaving_async_with_closes_the_provider",
    ),
    "ClosedRaisesDriverError": (
        "test_operations_after_aclose_raise_lease_error",
        "test_leaving_async_with_closes_the_provider",
    ),
    "AcloseCancelsInFlight": ("test_aclose_with_operations_in_flight_settles_every_caller",),
    "TokenCounterPerProvider": ("test_fencing_tokens_continue_after_reconnecting",),
    "ExpiredReacquireKeepsToken": (
        "test_acquire_after_expiry_by_former_holder_starts_a_new_lease",
        "test_fencing_tokens_increase_across_expiry",
    ),
    "TtlRoundedDown": ("test_ttl_is_rounded_up_never_down",),
    "OwnerAsBytes": (
        "test_acquire_free_key_grants_lease_to_caller",
        "test_get_lease_owner_returns_live_holder",
    ),
    "RenewReturnsInt": (
        "test_renew_by_holder_returns_true_and_keeps_token",
        "test_renew_of_free_key_returns_false_and_does_not_acquire",
    ),
    "DeniedAcquireExtendsHolder": ("test_denied_acquire_leaves_holders_ttl_alone",),
    "RefusedTransferResetsHolderTtl": ("test_refused_transfer_leaves_holders_ttl_alone",),
    "StripsNulFromKeys": ("test_keys_differing_only_by_nul_are_distinct",),
}

# Run whole, not just the tests named above: the headline broken backend of the issue.
WHOLE_SUITE = ("ReleaseWithoutOwnerCheck",)


@dataclass
class SuiteRun:
    """One pytest subprocess: its exit status, output and per-test outcomes."""

    returncode: int
    output: str
    # (test class, test name with parametrization) -> "passed", "failed", "error", "skipped"
    outcomes: dict[tuple[str, str], str] = field(default_factory=dict)

    def counts(self, test_class: str | None = None) -> Counter[str]:
        return Counter(
            outcome
            for (cls, _), outcome in self.outcomes.items()
            if test_class is None or cls == test_class
        )

    def of(self, test_class: str, test: str) -> list[str]:
        """Outcomes of ``test`` (every parametrization unless ``test`` names one)."""
        return [
            outcome
            for (cls, name), outcome in self.outcomes.items()
            if cls == test_class and (name == test or name.partition("[")[0] == test)
        ]

    def describe(self) -> str:
        return f"exit status {self.returncode}\n{self.output[-6000:]}"


# A test that failed in its call and then errored in teardown counts as failed.
_JUNIT_TAGS = (("failure", "failed"), ("error", "error"), ("skipped", "skipped"))


def _env(pythonpath: list[Path]) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTEST_ADDOPTS", None)
    inherited = [env["PYTHONPATH"]] if env.get("PYTHONPATH") else []
    env["PYTHONPATH"] = os.pathsep.join([*(str(p) for p in pythonpath), *inherited])
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # nothing left behind in examples/
    return env


def run_pytest(args: list[str], *, pythonpath: list[Path], cwd: Path) -> SuiteRun:
    """Run pytest with ``args`` in a subprocess and collect each test's outcome."""
    report = cwd / f"junit-{uuid.uuid4().hex}.xml"
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfE"]
    proc = subprocess.run(
        [*command, f"--junitxml={report}", *args],
        cwd=cwd,
        env=_env(pythonpath),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    run = SuiteRun(proc.returncode, proc.stdout + proc.stderr)
    if report.exists():
        for case in ET.parse(report).iter("testcase"):
            test_class = case.get("classname", "").rpartition(".")[2]
            tags = {child.tag for child in case}
            outcome = next((o for tag, o in _JUNIT_TAGS if tag in tags), "passed")
            run.outcomes[test_class, case.get("name", "")] = outcome
    return run


def run_python(script: str, *, pythonpath: list[Path], cwd: Path) -> list[str]:
    """Run ``script`` in a fresh interpreter; return the lines it printed."""
    proc = subprocess.run(
        [sys.executable, "-c", script],
        cwd=cwd,
        env=_env(pythonpath),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.splitlines()


@pytest.fixture(scope="module")
def installed_plugin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``leasekit-dictstore`` pip-installed into a fresh directory; returns that directory.

    Built from a copy so no build output lands in the repository. On ``PYTHONPATH``,
    its dist-info is what ``importlib.metadata`` (and so leasekit's registry) sees.
    With hatchling installed here the build is offline; without it pip fetches
    hatchling into an isolated build environment, and the tests skip if it cannot.
    """
    if importlib.util.find_spec("pip") is None:
        pytest.skip("installing the example plugin needs pip in this environment")
    offline = importlib.util.find_spec("hatchling") is not None
    source = tmp_path_factory.mktemp("dictstore-source") / "third_party_backend"
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns("__pycache__", ".*"))
    target = tmp_path_factory.mktemp("dictstore-installed")
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    build = ["--no-index", "--no-build-isolation"] if offline else []
    proc = subprocess.run(
        [*pip, *build, "--no-deps", "--target", str(target), str(source)],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    output = proc.stdout + proc.stderr
    if proc.returncode != 0 and not offline:
        pytest.skip(
            "building the example plugin needs hatchling (pip install hatchling), and pip "
            f"could not fetch it: {output.strip()[-300:]}"
        )
    assert proc.returncode == 0, f"pip install of the example failed:\n{output}"
    return target


def assert_whole_suite_passed(run: SuiteRun) -> None:
    counts = run.counts()
    assert run.returncode == 0, run.describe()
    assert counts["failed"] == counts["error"] == 0, run.describe()
    assert counts["passed"] >= 100, f"the suite hardly ran: {dict(counts)}\n{run.describe()}"
    # In-process stores declare shared_across_processes=False and no release
    # notifications: only the multi-process and the wake-up checks may skip (and those
    # of the extras they lack: renew_leases, release_grant). Fencing and atomic
    # transfer are declared, so they must run.
    # Through the blocking driver (a class whose name ends in "Blocking"), also the
    # checks a blocking call cannot take part in (BLOCKING_DRIVER_SKIPS).
    skipped = sorted(key for key, outcome in run.outcomes.items() if outcome == "skipped")
    assert all(
        "processes" in name
        or name in WAKE_UP_CHECKS
        or name.split("[")[0] in ROUTING_CHECKS
        or name.split("[")[0] in SLOT_CHECKS
        or name.split("[")[0] in FAIR_WAITING_CHECKS
        or name.split("[")[0] in BATCHED_RENEWAL_CHECKS
        or name == RELEASE_GRANT_CHECK
        or (cls.endswith("Blocking") and name.split("[")[0] in BLOCKING_DRIVER_SKIPS)
        for cls, name in skipped
    ), skipped


@pytest.mark.slow  # the whole suite, in a child pytest
def test_example_backend_passes_the_suite_through_the_mixin(tmp_path: Path) -> None:
    """The author's own one-class test module passes, with the example's pytest config."""
    run = run_pytest([str(EXAMPLE / "tests")], pythonpath=[EXAMPLE], cwd=tmp_path)
    assert_whole_suite_passed(run)
    assert {cls for cls, _ in run.outcomes} == {"TestDictLeaseProvider"}


def test_example_backend_is_found_through_its_entry_point(
    installed_plugin: Path, tmp_path: Path
) -> None:
    """Once installed, leasekit lists the plugin and connect() loads it, from metadata."""
    script = (
        "import leasekit\n"
        "[info] = [b for b in leasekit.available_backends(check=True) if b.scheme == 'dictstore']\n"
        "print(info.distribution, info.target, info.loadable)\n"
        "provider = leasekit.connect('dictstore://entry-point')\n"
        "print(type(provider).__module__, type(provider).__name__)\n"
        "print(__import__(type(provider).__module__).__file__)\n"
    )
    listed, loaded, location = run_python(script, pythonpath=[installed_plugin], cwd=tmp_path)
    assert listed == "leasekit-dictstore leasekit_dictstore:DictLeaseProvider True"
    assert loaded == "leasekit_dictstore DictLeaseProvider"
    assert Path(location).is_relative_to(installed_plugin), location


def test_example_backend_joins_leasekit_bench_through_its_entry_point(
    installed_plugin: Path, tmp_path: Path
) -> None:
    """``leasekit bench dictstore://`` measures the plugin's own floor, found by metadata.

    Nothing registers the scheme: the floor comes from the installed copy's
    ``leasekit.bench`` entry point, and it is the only bench module imported.
    """
    script = (
        "import json, sys\n"
        "from leasekit.bench import run_bench\n"
        "report = run_bench('dictstore://bench', seconds=0.05, scenarios=['single', 'contended'])\n"
        "print(json.dumps(report.to_json()))\n"
        "print(sys.modules['leasekit_dictstore._bench'].__file__)\n"
        "print(sorted(m for m in sys.modules if m.startswith('leasekit_') and '_bench' in m))\n"
    )
    output, location, benches = run_python(script, pythonpath=[installed_plugin], cwd=tmp_path)
    report = json.loads(output)
    rows = {(r["contender"], r["scenario"]): r for r in report["results"]}
    assert set(rows) == {
        (contender, scenario)
        for contender in ("leasekit", "dictstore-raw")
        for scenario in ("single", "contended")
    }
    floor = rows["dictstore-raw", "single"]
    assert (floor["role"], floor["error"], floor["ratio_to_floor"]) == ("floor", None, 1.0)
    assert floor["cycles"] > 0
    assert rows["leasekit", "single"]["cycles"] > 0
    assert Path(location).is_relative_to(installed_plugin), location
    assert benches == "['leasekit_dictstore._bench']"


@pytest.mark.slow  # the whole suite, in a child pytest
def test_example_backend_passes_the_suite_through_the_plugin(
    installed_plugin: Path, tmp_path: Path
) -> None:
    """``pytest -p leasekit_contract --leasekit-url dictstore://...``, no test code at all.

    Only the installed copy is importable, and nothing registers the scheme: the
    entry point in its dist-info is the only way leasekit can resolve ``dictstore``.
    """
    url = f"dictstore://conformance-{uuid.uuid4().hex[:8]}"
    run = run_pytest(
        ["-W", "error", "-p", "leasekit_contract", "--leasekit-url", url],
        pythonpath=[installed_plugin],
        cwd=tmp_path,
    )
    assert_whole_suite_passed(run)
    # Through both drivers: the provider at the URL, and leasekit.sync.connect(URL).
    assert {cls for cls, _ in run.outcomes} == {
        "TestLeaseProviderAtURL",
        "TestLeaseProviderAtURLBlocking",
    }


@pytest.fixture(scope="module")
def broken_run(tmp_path_factory: pytest.TempPathFactory) -> SuiteRun:
    """One pytest run over every broken backend: the named tests, or the whole suite."""
    selected: list[str] = []
    for backend, tests in CAUGHT.items():
        node = f"{BROKEN_RUNNER}::Test{backend}"
        if backend in WHOLE_SUITE:
            selected.append(node)
        else:
            selected.extend(f"{node}::{test}" for test in (*tests, *CONTROLS))
    return run_pytest(
        selected,
        pythonpath=[EXAMPLE, BROKEN],
        cwd=tmp_path_factory.mktemp("broken-run"),
    )


def test_every_broken_backend_is_checked_here(tmp_path: Path) -> None:
    """A backend added to leasekit_broken must be given its expectations above."""
    script = "import leasekit_broken\nfor b in leasekit_broken.VARIANTS: print(b.__name__)\n"
    names = run_python(script, pythonpath=[EXAMPLE, BROKEN], cwd=tmp_path)
    assert len(names) == len(set(names))
    assert set(names) == set(CAUGHT)


@pytest.mark.slow  # the suite on every broken backend
def test_release_without_owner_check_fails_the_whole_suite(broken_run: SuiteRun) -> None:
    """The issue's headline case: the full suite fails it, and says where."""
    backend = "TestReleaseWithoutOwnerCheck"
    counts = broken_run.counts(backend)
    assert broken_run.returncode == 1, broken_run.describe()
    assert counts["failed"] >= 1, broken_run.describe()
    assert counts["error"] == 0, broken_run.describe()
    assert counts["passed"] >= 100, dict(counts)
    assert broken_run.of(backend, "test_release_by_non_owner_leaves_holder_in_place") == ["failed"]
    # pytest's own summary names the failing rule, as an author would read it.
    node = f"{BROKEN_RUNNER.name}::{backend}::test_release_by_non_owner_leaves_holder_in_place"
    assert any(
        line.startswith("FAILED ") and node in line for line in broken_run.output.splitlines()
    ), broken_run.describe()


@pytest.mark.parametrize("backend", sorted(CAUGHT))
@pytest.mark.slow  # the suite on every broken backend
def test_suite_fails_broken_backend_where_expected(broken_run: SuiteRun, backend: str) -> None:
    test_class = f"Test{backend}"
    for test in CAUGHT[backend]:
        outcomes = broken_run.of(test_class, test)
        assert outcomes, f"{test} did not run against {backend}\n{broken_run.describe()}"
        assert set(outcomes) == {"failed"}, (
            f"{test} must fail (not error, not pass) against {backend}: {outcomes}\n"
            f"{broken_run.describe()}"
        )
    for test in CONTROLS:
        assert broken_run.of(test_class, test) == ["passed"], (
            f"control {test} must pass against {backend}\n{broken_run.describe()}"
        )
