"""Settings of the digest recipe: the least a Django project with a command needs."""

from __future__ import annotations

import os

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "recipe-only-not-a-secret")
INSTALLED_APPS = ["digests"]
DATABASES: dict[str, dict[str, str]] = {}
USE_TZ = True

# Where the leases live: one store every host that runs the command can reach.
LEASEKIT_URL = os.environ.get("LEASEKIT_URL", "redis://localhost:6379/0")

EMAIL_BACKEND = os.environ.get(
    "DJANGO_EMAIL_BACKEND", "django.core.mail.backends.console.EmailBackend"
)
DIGEST_RECIPIENTS = ["team@example.com"]
