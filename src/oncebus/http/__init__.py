"""HTTP front ends: the observability app (``oncebus.http.observe``: /metrics and the dashboard)."""
