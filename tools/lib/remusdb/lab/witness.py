"""The lab's etcd: the witness that settles split brain (docs/witness.md).

Members run in the rdb-witness namespace, member i on 10.77.0.(4+i):
clients on :2379, peers on :2380. One member is enough to exercise the
arbitration; three show what a real deployment does when one dies.

    data  /var/lib/remusdb/witness/<name>      (kept across stop/start)
    log   /run/remusdb/witness/<name>.log
    pid   /run/remusdb/witness/<name>.pid

The data belongs to one cluster shape: `members` in the data directory
records it, and starting with another count wipes the data first (a
member's old data would otherwise make it wait for peers that no longer
exist). Starting with the same count starts only what is not running, so
a member killed with kill_member() rejoins with its data.
"""
import contextlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from . import netns
from .. import paths

NAMESPACE = netns.HOSTS["witness"][0]
CLIENT_PORT = 2379
PEER_PORT = 2380
MEMBER_COUNTS = (1, 3)
CLUSTER_TOKEN = "remusdb-lab"
ETCD = "/usr/bin/etcd"
ETCDCTL = "/usr/bin/etcdctl"
HEALTH_TIMEOUT_S = 30
DEFAULT_ENDPOINTS = f"http://{netns.HOSTS['witness'][1]}:{CLIENT_PORT}"


def member_name(i):
    return f"witness{i}"


def member_address(i):
    return f"{netns.SUBNET_PREFIX}.{5 + i - 1}"


def client_url(i):
    return f"http://{member_address(i)}:{CLIENT_PORT}"


def peer_url(i):
    return f"http://{member_address(i)}:{PEER_PORT}"


def _state_dir():
    return paths.STATE / "witness"


def _run_dir():
    return paths.RUN / "witness"


def data_dir(i):
    return _state_dir() / member_name(i)


def log_path(i):
    return _run_dir() / f"{member_name(i)}.log"


def _pid_path(i):
    return _run_dir() / f"{member_name(i)}.pid"


def _shape_path():
    return _state_dir() / "members"


def configured_members():
    """The member count the data directories belong to (0: none)."""
    try:
        return int(_shape_path().read_text())
    except (OSError, ValueError):
        return 0


def _member_pid(i):
    """The pid of member i if that etcd is alive, else None. Checks the
    command line so a recycled pid is never taken for etcd."""
    try:
        pid = int(_pid_path(i).read_text())
        cmdline = (Path("/proc") / str(pid) / "cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return None
    # Right after the spawn it may still be `ip netns exec ... etcd ...`.
    if ETCD.encode() in cmdline and member_name(i).encode() in cmdline:
        return pid
    return None


def running_members():
    """Indexes (1-based) of the members whose etcd is alive."""
    return [i for i in range(1, max(MEMBER_COUNTS) + 1) if _member_pid(i)]


def endpoints():
    """Comma-separated client URLs of the running members ("" if none)."""
    return ",".join(client_url(i) for i in running_members())


def client_endpoints():
    """Where remusdbd and etcdctl reach the witness: the running members,
    else the address a one-member witness would have."""
    return endpoints() or DEFAULT_ENDPOINTS


def _all_endpoints(members):
    return ",".join(client_url(i) for i in range(1, members + 1))


def _ensure_addresses(members):
    for i in range(2, members + 1):
        netns.in_ns(NAMESPACE, "ip", "addr", "replace",
                    f"{member_address(i)}/{netns.PREFIX_LEN}", "dev", "eth0")


def _spawn(i, members):
    """Starts member i; returns its Popen (the previous log becomes .log.1)."""
    cluster = ",".join(f"{member_name(j)}={peer_url(j)}" for j in range(1, members + 1))
    data_dir(i).mkdir(parents=True, exist_ok=True)
    os.chmod(data_dir(i), 0o700)  # etcd insists
    _run_dir().mkdir(parents=True, exist_ok=True)
    if log_path(i).exists():
        log_path(i).replace(log_path(i).with_suffix(".log.1"))
    cmd = ["ip", "netns", "exec", NAMESPACE, ETCD,
           "--name", member_name(i), "--data-dir", str(data_dir(i)),
           "--listen-client-urls", client_url(i), "--advertise-client-urls", client_url(i),
           "--listen-peer-urls", peer_url(i), "--initial-advertise-peer-urls", peer_url(i),
           "--initial-cluster", cluster, "--initial-cluster-state", "new",
           "--initial-cluster-token", CLUSTER_TOKEN]
    with open(log_path(i), "wb") as log:
        # `ip netns exec` execs etcd, so this pid ends up being etcd's.
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                start_new_session=True)
    _pid_path(i).write_text(f"{proc.pid}\n")
    return proc


