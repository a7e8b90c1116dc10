"""A real OpenSSH server on loopback, for tests: its own config, host key and client key pair.

    # tests/conftest.py registers this module as a plugin: name the fixture and it starts

    def test_x(loopback_sshd):
        nodes = loopback_sshd.nodes(2)       # SshNode for 127.0.0.1 and 127.0.0.2, same port and key
        loopback_sshd.run_ssh(nodes[0], "true")

"Two nodes" are this machine reached at two loopback addresses, 127.0.0.1 and 127.0.0.2 (the
whole 127/8 block is loopback on Linux): one sshd listens on both, so a job's node 0 and node 1
are two separate ssh sessions with distinct MASTER_ADDR-style addresses, on one host.

Everything lives under one temporary root made 0700 and owned by root, under /run (sshd's
StrictModes refuses an authorized_keys file below a group- or world-writable directory, such
as /tmp; where /run is not usable the root goes to /tmp and StrictModes is turned off):
sshd_config, an ed25519 host key, an ed25519 client key made on the fly, authorized_keys, the
pid file and the log. Nothing in /etc/ssh is read or touched. Root may log in by key only; no
PAM, no DNS lookups.

Needs root (sshd must run as root to switch to the user) and Debian's openssh-server and
openssh-client (scripts/apt-packages.txt); otherwise `unavailable_reason()` says why.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from megapilot.execute.process import free_port
from megapilot.execute.ssh import SshNode

SSHD = "/usr/sbin/sshd"
LOOPBACK_NODES = ("127.0.0.1", "127.0.0.2")
SAFE_PARENT = Path("/run")
START_TIMEOUT_S = 20.0


def unavailable_reason() -> str | None:
    """Why a loopback sshd cannot start here, or None if it can."""
    missing = [b for b in ("ssh", "ssh-keygen") if shutil.which(b) is None]
    if not Path(SSHD).exists():
        missing.append(SSHD)
    if missing:
        return f"OpenSSH binaries missing: {', '.join(missing)} (scripts/setup.sh installs them)"
    if os.geteuid() != 0:
        return "a loopback sshd needs root (it switches to the logged-in user)"
    return None


def _strict_modes_parent() -> Path | None:
    """A root-owned directory no one else may write to (with root-owned ancestors), or None."""
    try:
        info = SAFE_PARENT.stat()
    except OSError:
        return None
    if info.st_uid != 0 or info.st_mode & 0o022 or not os.access(SAFE_PARENT, os.W_OK):
        return None
    return SAFE_PARENT


def _make_root() -> Path:
    return Path(tempfile.mkdtemp(prefix="mpsshd-", dir=_strict_modes_parent() or "/tmp"))


@dataclass
class LoopbackSshd:
    """A running sshd on 127.0.0.1 and 127.0.0.2 that accepts this process's user with one key."""

    root: Path = field(default_factory=_make_root)
    port: int = field(default_factory=free_port)
    _process: subprocess.Popen | None = None

    @property
    def client_key(self) -> Path:
        return self.root / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.root / "known_hosts"

    @property
    def log_path(self) -> Path:
        return self.root / "sshd.log"

    def nodes(self, count: int = 2) -> list[SshNode]:
        """Nodes for the executor: the loopback addresses in turn, all on this server."""
        return [
            SshNode(host=LOOPBACK_NODES[i % len(LOOPBACK_NODES)], user="root", port=self.port,
                    identity_file=self.client_key,
                    options=(f"UserKnownHostsFile={self.known_hosts}", "StrictHostKeyChecking=yes",
                             "IdentitiesOnly=yes", "LogLevel=ERROR"))
            for i in range(count)
        ]

    def cluster_file(self, path: Path, hosts: tuple[str, ...] = LOOPBACK_NODES, **extra: object) -> Path:
        """A CVS cluster file for this server, the first host as head node (`extra`: more keys, e.g. env_vars)."""
        cluster = {
            "username": "root", "priv_key_file": str(self.client_key),
            "head_node_dict": {"mgmt_ip": hosts[0]},
            "node_dict": {host: {"bmc_ip": "NA", "vpc_ip": host} for host in hosts},
            "ssh_port": self.port,
            "ssh_options": [f"UserKnownHostsFile={self.known_hosts}", "StrictHostKeyChecking=yes",
                            "IdentitiesOnly=yes", "LogLevel=ERROR"],
            **extra,
        }
        path.write_text(json.dumps(cluster))
        return path

    # ---- lifecycle -------------------------------------------------------------------------
    def start(self) -> LoopbackSshd:
        """Start sshd and wait until it accepts the key; stop it again if it does not."""
        try:
            return self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> LoopbackSshd:
        os.chmod(self.root, 0o700)
        self._keygen(self.root / "host_ed25519", comment="megapilot-test-host")
        self._keygen(self.client_key, comment="megapilot-test-client")
        authorized = self.root / "authorized_keys"
        authorized.write_text(self.client_key.with_suffix(".pub").read_text())
        os.chmod(authorized, 0o600)
        host_key = (self.root / "host_ed25519.pub").read_text().split()
        self.known_hosts.write_text("".join(f"[{addr}]:{self.port} {host_key[0]} {host_key[1]}\n"
                                            for addr in LOOPBACK_NODES))
        config = self.root / "sshd_config"
        config.write_text("\n".join([
            f"Port {self.port}",
            *(f"ListenAddress {addr}" for addr in LOOPBACK_NODES),
            f"HostKey {self.root / 'host_ed25519'}",
            f"PidFile {self.root / 'sshd.pid'}",
            f"AuthorizedKeysFile {authorized}",
            "PermitRootLogin prohibit-password",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            "UseDNS no",
            f"StrictModes {'yes' if self.root.parent == SAFE_PARENT else 'no'}",
            "X11Forwarding no",
            "PrintMotd no",
            "MaxStartups 100:30:200",  # the tests open many short sessions at once
            "MaxSessions 100",
            "LogLevel VERBOSE",
            "",
        ]))
        # sshd insists on an absolute path and on its privilege-separation directory existing.
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        self._process = subprocess.Popen(
            [SSHD, "-D", "-e", "-f", str(config)], stdout=open(self.log_path, "wb"),  # noqa: SIM115  (sshd's log, open for its life)
            stderr=subprocess.STDOUT, start_new_session=True,
        )
        self._wait_until_ready()
        return self

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(timeout=5)
        self._process = None
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> LoopbackSshd:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- clients ---------------------------------------------------------------------------
    def run_ssh(self, node: SshNode, *remote_words: str, timeout_s: float = 30.0) -> subprocess.CompletedProcess:
        """Run a remote command through the system ssh client (the words are joined by the remote shell)."""
        return subprocess.run([*node.ssh_argv(), "--", *remote_words], capture_output=True, text=True,
                              timeout=timeout_s, stdin=subprocess.DEVNULL)

    def log_tail(self, lines: int = 30) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    # ---- internals -------------------------------------------------------------------------
    @staticmethod
    def _keygen(path: Path, comment: str) -> None:
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                       check=True, capture_output=True)

    def _wait_until_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        probe = self.nodes(len(LOOPBACK_NODES))
        while time.monotonic() < deadline:
            if self._process is not None and self._process.poll() is not None:
                raise RuntimeError(f"sshd exited with {self._process.returncode}\n{self.log_tail()}")
            if all(self.run_ssh(node, "true", timeout_s=10).returncode == 0 for node in probe):
                return
            time.sleep(0.2)
        raise RuntimeError(f"sshd not accepting the test key after {START_TIMEOUT_S} s\n{self.log_tail()}")


@pytest.fixture(scope="session")
def loopback_sshd():
    """A started loopback sshd for the whole session; skipped with the reason where it cannot start."""
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    server = LoopbackSshd().start()
    try:
        yield server
    finally:
        server.stop()
