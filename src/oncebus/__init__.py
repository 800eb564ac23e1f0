"""oncebus: a local, self-hosted Azure Service Bus with exact, durable duplicate detection."""

from __future__ import annotations

__version__ = "0.1.0"