def _log_tail(i, lines=5):
    try:
        return "\n".join(log_path(i).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def wait_healthy(members, spawned=None, timeout=HEALTH_TIMEOUT_S):
    """Waits until `etcdctl endpoint health` is happy with every member.
    spawned: {i: Popen} of members just started, checked for an early
    exit (their pid is not etcd's until `ip netns exec` has exec'd it)."""
    spawned = spawned or {}
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        for i in range(1, members + 1):
            gone = spawned[i].poll() is not None if i in spawned else not _member_pid(i)
            if gone:
                raise SystemExit(f"etcd member {member_name(i)} exited; its log "
                                 f"{log_path(i)} ends with:\n{_log_tail(i)}")
        r = netns.in_ns(NAMESPACE, ETCDCTL, "--endpoints", _all_endpoints(members),
                        "--dial-timeout", "1s", "--command-timeout", "2s",
                        "endpoint", "health", check=False, capture=True)
        if r.returncode == 0:
            return
        last = (r.stdout + r.stderr).strip()
        time.sleep(0.3)
    raise SystemExit(f"etcd ({members} member(s)) not healthy after {timeout} s:\n{last}")


def start(members=1):
    """Runs `members` etcd members (1 or 3) and waits until all are
    healthy. A no-op when that cluster is already running."""
    if members not in MEMBER_COUNTS:
        raise SystemExit(f"the witness runs 1 or 3 etcd members, not {members}")
    for binary in (ETCD, ETCDCTL):
        if not os.access(binary, os.X_OK):
            raise SystemExit(f"{binary} is missing: run `make setup` (etcd-server, etcd-client)")
    if not netns.is_up():
        netns.up()  # idempotent: creates only what is missing
    if configured_members() != members:
        stop(wipe=True)
        _state_dir().mkdir(parents=True, exist_ok=True)
        _shape_path().write_text(f"{members}\n")
    _ensure_addresses(members)
    spawned = {i: _spawn(i, members) for i in range(1, members + 1) if not _member_pid(i)}
    wait_healthy(members, spawned)


def kill_member(i):
    """SIGKILLs member i (a crash, for tests); start() brings it back."""
    pid = _member_pid(i)
    if pid:
        _signal(pid, signal.SIGKILL)
        _wait_gone(pid, 5)


@contextlib.contextmanager
def stalled():
    """Every running member stopped (SIGSTOP) until the block ends: etcd
    that accepts connections but answers nothing, as one stuck in a slow
    fsync or a leader election does (for tests)."""
    pids = [pid for pid in map(_member_pid, running_members()) if pid]
    for pid in pids:
        _signal(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            _signal(pid, signal.SIGCONT)


def _signal(pid, sig):
    try:
        os.kill(pid, sig)
    except ProcessLookupError:  # it exited meanwhile
        pass


def _wait_gone(pid, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        # Our own child (started by this process) would linger as a zombie.
        try:
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return True
        except ChildProcessError:
            pass
        time.sleep(0.05)
    return False


def stop(wipe=False):
    """Stops every member; wipe=True also deletes the data (and, since
    the data is going anyway, kills instead of waiting for a clean exit)."""
    pids = [pid for pid in (_member_pid(i) for i in range(1, max(MEMBER_COUNTS) + 1)) if pid]
    for pid in pids:  # all at once: members leaving one by one lose quorum slowly
        _signal(pid, signal.SIGKILL if wipe else signal.SIGTERM)
    # A leader whose followers are gone waits ~7 s to hand over its
    # leadership; its WAL is synced per commit, so cutting that short
    # loses nothing.
    grace_end = time.monotonic() + 2
    for pid in pids:
        if not _wait_gone(pid, max(grace_end - time.monotonic(), 0)):
            _signal(pid, signal.SIGKILL)
            _wait_gone(pid, 5)
    for i in range(1, max(MEMBER_COUNTS) + 1):
        try:
            _pid_path(i).unlink()
        except FileNotFoundError:
            pass
    if wipe:
        shutil.rmtree(_state_dir(), ignore_errors=True)


def status():
    members = configured_members()
    if not members:
        return "witness  no etcd cluster (remusdb-lab witness up [--members 1|3])"
    lines = [f"witness  etcd, {members} member(s), data in {_state_dir()}"]
    for i in range(1, members + 1):
        pid = _member_pid(i)
        state = "absent"
        if pid:
            r = netns.in_ns(NAMESPACE, ETCDCTL, "--endpoints", client_url(i),
                            "--dial-timeout", "1s", "--command-timeout", "2s",
                            "endpoint", "health", check=False, capture=True)
            state = f"pid {pid}, " + ("healthy" if r.returncode == 0 else "UNHEALTHY")
        lines.append(f"  {member_name(i):9} {client_url(i):26} {state}")
    return "\n".join(lines)
