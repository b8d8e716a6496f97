"""A real kube-apiserver and etcd on 127.0.0.1 for integration tests, after controller-runtime's
envtest: when ``KUBEBUILDER_ASSETS`` names a folder holding ``kube-apiserver`` and ``etcd``
binaries, `ControlPlane` starts them (private data folder, free ports, a self-signed serving
certificate, static token authentication, RBAC authorization) and writes kubeconfigs for an admin
and for shardsched's service account; `ControlPlane.stop` ends both processes and removes the
folder. No controller-manager and no kubelets run: nodes are plain objects and bound pods stay
Pending, which is all a scheduler needs. Without a kubelet and the node lifecycle controller, a
new node keeps the ``node.kubernetes.io/not-ready:NoSchedule`` taint that the API server's
TaintNodesByCondition admission puts on it: `shardsched.bench.serve_cluster.register_node` does
the kubelet's and the controller's part (reports Ready, puts back the node's own taints).

Tokens (``--token-auth-file``):

- ``admin``: user ``envtest-admin`` in ``system:masters``;
- ``scheduler``: user ``system:serviceaccount:<ns>:shardsched`` (RBAC treats it as that service
  account), so tests can bind ``deploy/rbac`` and check that it grants exactly enough.

The ServiceAccount admission plugin is disabled (no controller creates the ``default`` service
accounts pods would need).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
import ssl
from pathlib import Path

from shardsched.errors import PermanentError

SERVICE_ACCOUNT_NAMESPACE = "shardsched"
SERVICE_ACCOUNT = "shardsched"


def assets() -> tuple[Path | None, str]:
    """(folder, "") when ``KUBEBUILDER_ASSETS`` holds both binaries, else (None, why not)."""
    folder = os.environ.get("KUBEBUILDER_ASSETS")
    if not folder:
        return None, "KUBEBUILDER_ASSETS is not set (it must name a folder with kube-apiserver and etcd binaries)"
    path = Path(folder)
    missing = [b for b in ("kube-apiserver", "etcd") if not os.access(path / b, os.X_OK)]
    if missing:
        return None, f"KUBEBUILDER_ASSETS={folder} lacks executable {', '.join(missing)}"
    return path, ""


def _die_with_parent() -> None:
    """In the child before exec: ask Linux to SIGTERM it when the process that started it dies, so
    a killed test run leaves no kube-apiserver or etcd behind (no-op elsewhere)."""
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _self_signed(folder: Path) -> tuple[Path, Path]:
    """A self-signed serving certificate for 127.0.0.1/localhost and its RSA key (PEM files)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "envtest")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = folder / "serving.crt", folder / "serving.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                                           serialization.NoEncryption()))
    return cert_path, key_path


