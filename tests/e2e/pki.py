"""The loopback cluster's PKI: one CA, the API server's serving certificate, client certificates, and the
ServiceAccount token signing key. ECDSA P-256 throughout (fast to generate on a busy CI machine)."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = datetime.timedelta(days=2)


@dataclass(frozen=True)
class CertPair:
    cert: Path
    key: Path


@dataclass(frozen=True)
class Pki:
    ca: CertPair
    apiserver: CertPair
    admin: CertPair
    sa_key: Path
    sa_pub: Path


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _write(path: Path, data: bytes, private: bool = False) -> Path:
    path.write_bytes(data)
    if private:
        path.chmod(0o600)
    return path


class CertificateAuthority:
    def __init__(self, directory: Path, name: str = "kelvin-e2e-ca") -> None:
        self.directory = directory
        self.key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
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
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self.key.public_key()), critical=False)
            .sign(self.key, hashes.SHA256())
        )
        self.pair = CertPair(
            _write(directory / "ca.crt", self.cert.public_bytes(serialization.Encoding.PEM)),
            _write(directory / "ca.key", _key_pem(self.key), private=True),
        )

    @classmethod
    def load(cls, pair: CertPair, directory: Path) -> CertificateAuthority:
        """The CA of existing files (e.g. the cluster's, to issue a kubelet's client certificate); its leaves go to
        ``directory``."""
        ca = cls.__new__(cls)
        ca.directory = directory
        key = serialization.load_pem_private_key(pair.key.read_bytes(), password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise TypeError(f"{pair.key}: not an ECDSA key")
        ca.key = key
        ca.cert = x509.load_pem_x509_certificate(pair.cert.read_bytes())
        ca.pair = pair
        return ca

    def issue(
        self,
        stem: str,
        common_name: str,
        *,
        organizations: tuple[str, ...] = (),
        hosts: tuple[str, ...] = (),
        client: bool = False,
        server: bool = False,
    ) -> CertPair:
        """A leaf certificate signed by this CA; ``hosts`` become DNS or IP SANs."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
        attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
        usages = ([ExtendedKeyUsageOID.CLIENT_AUTH] if client else []) + (
            [ExtendedKeyUsageOID.SERVER_AUTH] if server else []
        )
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attrs))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()), critical=False)
        )
        if hosts:
            sans: list[x509.GeneralName] = []
            for host in hosts:
                try:
                    sans.append(x509.IPAddress(ipaddress.ip_address(host)))
                except ValueError:
                    sans.append(x509.DNSName(host))
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        return CertPair(
            _write(self.directory / f"{stem}.crt", cert.public_bytes(serialization.Encoding.PEM)),
            _write(self.directory / f"{stem}.key", _key_pem(key), private=True),
        )


#: The API server's names: loopback for us, the in-cluster names for clients that verify them.
APISERVER_HOSTS = (
    "127.0.0.1",
    "localhost",
    "10.96.0.1",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)


def generate(directory: Path) -> Pki:
    directory.mkdir(parents=True, exist_ok=True)
    ca = CertificateAuthority(directory)
    sa = ec.generate_private_key(ec.SECP256R1())
    sa_pub = sa.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return Pki(
        ca=ca.pair,
        apiserver=ca.issue("apiserver", "kube-apiserver", hosts=APISERVER_HOSTS, server=True),
        admin=ca.issue("admin", "kelvin-e2e-admin", organizations=("system:masters",), client=True),
        sa_key=_write(directory / "sa.key", _key_pem(sa), private=True),
        sa_pub=_write(directory / "sa.pub", sa_pub),
    )
