"""``manage.py send_digest``: every host's cron runs it, exactly one host sends."""

from __future__ import annotations

import socket
from typing import Any

from django.conf import settings
from django.core.mail import send_mail
from django.core.management.base import BaseCommand

import leasekit
import leasekit.sync


class Command(BaseCommand):
    help = "Send the daily digest; when several hosts run it at once, one sends."

    def handle(self, *args: Any, **options: Any) -> None:
        # Unique per run, and readable in the other hosts' output.
        owner = leasekit.new_owner_id(f"digest@{socket.gethostname()}")
        with leasekit.sync.connect(settings.LEASEKIT_URL) as leases:
            try:
                # No wait_s: a host that finds the digest being sent skips it. The
                # lease is renewed while the body runs and released when it ends.
                with leasekit.sync.hold(
                    leases, "send-digest", owner, ttl_ms=60_000, on_lost="raise"
                ) as lease:
                    send_mail(
                        "Daily digest",
                        "Everything that happened today.",
                        "digest@example.com",
                        settings.DIGEST_RECIPIENTS,
                    )
                    self.stdout.write(f"digest sent by {owner} (token {lease.token})")
            except leasekit.LeaseHeld as busy:
                # Exit status 0: for cron, "another host is on it" is success.
                self.stdout.write(f"skipped: {busy.holder} is sending the digest")
