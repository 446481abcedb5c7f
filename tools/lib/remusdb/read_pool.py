"""The read pool: HAProxy spreading new client connections over forked
clones (read-only hot standbys), on this machine or on a Site (a host
reached through an argv prefix, e.g. a host's exec_prefix of the
cluster file).

    start("reads", [("dbc1", "192.0.2.21"), ("dbc2", "192.0.2.22")])  # fork.py names the clones of db dbcN
    # clients: psql -h THIS-MACHINE -p 5433 ...
    update("reads", [...])     # clones added/removed: seamless reload (-sf)
    server_states("reads")     # {"dbc1": "UP", "dbc2": "DOWN"}
    stop("reads")

TCP mode, roundrobin, one connection = one backend for its life. Health
check: `option pgsql-check user bench` (a startup packet; a server that
answers with an authentication request is up, one that answers with an
error, e.g. "the database system is starting up" before the standby is
consistent, is down), or a plain TCP connect (check="tcp").
docs/fork.md ("Read pool") has the design.
"""
import csv
import io
import os
from pathlib import Path
import signal
import socket
import subprocess
import time

from dataclasses import dataclass

from . import paths

DEFAULT_PORT = 5433
HAPROXY = "/usr/sbin/haproxy"


class ReadPoolError(Exception):
    pass


@dataclass(frozen=True)
class Site:
    """Where a pool's HAProxy runs: `name` names its directory (RUN/NAME/
    read-pool-POOL), `exec_prefix` runs HAProxy there, `address` is where
    clients connect (None: this machine's host name)."""
    name: str = "local"
    exec_prefix: tuple = ()
    address: str = None


LOCAL = Site()


def pool_dir(name, site=LOCAL):
    return paths.host_run_dir(site.name) / f"read-pool-{name}"


def config_text(name, backends, port=DEFAULT_PORT, check="pgsql", check_user="bench",
                stats_socket=None):
    """HAProxy configuration for `backends`: [(server name, ip[, port])]."""
    if check not in ("pgsql", "tcp"):
        raise ValueError("check must be 'pgsql' or 'tcp'")
    lines = [
        "# written by remusdb read_pool.py: the forked clones' read pool",
        "global",
        "    maxconn 1024",
    ]
    if stats_socket:
        lines.append(f"    stats socket {stats_socket} mode 600 level admin")
    lines += [
        "defaults",
        "    mode tcp",
        "    timeout connect 5s",
        # Database sessions may sit idle for long: do not cut them.
        "    timeout client 1h",
        "    timeout server 1h",
        "    timeout check 3s",
        "",
        f"listen {name}",
        f"    bind *:{port}",
        "    balance roundrobin",
        # A clone that goes down: its sessions are cut at once (clients
        # reconnect to another), not left hanging until `timeout server`.
        # Right for clones only: a protected primary's sessions survive its
        # host's failure (the backup runs the VM with the same connections),
        # and a backend in front of one must not cut them
        # (docs/operations.md, "HAProxy").
        "    option redispatch",
        "    default-server inter 2s fall 2 rise 1 on-marked-down shutdown-sessions",
    ]
    if check == "pgsql":
        lines.append(f"    option pgsql-check user {check_user}")
    else:
        lines.append("    option tcp-check")
    for backend in backends:
        server, ip = backend[0], backend[1]
        bport = backend[2] if len(backend) > 2 else 5432
        lines.append(f"    server {server} {ip}:{bport} check")
    if not backends:
        # HAProxy accepts a listen section without servers; connections are
        # refused until clones are added.
        lines.append("    # no clones yet")
    return "\n".join(lines) + "\n"


def _pid(name, site):
    try:
        pid = int((pool_dir(name, site) / "haproxy.pid").read_text().split()[0])
        os.kill(pid, 0)
        return pid
    except (OSError, ValueError, IndexError):
        return None


