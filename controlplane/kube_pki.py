"""Certificates and kubeconfigs of the local control plane, made with the openssl command.

One CA signs everything: the API server's serving certificate, the client certificates the
components authenticate with (x509 client-cert auth: the CN is the user, each O a group), and
the Volcano webhook's serving certificate. Keys are EC P-256: openssl makes one in milliseconds,
where RSA 2048 takes a noticeable part of a start that must stay under a minute.

Identities:
  admin                 CN=trainmaster-admin, O=system:masters (the user's kubeconfig)
  controller-manager    CN=system:kube-controller-manager, the name its RBAC bootstrap role is
                        bound to; with --use-service-account-credentials each controller then
                        uses its own service account, as on kubeadm and EKS
  volcano, kwok         O=system:masters too: this control plane is for watching a job
                        gang-schedule, not for testing Volcano's or kwok's RBAC
"""

from __future__ import annotations

import base64
import subprocess
from pathlib import Path

import yaml

# The names a pod (or a test) may use to reach the API server, and the first address of the
# service range, which the API server gives the `kubernetes` Service. HOST_IP is the host's
# address that real nodes' pods route to (kube_hostnet.py): the API server advertises it when
# there are real nodes, so the `kubernetes` Service leads there.
SERVICE_CIDR = "10.96.0.0/16"
HOST_IP = "10.250.0.1"
APISERVER_SANS = (
    f"IP:127.0.0.1,IP:10.96.0.1,IP:{HOST_IP},DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,"
    "DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
)
CLIENTS = {
    "admin": "/O=system:masters/CN=trainmaster-admin",
    "controller-manager": "/CN=system:kube-controller-manager",
    "volcano": "/O=system:masters/CN=trainmaster-volcano",
    "kwok": "/O=system:masters/CN=trainmaster-kwok",
}
_EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def _leaf(pki: Path, name: str, subject: str, usage: str, sans: str | None = None) -> None:
    """A key and a certificate signed by the CA (`req -x509 -CA` is OpenSSL 3.0's one-step way)."""
    ext = [
        "-addext",
        "basicConstraints=critical,CA:FALSE",
        "-addext",
        "keyUsage=critical,digitalSignature,keyEncipherment",
        "-addext",
        f"extendedKeyUsage={usage}",
    ]
    if sans:
        ext += ["-addext", f"subjectAltName={sans}"]
    _openssl(
        "req",
        "-x509",
        *_EC,
        "-CA",
        str(pki / "ca.crt"),
        "-CAkey",
        str(pki / "ca.key"),
        "-days",
        "365",
        "-subj",
        subject,
        *ext,
        "-keyout",
        str(pki / f"{name}.key"),
        "-out",
        str(pki / f"{name}.crt"),
    )


def issue(pki: Path, name: str, subject: str, usage: str, sans: str | None = None) -> None:
    """PKI/NAME.crt and .key signed by the CA: a client (usage clientAuth) or server certificate
    made after make_pki (the real nodes' identities, kube_hostnet.make_certs)."""
    _leaf(pki, name, subject, usage, sans)
    (pki / f"{name}.key").chmod(0o600)


def make_pki(pki: Path) -> None:
    """Everything under PKI: ca, apiserver, webhook, one client pair per CLIENTS entry, and the
    service-account signing key pair (sa.key, sa.pub)."""
    pki.mkdir(parents=True, exist_ok=True)
    _openssl(
        "req",
        "-x509",
        *_EC,
        "-days",
        "3650",
        "-subj",
        "/CN=trainmaster-kube-ca",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
        "-keyout",
        str(pki / "ca.key"),
        "-out",
        str(pki / "ca.crt"),
    )
    _leaf(pki, "apiserver", "/CN=kube-apiserver", "serverAuth", APISERVER_SANS)
    _leaf(pki, "webhook", "/CN=volcano-admission", "serverAuth", "IP:127.0.0.1,DNS:localhost")
    for name, subject in CLIENTS.items():
        _leaf(pki, name, subject, "clientAuth")
    _openssl(
        "genpkey",
        "-algorithm",
        "EC",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-out",
        str(pki / "sa.key"),
    )
    _openssl("pkey", "-in", str(pki / "sa.key"), "-pubout", "-out", str(pki / "sa.pub"))
    for key in pki.glob("*.key"):
        key.chmod(0o600)


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def write_kubeconfig(path: Path, pki: Path, client: str, server: str) -> None:
    """A self-contained kubeconfig (certificates inline), so that it still works when copied."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "trainmaster-kube",
        "clusters": [
            {
                "name": "trainmaster-kube",
                "cluster": {"server": server, "certificate-authority-data": _b64(pki / "ca.crt")},
            }
        ],
        "users": [
            {
                "name": client,
                "user": {
                    "client-certificate-data": _b64(pki / f"{client}.crt"),
                    "client-key-data": _b64(pki / f"{client}.key"),
                },
            }
        ],
        "contexts": [
            {
                "name": "trainmaster-kube",
                "context": {"cluster": "trainmaster-kube", "user": client, "namespace": "default"},
            }
        ],
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