class ControlPlane:
    """etcd + kube-apiserver (module docstring).

    Args:
        folder: holds ``kube-apiserver`` and ``etcd`` (`assets`).
        start_timeout_s: how long to wait for each to become healthy.
    """

    def __init__(self, folder: Path, start_timeout_s: float = 60.0) -> None:
        self.folder = Path(folder)
        self.start_timeout_s = start_timeout_s
        self.dir: Path | None = None
        self.procs: list[subprocess.Popen] = []
        self.url = ""
        self.tokens = {"admin": "admin-" + os.urandom(8).hex(), "scheduler": "sched-" + os.urandom(8).hex()}
        self.ca_path: Path | None = None

    def version(self) -> tuple[int, int]:
        """(major, minor) that ``kube-apiserver --version`` prints (e.g. ``Kubernetes v1.30.2``).

        Raises: `PermanentError` when the binary does not run or prints something else.
        """
        out = subprocess.run([str(self.folder / "kube-apiserver"), "--version"], capture_output=True, text=True,
                             timeout=30).stdout
        m = re.search(r"v(\d+)\.(\d+)", out)
        if not m:
            raise PermanentError(f"{self.folder / 'kube-apiserver'} --version printed {out.strip()!r}")
        return int(m[1]), int(m[2])

    def _wait(self, url: str, proc: subprocess.Popen, log: Path, token: str | None = None) -> None:
        ctx = ssl.create_default_context(cafile=str(self.ca_path)) if url.startswith("https") else None
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise PermanentError(f"{Path(proc.args[0]).name} exited ({proc.returncode}): {log.read_text()[-2000:]}")
            try:
                req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
                with urllib.request.urlopen(req, timeout=2, context=ctx) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise PermanentError(f"{url} not healthy after {self.start_timeout_s:.0f} s: {log.read_text()[-2000:]}")

    def start(self) -> "ControlPlane":
        """Start etcd then kube-apiserver and wait until ``/readyz`` answers.

        Raises: `PermanentError` with the tail of the process's log when one fails to start.
        """
        self.dir = Path(tempfile.mkdtemp(prefix="envtest-"))
        self.ca_path, key = _self_signed(self.dir)
        etcd_port, peer_port, api_port = _free_port(), _free_port(), _free_port()
        etcd_log = self.dir / "etcd.log"
        etcd = subprocess.Popen(
            [str(self.folder / "etcd"), "--data-dir", str(self.dir / "etcd"), "--name", "envtest",
             "--listen-client-urls", f"http://127.0.0.1:{etcd_port}",
             "--advertise-client-urls", f"http://127.0.0.1:{etcd_port}",
             "--listen-peer-urls", f"http://127.0.0.1:{peer_port}",
             "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer_port}",
             "--initial-cluster", f"envtest=http://127.0.0.1:{peer_port}"],
            stdout=etcd_log.open("w"), stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
        self.procs.append(etcd)
        self._wait(f"http://127.0.0.1:{etcd_port}/health", etcd, etcd_log)
        tokens = self.dir / "tokens.csv"
        sa_user = f"system:serviceaccount:{SERVICE_ACCOUNT_NAMESPACE}:{SERVICE_ACCOUNT}"
        tokens.write_text(
            f'{self.tokens["admin"]},envtest-admin,admin-uid,"system:masters"\n'
            f'{self.tokens["scheduler"]},{sa_user},sched-uid,'
            f'"system:serviceaccounts,system:serviceaccounts:{SERVICE_ACCOUNT_NAMESPACE},system:authenticated"\n')
        self._api_args = [str(self.folder / "kube-apiserver"), f"--etcd-servers=http://127.0.0.1:{etcd_port}",
             "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={api_port}",
             f"--tls-cert-file={self.ca_path}", f"--tls-private-key-file={key}", f"--cert-dir={self.dir / 'certs'}",
             f"--token-auth-file={tokens}", "--authorization-mode=RBAC",
             f"--service-account-key-file={key}", f"--service-account-signing-key-file={key}",
             "--service-account-issuer=https://kubernetes.default.svc", "--service-cluster-ip-range=10.0.0.0/24",
             "--disable-admission-plugins=ServiceAccount", "--allow-privileged=true"]
        if self.version() < (1, 24):  # before 1.24 an insecure port (8080) is opened unless set to 0
            self._api_args.append("--insecure-port=0")
        self.url = f"https://127.0.0.1:{api_port}"
        self._start_apiserver()
        return self

    def _start_apiserver(self) -> None:
        api_log = self.dir / "kube-apiserver.log"
        api = subprocess.Popen(self._api_args, stdout=api_log.open("a"), stderr=subprocess.STDOUT,
                               preexec_fn=_die_with_parent)
        self.procs.append(api)
        self._wait(f"{self.url}/readyz", api, api_log, self.tokens["admin"])

    def restart_apiserver(self, down_s: float = 0.0) -> None:
        """Kill kube-apiserver (SIGKILL: open connections break, as when it crashes), wait
        ``down_s``, and start it again on the same port with the same etcd (nothing is lost).

        Raises: `PermanentError` when it does not become ready again.
        """
        api = self.procs.pop()
        api.kill()
        api.wait()
        time.sleep(down_s)
        self._start_apiserver()

    def kubeconfig(self, user: str = "admin") -> str:
        """Write a kubeconfig for ``user`` (``admin`` or ``scheduler``); returns its path."""
        import json

        path = self.dir / f"{user}.kubeconfig"
        doc = {"apiVersion": "v1", "kind": "Config", "current-context": "envtest",
               "clusters": [{"name": "envtest", "cluster": {"server": self.url, "certificate-authority": str(self.ca_path)}}],
               "users": [{"name": user, "user": {"token": self.tokens[user]}}],
               "contexts": [{"name": "envtest", "context": {"cluster": "envtest", "user": user}}]}
        path.write_text(json.dumps(doc))
        return str(path)

    def stop(self) -> None:
        """Stop kube-apiserver then etcd (SIGTERM, then SIGKILL after 10 s) and remove the folder."""
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self.procs.clear()
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def __enter__(self) -> "ControlPlane":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