def _launch(name, backends, site, port, check, check_user, replace_pid=None):
    if not Path(HAPROXY).exists():
        raise ReadPoolError(f"{HAPROXY} is missing: run `make deps` (installs haproxy)")
    d = pool_dir(name, site)
    d.mkdir(parents=True, exist_ok=True)
    cfg = d / "haproxy.cfg"
    stats = d / "stats.sock"
    cfg.write_text(config_text(name, backends, port, check, check_user, stats_socket=stats))
    r = subprocess.run([HAPROXY, "-c", "-q", "-f", str(cfg)], capture_output=True, text=True)
    if r.returncode != 0:
        raise ReadPoolError(f"haproxy rejects {cfg}: {(r.stderr or r.stdout).strip()}")
    pid_file = d / "haproxy.pid"
    cmd = [*site.exec_prefix, HAPROXY, "-D", "-f", str(cfg), "-p", str(pid_file)]
    if replace_pid:
        cmd += ["-sf", str(replace_pid)]
    with open(d / "haproxy.log", "ab") as log:
        r = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    if r.returncode != 0:
        raise ReadPoolError(f"haproxy did not start (exit {r.returncode}); see {d / 'haproxy.log'}")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        pid = _pid(name, site)
        if pid and pid != replace_pid and stats.exists():
            return {"name": name, "site": site.name, "pid": pid, "port": port,
                    "address": site.address or socket.gethostname(), "config": str(cfg)}
        time.sleep(0.1)
    raise ReadPoolError(f"haproxy for {name} did not come up; see {d / 'haproxy.log'}")


def start(name, backends, site=LOCAL, port=DEFAULT_PORT, check="pgsql",
          check_user="bench"):
    """Starts the pool `name` on `site`; returns where clients
    connect ({address, port, pid, ...})."""
    if _pid(name, site):
        raise ReadPoolError(f"read pool {name} already runs on {site.name}: update() or stop() it")
    return _launch(name, backends, site, port, check, check_user)


def update(name, backends, site=LOCAL, port=DEFAULT_PORT, check="pgsql",
           check_user="bench"):
    """New backend list: a new HAProxy takes over the listener and the old
    one finishes its sessions (-sf). Starts the pool if it was not running."""
    return _launch(name, backends, site, port, check, check_user, replace_pid=_pid(name, site))


def stop(name, site=LOCAL, timeout=10):
    pid = _pid(name, site)
    if pid:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while _pid(name, site) == pid and time.monotonic() < deadline:
            time.sleep(0.05)
        if _pid(name, site) == pid:
            os.kill(pid, signal.SIGKILL)
    for f in ("haproxy.pid", "stats.sock"):
        try:
            (pool_dir(name, site) / f).unlink()
        except FileNotFoundError:
            pass


def _stats_command(name, site, command):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(5)
    try:
        sock.connect(str(pool_dir(name, site) / "stats.sock"))
        sock.sendall(command.encode() + b"\n")
        chunks = []
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    except OSError as e:
        raise ReadPoolError(f"read pool {name}: stats socket: {e}")
    finally:
        sock.close()
    return b"".join(chunks).decode()


def server_states(name, site=LOCAL):
    """{server: status} from HAProxy ("UP", "DOWN", "no check", ...)."""
    text = _stats_command(name, site, "show stat").lstrip("# ")
    states = {}
    for row in csv.DictReader(io.StringIO(text)):
        if row.get("pxname") == name and row.get("svname") not in ("FRONTEND", "BACKEND"):
            states[row["svname"]] = row["status"]
    return states


def wait_up(name, servers, site=LOCAL, timeout=60):
    """Waits until every named server is UP in HAProxy's checks."""
    deadline = time.monotonic() + timeout
    while True:
        states = server_states(name, site)
        if all(states.get(s) == "UP" for s in servers):
            return states
        if time.monotonic() > deadline:
            raise ReadPoolError(f"read pool {name}: not all of {servers} UP within {timeout} s: {states}")
        time.sleep(0.5)
