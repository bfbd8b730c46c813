"""Key material and kubeconfigs for a throwaway loopback control plane.

We make our own CA rather than let kube-apiserver self-sign, so clients (kubectl, the python client,
kube-controller-manager) verify TLS for real and the CA that kube-controller-manager publishes into
every namespace (`kube-root-ca.crt`) is the one that actually signed the serving cert — the same trust
chain a pod in a real cluster sees.
"""
from __future__ import annotations

import datetime as dt
import ipaddress
import secrets
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

# DNS names pods use for the API (plus loopback for us); the service IP is added per cluster.
_API_DNS_NAMES = ("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
                  "kubernetes.default.svc.cluster.local")


@dataclass(frozen=True)
class Pki:
    ca_cert: Path
    serving_cert: Path
    serving_key: Path
    sa_private_key: Path
    sa_public_key: Path


def _rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _write_key(key: rsa.RSAPrivateKey, path: Path) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    path.chmod(0o600)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def write_pki(directory: Path, service_ip: str) -> Pki:
    """CA, an apiserver serving cert it signs, and the service-account token signing key pair.

    Both certificates carry key identifiers (RFC 5280): Python 3.13's default TLS context verifies with
    `VERIFY_X509_STRICT`, which rejects a chain without an Authority Key Identifier, so on Debian 13 every
    readiness probe of the apiserver failed ("Missing Authority Key Identifier") until they did."""
    directory.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=5)
    later = now + dt.timedelta(days=30)

    ca_key = _rsa_key()
    ca_cert = (
        x509.CertificateBuilder().subject_name(_name("handoff-testbed-ca")).issuer_name(_name("handoff-testbed-ca"))
        .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now).not_valid_after(later)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False, data_encipherment=False,
                                     key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    serving_key = _rsa_key()
    sans: list[x509.GeneralName] = [x509.DNSName(name) for name in _API_DNS_NAMES]
    sans += [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.IPAddress(ipaddress.ip_address(service_ip))]
    serving_cert = (
        x509.CertificateBuilder().subject_name(_name("kube-apiserver")).issuer_name(ca_cert.subject)
        .public_key(serving_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now).not_valid_after(later)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(serving_key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    sa_key = _rsa_key()

    pki = Pki(ca_cert=directory / "ca.crt", serving_cert=directory / "apiserver.crt",
              serving_key=directory / "apiserver.key", sa_private_key=directory / "sa.key",
              sa_public_key=directory / "sa.pub")
    pki.ca_cert.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    pki.serving_cert.write_bytes(serving_cert.public_bytes(serialization.Encoding.PEM))
    _write_key(serving_key, pki.serving_key)
    _write_key(sa_key, pki.sa_private_key)
    pki.sa_public_key.write_bytes(sa_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return pki


@dataclass(frozen=True)
class TokenUser:
    """A line of kube-apiserver's --token-auth-file: static bearer token → user and groups."""

    name: str
    groups: tuple[str, ...]
    token: str

    @classmethod
    def new(cls, name: str, *groups: str) -> "TokenUser":
        return cls(name=name, groups=groups, token=secrets.token_hex(24))


def write_token_file(path: Path, users: list[TokenUser]) -> None:
    lines = [f'{u.token},{u.name},{u.name},"{",".join(u.groups)}"' for u in users]
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o600)


def write_kubeconfig(path: Path, server: str, ca_cert: Path, user: TokenUser, context: str = "handoff-testbed") -> None:
    """A kubeconfig that kubectl and the python client both accept.

    The CA by path, not inlined: the python client writes inlined CA data to a temporary file that only its atexit
    removes, so each client process a test killed left one in /tmp.
    """
    path.write_text(
        "apiVersion: v1\n"
        "kind: Config\n"
        "clusters:\n"
        f"- name: {context}\n"
        "  cluster:\n"
        f"    server: {server}\n"
        f"    certificate-authority: {ca_cert.resolve()}\n"
        "users:\n"
        f"- name: {user.name}\n"
        "  user:\n"
        f"    token: {user.token}\n"
        "contexts:\n"
        f"- name: {context}\n"
        "  context:\n"
        f"    cluster: {context}\n"
        f"    user: {user.name}\n"
        "    namespace: default\n"
        f"current-context: {context}\n"
    )
    path.chmod(0o600)
