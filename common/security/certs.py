"""A small certificate authority for the hub link's mutual TLS.

Flower 1.42 has no mutual TLS (its SuperLink never asks for a client certificate and a SuperNode
cannot present one): the hub's ingress (nginx
``ssl_verify_client on`` / ingress-nginx ``auth-tls-verify-client``) verifies client
certificates against ``ca.crt`` and each member's sidecar (stunnel) presents its cluster's
client certificate. The same CA can issue server certificates for a member's scheduler
extender (kube-scheduler's extender ``tlsConfig`` certFile/keyFile/caFile: the scheduler's client
certificate, so mutual TLS to the extender is native).

Layout of a certificate directory::

    DIR/ca.key  DIR/ca.crt                    self-signed CA (path length 0)
    DIR/hub.key DIR/hub.crt                   the hub's server certificate
    DIR/clients/NAME.key  DIR/clients/NAME.crt  a member cluster's client certificate
    DIR/servers/NAME.key  DIR/servers/NAME.crt  a member cluster's server certificate

Private keys are unencrypted PEM (PKCS#8) written with mode 0600; certificates are PEM.
Only APIs present in cryptography 44..50 are used.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from fedsched.common.files import atomic_write

CA_KEY, CA_CRT = "ca.key", "ca.crt"
HUB_KEY, HUB_CRT = "hub.key", "hub.crt"
CLIENTS_DIR, SERVERS_DIR = "clients", "servers"
KINDS = ("client", "server")
DEFAULT_DAYS = 825  # leaf certificates (the CA/Browser limit that Apple and others enforce)
DEFAULT_CA_DAYS = 3650
DEFAULT_HUB_HOSTS = ("localhost",)
DEFAULT_HUB_IPS = ("127.0.0.1",)
SPIFFE_PREFIX = "spiffe://fedsched/cluster/"
ORG = "fedsched"
BACKDATE = dt.timedelta(minutes=5)  # tolerate small clock skew between issuer and verifier

_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
_HOST_LABEL = re.compile(r"^[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?$")

PrivateKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey


class CertExistsError(FileExistsError, ValueError):
    """Refusal to overwrite existing key material (a ``ValueError`` too, for the CLI)."""


@dataclass(frozen=True)
class CertFiles:
    """Where one certificate and its private key live."""

    cert: Path
    key: Path

    def load(self) -> x509.Certificate:
        return load_cert(self.cert)

    def exists(self) -> bool:
        return self.cert.exists() or self.key.exists()


@dataclass(frozen=True)
class Issued:
    """Result of ``issue``: the files written and the certificate."""

    files: CertFiles
    cert: x509.Certificate
    clamped: bool = False  # not-after was cut to the CA's not-after


@dataclass(frozen=True)
class InitResult:
    ca: CertFiles
    hub: CertFiles
    ca_cert: x509.Certificate
    hub_cert: x509.Certificate
    stale: tuple[Path, ...] = ()  # previously issued certificates that the new CA no longer vouches for


# --------------------------------------------------------------------------- paths and names

def ca_files(directory: str | os.PathLike) -> CertFiles:
    d = Path(directory)
    return CertFiles(d / CA_CRT, d / CA_KEY)


def hub_files(directory: str | os.PathLike) -> CertFiles:
    d = Path(directory)
    return CertFiles(d / HUB_CRT, d / HUB_KEY)


def leaf_files(directory: str | os.PathLike, name: str, kind: str = "client") -> CertFiles:
    _check_kind(kind)
    sub = Path(directory) / (CLIENTS_DIR if kind == "client" else SERVERS_DIR)
    return CertFiles(sub / f"{name}.crt", sub / f"{name}.key")


def list_issued(directory: str | os.PathLike, kind: str = "client") -> list[str]:
    """Names of the issued certificates of one kind, sorted."""
    _check_kind(kind)
    sub = Path(directory) / (CLIENTS_DIR if kind == "client" else SERVERS_DIR)
    return sorted(p.stem for p in sub.glob("*.crt")) if sub.is_dir() else []


def validate_name(name: str) -> str:
    """A cluster name is a DNS label: 1-63 of [a-z0-9-], starting and ending alphanumeric."""
    if not isinstance(name, str) or not _LABEL.match(name):
        raise ValueError(
            f"invalid cluster name {name!r}: use 1-63 lowercase letters, digits or '-', starting and "
            "ending with a letter or digit (a DNS label, e.g. 'cluster-a')")
    return name


def validate_host(host: str) -> str:
    """A DNS name for a SAN: labels of [a-z0-9_-], optionally a leading '*.' wildcard."""
    h = host.strip().lower().rstrip(".")
    body = h[2:] if h.startswith("*.") else h
    if not body or len(h) > 253 or not all(_HOST_LABEL.match(lab) for lab in body.split(".")):
        raise ValueError(f"invalid DNS name {host!r} for a certificate (letters, digits, '-', dots)")
    try:
        ipaddress.ip_address(h)
    except ValueError:
        return h
    raise ValueError(f"{host!r} is an IP address: pass it as an IP (--ip / --hub-ip), not a DNS name")


def validate_ip(ip: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    try:
        return ipaddress.ip_address(ip.strip())
    except ValueError:
        raise ValueError(f"invalid IP address {ip!r}") from None


def spiffe_id(name: str) -> str:
    return SPIFFE_PREFIX + validate_name(name)


def cluster_name(cert: x509.Certificate) -> str | None:
    """The cluster a leaf certificate names: its spiffe URI SAN, else its common name."""
    for uri in _sans(cert).get("uri", []):
        if uri.startswith(SPIFFE_PREFIX):
            return uri[len(SPIFFE_PREFIX):]
    cns = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(cns[0].value) if cns else None


# --------------------------------------------------------------------------- keys and files

def _new_key(use_rsa: bool) -> PrivateKey:
    if use_rsa:
        return rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return ec.generate_private_key(ec.SECP256R1())


def _write_pair(files: CertFiles, key: PrivateKey, cert: x509.Certificate) -> None:
    atomic_write(files.key, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()), 0o600)
    atomic_write(files.cert, cert.public_bytes(serialization.Encoding.PEM), 0o644)


def load_cert(path: str | os.PathLike) -> x509.Certificate:
    p = Path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise FileNotFoundError(f"no certificate at {p}") from None
    try:
        return x509.load_pem_x509_certificate(data)
    except ValueError as e:
        raise ValueError(f"{p} is not a PEM certificate: {e}") from None


def load_key(path: str | os.PathLike) -> PrivateKey:
    p = Path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise FileNotFoundError(f"no private key at {p}") from None
    key = serialization.load_pem_private_key(data, password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
        raise ValueError(f"{p}: unsupported key type {type(key).__name__} (EC or RSA expected)")
    return key


def _pub_der(key) -> bytes:
    return key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def load_ca(directory: str | os.PathLike) -> tuple[x509.Certificate, PrivateKey]:
    files = ca_files(directory)
    if not files.cert.exists() or not files.key.exists():
        raise FileNotFoundError(
            f"no CA in {Path(directory)} (need {CA_CRT} and {CA_KEY}): run 'fedsched certs init --dir "
            f"{Path(directory)}' first")
    cert, key = load_cert(files.cert), load_key(files.key)
    if _pub_der(cert.public_key()) != _pub_der(key.public_key()):
        raise ValueError(f"{files.key} does not belong to {files.cert}")
    return cert, key


# --------------------------------------------------------------------------- building certificates

def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC).replace(microsecond=0)


def _validity(days: int, now: dt.datetime) -> tuple[dt.datetime, dt.datetime]:
    not_after = now + dt.timedelta(days=days)
    not_before = now - BACKDATE
    if not_before >= not_after:  # an already-expired certificate (tests): valid for one day in the past
        not_before = not_after - dt.timedelta(days=1)
    return not_before, not_after


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, ORG),
                      x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _check_days(days: int, allow_expired: bool = False) -> int:
    if isinstance(days, bool) or not isinstance(days, int):
        raise ValueError(f"days must be an integer (got {days!r})")
    if days <= 0 and not allow_expired:
        raise ValueError(f"days must be positive (got {days}); an already-expired certificate needs "
                         "--allow-expired (allow_expired=True), which is meant for tests")
    return days


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)} (got {kind!r})")


def _leaf(subject_cn: str, key: PrivateKey, ca_cert: x509.Certificate, ca_key: PrivateKey, *,
          kind: str, not_before: dt.datetime, not_after: dt.datetime, dns: Sequence[str],
          ips: Sequence[ipaddress.IPv4Address | ipaddress.IPv6Address], uris: Sequence[str] = ()
          ) -> x509.Certificate:
    sans: list[x509.GeneralName] = [x509.UniformResourceIdentifier(u) for u in uris]
    sans += [x509.DNSName(h) for h in dict.fromkeys(dns)]
    sans += [x509.IPAddress(i) for i in dict.fromkeys(ips)]
    if kind == "server":
        usage = dict(digital_signature=True, key_encipherment=True)
        eku = [ExtendedKeyUsageOID.SERVER_AUTH]
    else:
        usage = dict(digital_signature=True, key_encipherment=False)
        eku = [ExtendedKeyUsageOID.CLIENT_AUTH]
    ca_ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject_cn))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(content_commitment=False, data_encipherment=False, key_agreement=False,
                                     key_cert_sign=False, crl_sign=False, encipher_only=False,
                                     decipher_only=False, **usage), critical=True)
        .add_extension(x509.ExtendedKeyUsage(eku), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(ca_key, hashes.SHA256())


def init_ca(directory: str | os.PathLike, *, days: int = DEFAULT_DAYS, ca_days: int = DEFAULT_CA_DAYS,
            hub_hosts: Iterable[str] | None = None, hub_ips: Iterable[str] | None = None,
            use_rsa: bool = False, force: bool = False, ca_name: str = "fedsched CA") -> InitResult:
    """Create DIR/ca.{key,crt} (self-signed CA) and DIR/hub.{key,crt} (the hub's server certificate).

    ``days`` is the hub certificate's lifetime, ``ca_days`` the CA's (the hub certificate is cut to
    the CA's). Refuses to replace an existing CA unless ``force``.
    """
    d = Path(directory)
    _check_days(days)
    _check_days(ca_days)
    hosts = [validate_host(h) for h in (DEFAULT_HUB_HOSTS if hub_hosts is None else hub_hosts)]
    ips = [validate_ip(i) for i in (DEFAULT_HUB_IPS if hub_ips is None else hub_ips)]
    if not hosts and not ips:
        raise ValueError("the hub certificate needs at least one DNS name or IP address")
    ca, hub = ca_files(d), hub_files(d)
    if ca.exists() and not force:
        raise CertExistsError(
            f"a CA already exists in {d} ({CA_CRT}/{CA_KEY}); refusing to overwrite it (every certificate it "
            "issued would stop verifying). Use --force (force=True) to replace it, or another --dir")
    if not d.exists():
        d.mkdir(mode=0o700, parents=True)

    now = _now()
    ca_key = _new_key(use_rsa)
    ca_before, ca_after = _validity(ca_days, now)
    ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(_name(ca_name))
        .issuer_name(_name(ca_name))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(ca_before)
        .not_valid_after(ca_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False,
                                     key_encipherment=False, data_encipherment=False, key_agreement=False,
                                     key_cert_sign=True, crl_sign=True, encipher_only=False,
                                     decipher_only=False), critical=True)
        .add_extension(ski, critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    hub_key = _new_key(use_rsa)
    before, after = _validity(days, now)
    hub_cert = _leaf(hosts[0] if hosts else str(ips[0]), hub_key, ca_cert, ca_key, kind="server",
                     not_before=before, not_after=min(after, ca_after), dns=hosts, ips=ips)
    _write_pair(ca, ca_key, ca_cert)
    _write_pair(hub, hub_key, hub_cert)
    stale = tuple(leaf_files(d, n, k).cert for k in KINDS for n in list_issued(d, k))
    return InitResult(ca=ca, hub=hub, ca_cert=ca_cert, hub_cert=hub_cert, stale=stale)


def issue(directory: str | os.PathLike, name: str, *, kind: str = "client", days: int = DEFAULT_DAYS,
          hosts: Iterable[str] = (), ips: Iterable[str] = (), use_rsa: bool = False,
          allow_expired: bool = False) -> Issued:
    """Issue a member cluster's certificate signed by the CA in ``directory``.

    ``kind="client"`` (the hub link): CN=name, EKU clientAuth, SANs ``spiffe://fedsched/cluster/NAME``
    and DNS ``name`` (plus ``hosts``/``ips``), into DIR/clients/NAME.{key,crt}.
    ``kind="server"`` (the member's extender over HTTPS): EKU serverAuth, SANs DNS ``hosts``
    (default ``name``) and ``ips``, into DIR/servers/NAME.{key,crt}. Re-issuing replaces the pair
    (rotation). ``days <= 0`` needs ``allow_expired`` (tests mint expired certificates that way).
    """
    validate_name(name)
    _check_kind(kind)
    _check_days(days, allow_expired)
    dns = [validate_host(h) for h in hosts]
    addrs = [validate_ip(i) for i in ips]
    ca_cert, ca_key = load_ca(directory)
    now = _now()
    if ca_cert.not_valid_after_utc <= now and not allow_expired:
        raise ValueError(f"the CA in {Path(directory)} expired on {_iso(ca_cert.not_valid_after_utc)}: "
                         "create a new one with 'fedsched certs init --force'")
    before, after = _validity(days, now)
    clamped = after > ca_cert.not_valid_after_utc
    after = min(after, ca_cert.not_valid_after_utc)
    before = min(before, after - dt.timedelta(seconds=1))
    if kind == "client":
        dns, uris = [name, *dns], [spiffe_id(name)]
    else:
        dns, uris = (dns or [name]), []
    key = _new_key(use_rsa)
    cert = _leaf(name, key, ca_cert, ca_key, kind=kind, not_before=before, not_after=after, dns=dns,
                 ips=addrs, uris=uris)
    files = leaf_files(directory, name, kind)
    _write_pair(files, key, cert)
    return Issued(files=files, cert=cert, clamped=clamped)


# --------------------------------------------------------------------------- inspection and checks

def _iso(t: dt.datetime) -> str:
    return t.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def fingerprint(cert: x509.Certificate) -> str:
    return cert.fingerprint(hashes.SHA256()).hex(":").upper()


def _sans(cert: x509.Certificate) -> dict[str, list[str]]:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return {}
    out = {"dns": san.get_values_for_type(x509.DNSName),
           "ip": [str(i) for i in san.get_values_for_type(x509.IPAddress)],
           "uri": san.get_values_for_type(x509.UniformResourceIdentifier)}
    return {k: v for k, v in out.items() if v}


_KU_FIELDS = ("digital_signature", "content_commitment", "key_encipherment", "data_encipherment",
              "key_agreement", "key_cert_sign", "crl_sign")
_EKU_NAMES = {ExtendedKeyUsageOID.SERVER_AUTH: "serverAuth", ExtendedKeyUsageOID.CLIENT_AUTH: "clientAuth",
              ExtendedKeyUsageOID.CODE_SIGNING: "codeSigning", ExtendedKeyUsageOID.EMAIL_PROTECTION:
              "emailProtection", ExtendedKeyUsageOID.TIME_STAMPING: "timeStamping",
              ExtendedKeyUsageOID.OCSP_SIGNING: "OCSPSigning"}


def _key_usage(cert: x509.Certificate) -> list[str]:
    try:
        ku = cert.extensions.get_extension_for_class(x509.KeyUsage).value
    except x509.ExtensionNotFound:
        return []
    return [f for f in _KU_FIELDS if getattr(ku, f)]


def _eku(cert: x509.Certificate) -> list[str] | None:
    try:
        eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        return None  # no EKU extension: any purpose
    return [_EKU_NAMES.get(oid, oid.dotted_string) for oid in eku]


def _key_desc(cert: x509.Certificate) -> str:
    pub = cert.public_key()
    if isinstance(pub, ec.EllipticCurvePublicKey):
        return {"secp256r1": "EC P-256", "secp384r1": "EC P-384"}.get(pub.curve.name, f"EC {pub.curve.name}")
    if isinstance(pub, rsa.RSAPublicKey):
        return f"RSA {pub.key_size}"
    return type(pub).__name__


def describe(cert: x509.Certificate, now: dt.datetime | None = None) -> dict:
    """A JSON-friendly summary of a certificate."""
    now = now or dt.datetime.now(dt.UTC)
    nb, na = cert.not_valid_before_utc, cert.not_valid_after_utc
    try:
        bc = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
        is_ca, path_length = bc.ca, bc.path_length
    except x509.ExtensionNotFound:
        is_ca, path_length = False, None
    cns = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return {
        "subject": cert.subject.rfc4514_string(),
        "common_name": str(cns[0].value) if cns else None,
        "issuer": cert.issuer.rfc4514_string(),
        "serial": f"{cert.serial_number:x}",
        "not_before": _iso(nb),
        "not_after": _iso(na),
        "not_yet_valid": now < nb,
        "expired": now >= na,
        "days_left": round((na - now).total_seconds() / 86400, 1),
        "sans": _sans(cert),
        "key": _key_desc(cert),
        "key_usage": _key_usage(cert),
        "extended_key_usage": _eku(cert),
        "is_ca": is_ca,
        "path_length": path_length,
        "fingerprint_sha256": fingerprint(cert),
    }


def verify_chain(cert: x509.Certificate, ca_cert: x509.Certificate, purpose: str | None = None, *,
                 now: dt.datetime | None = None) -> None:
    """Check that ``ca_cert`` issued ``cert`` and both are valid now; raise ValueError with the reason.

    ``purpose`` ("client" or "server") also requires the matching extended key usage
    (clientAuth / serverAuth), as a TLS peer would. Hostnames are not checked.
    """
    now = now or dt.datetime.now(dt.UTC)
    if purpose is not None:
        _check_kind(purpose)
    who = describe(cert, now)["subject"]
    try:
        bc = ca_cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        bc = None
    if bc is None or not bc.ca:
        raise ValueError(f"issuer {ca_cert.subject.rfc4514_string()} is not a CA certificate")
    if cert.issuer != ca_cert.subject:
        raise ValueError(f"signature: {who} was issued by {cert.issuer.rfc4514_string()}, "
                         f"not by {ca_cert.subject.rfc4514_string()}")
    try:
        cert.verify_directly_issued_by(ca_cert)
    except (InvalidSignature, ValueError, TypeError) as e:
        raise ValueError(f"signature: {who} is not signed by this CA's key "
                         f"({e or type(e).__name__})") from None
    for c, label in ((ca_cert, "CA certificate"), (cert, "certificate")):
        if now < c.not_valid_before_utc:
            raise ValueError(f"not yet valid: {label} {c.subject.rfc4514_string()} is valid from "
                             f"{_iso(c.not_valid_before_utc)}")
        if now >= c.not_valid_after_utc:
            raise ValueError(f"expired: {label} {c.subject.rfc4514_string()} expired on "
                             f"{_iso(c.not_valid_after_utc)}")
    if purpose is not None:
        want = "clientAuth" if purpose == "client" else "serverAuth"
        eku = _eku(cert)
        if eku is not None and want not in eku:
            raise ValueError(f"wrong extended key usage: {who} allows {', '.join(eku) or 'nothing'}, "
                             f"a {purpose} certificate needs {want}")
