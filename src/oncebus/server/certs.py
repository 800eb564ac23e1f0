"""The local certificate authority and the server certificate, kept in the data directory.

``oncebus serve`` creates them on first start with ``cryptography`` (no hand-rolled
crypto): a CA valid for ten years, and a server certificate signed by it for
``localhost``, ``127.0.0.1``, ``::1`` and the listen host. Clients trust the CA
file (``connection_verify=<ca file>`` or ``REQUESTS_CA_BUNDLE``); the CA's key
never leaves the data directory (mode 0600). The server certificate is issued
again, by the same CA, when it nears its end or lacks a name the server
listens on, so a CA file handed to clients keeps working.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

TLS_DIR = "tls"
CA_FILE = "ca.pem"
CA_KEY_FILE = "ca.key"
SERVER_FILE = "server.pem"
SERVER_KEY_FILE = "server.key"
CA_DAYS = 3650
SERVER_DAYS = 397
RENEW_BEFORE = datetime.timedelta(days=30)
DEFAULT_NAMES = ("localhost", "127.0.0.1", "::1")


@dataclass(frozen=True)
class Certificates:
    ca_file: Path
    cert_file: Path
    key_file: Path

    def server_context(self) -> ssl.SSLContext:
        """A server-side TLS context (TLS 1.2+) with the server certificate."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.cert_file, self.key_file)
        return context


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _write(path: Path, data: bytes, *, private: bool = False) -> None:
    """Write atomically (temp file + rename); private files are created 0600."""
    tmp = path.with_name(path.name + ".tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    fd = os.open(tmp, flags, 0o600 if private else 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _san(names: list[str]) -> x509.SubjectAlternativeName:
    entries: list[x509.GeneralName] = []
    for name in names:
        try:
            entries.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            entries.append(x509.DNSName(name))
    return x509.SubjectAlternativeName(entries)


def _names(host: str | None) -> list[str]:
    names = list(DEFAULT_NAMES)
    if host and host not in ("0.0.0.0", "::", "") and host not in names:
        names.append(host)
    return names


def _make_ca(directory: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "oncebus local CA")])
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write(directory / CA_KEY_FILE, _key_pem(key), private=True)
    _write(directory / CA_FILE, cert.public_bytes(serialization.Encoding.PEM))
    return cert, key


def _make_server(directory: Path, ca: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey, names: list[str]) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(min(now + datetime.timedelta(days=SERVER_DAYS), ca.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=True,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(_san(names), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    _write(directory / SERVER_KEY_FILE, _key_pem(key), private=True)
    _write(directory / SERVER_FILE, cert.public_bytes(serialization.Encoding.PEM))


def _server_is_current(directory: Path, ca: x509.Certificate, names: list[str]) -> bool:
    try:
        cert = x509.load_pem_x509_certificate((directory / SERVER_FILE).read_bytes())
        (directory / SERVER_KEY_FILE).stat()
    except (OSError, ValueError):
        return False
    if cert.issuer != ca.subject or cert.not_valid_after_utc - RENEW_BEFORE < _now():
        return False
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    have = {str(v) for v in san.get_values_for_type(x509.DNSName)}
    have |= {str(v) for v in san.get_values_for_type(x509.IPAddress)}
    wanted = {str(ipaddress.ip_address(n)) if _is_ip(n) else n for n in names}
    return wanted <= have


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def ensure_certificates(data_dir: Path, host: str | None = None) -> Certificates:
    """The CA and server certificate under ``<data_dir>/tls``, created or renewed as needed.

    The caller holds the data directory's lock, so no other process writes here meanwhile.
    """
    directory = Path(data_dir) / TLS_DIR
    directory.mkdir(mode=0o700, exist_ok=True)
    names = _names(host)
    try:
        ca = x509.load_pem_x509_certificate((directory / CA_FILE).read_bytes())
        loaded = serialization.load_pem_private_key((directory / CA_KEY_FILE).read_bytes(), password=None)
        if not isinstance(loaded, ec.EllipticCurvePrivateKey) or ca.not_valid_after_utc - RENEW_BEFORE < _now():
            raise ValueError("the CA must be renewed")
        ca_key = loaded
    except (OSError, ValueError):
        ca, ca_key = _make_ca(directory)
        (directory / SERVER_FILE).unlink(missing_ok=True)
    if not _server_is_current(directory, ca, names):
        _make_server(directory, ca, ca_key, names)
    return Certificates(directory / CA_FILE, directory / SERVER_FILE, directory / SERVER_KEY_FILE)
