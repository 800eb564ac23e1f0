"""The local CA and server certificate; a data directory written before they existed."""

from __future__ import annotations

import ssl
import subprocess
import sys
from pathlib import Path

from azure.servicebus.management import ServiceBusAdministrationClient
from cryptography import x509

from oncebus.server.certs import ensure_certificates
from tests.http.conftest import start_server


def test_certificates_are_made_once_and_cover_the_local_names(tmp_path: Path) -> None:
    first = ensure_certificates(tmp_path)
    ca = first.ca_file.read_bytes()
    server = first.cert_file.read_bytes()
    assert (first.ca_file.parent / "ca.key").stat().st_mode & 0o077 == 0  # keys are private
    assert first.key_file.stat().st_mode & 0o077 == 0
    again = ensure_certificates(tmp_path)
    assert again.ca_file.read_bytes() == ca and again.cert_file.read_bytes() == server
    cert = x509.load_pem_x509_certificate(server)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(san.get_values_for_type(x509.DNSName)) == {"localhost"}
    assert {str(a) for a in san.get_values_for_type(x509.IPAddress)} == {"127.0.0.1", "::1"}
    # a new listen name re-issues the server certificate with the same CA (clients keep trusting it)
    other = ensure_certificates(tmp_path, host="broker.test")
    assert other.ca_file.read_bytes() == ca and other.cert_file.read_bytes() != server
    context = ssl.create_default_context(cafile=str(other.ca_file))
    assert context.cert_store_stats()["x509_ca"] == 1
    first.server_context()  # loads


def test_a_data_dir_from_before_tls_is_served_and_keeps_its_ca_across_restarts(tmp_path: Path) -> None:
    data = tmp_path / "data"
    cli = [sys.executable, "-c", "import sys; from oncebus.cli import main; sys.exit(main())", "--data-dir", str(data)]
    made = subprocess.run([*cli, "queue", "create", "old", "--duplicate-detection"], capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    assert not (data / "tls").exists()  # the previous layout: no certificates yet
    served = start_server(data)
    try:
        ca = Path(served.ca_file).read_bytes()
        with ServiceBusAdministrationClient.from_connection_string(
            served.connection_string, connection_verify=served.ca_file
        ) as admin:
            assert admin.get_queue("old").requires_duplicate_detection
    finally:
        served.stop()
    served = start_server(data)
    try:
        assert Path(served.ca_file).read_bytes() == ca
        with ServiceBusAdministrationClient.from_connection_string(
            served.connection_string, connection_verify=served.ca_file
        ) as admin:
            assert [q.name for q in admin.list_queues()] == ["old"]
    finally:
        served.stop()
