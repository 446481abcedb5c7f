"""An sshd in each VM host's namespace, so that the lab reaches a host's
remusdbd the way an operator's CLI reaches a real one: `ssh root@HOST
remusdb control-relay` (remusdb.cluster). Everything is the lab's own,
under RUN/lab/ssh: one host key per host, one client key, the
authorized_keys and known_hosts files naming just those, and one sshd
configuration per host listening on the host's LAN address only. The
system's sshd configuration, keys and root's ~/.ssh are not touched.
netns.down() ends these sshd processes with everything else in the
namespaces."""
from pathlib import Path
import shutil
import subprocess
import time

from .. import paths
from . import netns

SSHD = Path("/usr/sbin/sshd")
PORT = 22


def ssh_dir():
    return paths.RUN / "lab" / "ssh"


def client_key():
    return ssh_dir() / "client_key"


def known_hosts():
    return ssh_dir() / "known_hosts"


def _keygen(path, comment):
    if not path.exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment,
                        "-f", str(path)], check=True)


def _config(host, address):
    d = ssh_dir()
    return "\n".join([
        "# written by remusdb.lab.sshd: the lab host's sshd (its namespace only)",
        f"ListenAddress {address}:{PORT}",
        f"HostKey {d / f'host_key_{host}'}",
        f"PidFile {d / f'sshd-{host}.pid'}",
        f"AuthorizedKeysFile {d / 'authorized_keys'}",
        "PermitRootLogin prohibit-password",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "UsePAM no",
        "PrintMotd no",
        "X11Forwarding no",
        "AllowTcpForwarding no",
        "LogLevel ERROR",
        "",
    ])


def _running(host):
    """The pid of host's sshd while it runs (not another process that got
    its pid after a lab went down)."""
    try:
        pid = int((ssh_dir() / f"sshd-{host}.pid").read_text())
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return pid if f"sshd_config_{host}".encode() in f.read() else None
    except (OSError, ValueError):
        return None


def start():
    """Starts an sshd in every VM host's namespace (a running one stays).
    Returns {host: address} of the hosts that have one."""
    if not SSHD.exists():
        raise SystemExit(f"{SSHD} is missing: run `make deps` (installs openssh-server)")
    d = ssh_dir()
    d.mkdir(parents=True, exist_ok=True)
    d.chmod(0o700)
    # sshd's privilege separation directory, which Debian's service makes.
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    _keygen(client_key(), "remusdb-lab-client")
    shutil.copyfile(client_key().with_suffix(".pub"), d / "authorized_keys")
    known, started = [], {}
    for host in netns.VM_HOSTS:
        ns, address, _ = netns.HOSTS[host]
        key = d / f"host_key_{host}"
        _keygen(key, f"remusdb-lab-{host}")
        known.append(f"{address} {key.with_suffix('.pub').read_text().strip()}")
        conf = d / f"sshd_config_{host}"
        conf.write_text(_config(host, address))
        if not _running(host):
            netns.in_ns(ns, str(SSHD), "-f", str(conf))
        started[host] = address
    known_hosts().write_text("\n".join(known) + "\n")
    deadline = time.monotonic() + 10
    while not all(_running(h) for h in started):
        if time.monotonic() > deadline:
            raise SystemExit(f"the lab's sshd did not start in {', '.join(started)}; "
                             f"try `{SSHD} -t -f {d}/sshd_config_HOST`")
        time.sleep(0.05)
    return started
