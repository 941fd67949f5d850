"""A Django email backend for tests/test_recipes.py that waits at a gate the test opens.

The Django recipe's test races two ``manage.py send_digest`` processes: the one that
sends stays inside ``send_messages`` (having said so with an ``entered-<pid>`` file)
until the test creates ``open`` in ``$RECIPE_GATE``, so the other one finds the lease
held, whatever the timing. Sent messages go to ``sent-<pid>`` files.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path

from django.core.mail import EmailMessage
from django.core.mail.backends.base import BaseEmailBackend
from exclusive import PATIENCE_S


class GatedEmailBackend(BaseEmailBackend):
    def send_messages(self, email_messages: Sequence[EmailMessage]) -> int:
        gate = Path(os.environ["RECIPE_GATE"])
        (gate / f"entered-{os.getpid()}").touch()
        deadline = time.monotonic() + 6 * PATIENCE_S
        while not (gate / "open").exists():
            if time.monotonic() > deadline:
                raise RuntimeError("the test never opened the gate")
            time.sleep(0.01)
        (gate / f"sent-{os.getpid()}").write_text("\n".join(m.subject for m in email_messages))
        return len(email_messages)
