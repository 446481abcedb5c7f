"""A forked clone's new identity and role, through qemu-guest-agent.

The clone starts network-quarantined, so everything here goes through the
VM's qga socket (vm.vm_files(host, name)['qga']): files are written with
guest-file-*, the guest hook /usr/libexec/remusdb/remusdb-clone-identity is run
with guest-exec.  docs/fork.md has the hook's contract.

The parent side of role replica is a non-exclusive base backup whose
"copy" is the fork's atomic snapshot:

    conn = parent_connection(parent_ip, user, password)
    backup_start(conn)              # before the VM is paused and snapshotted
    ... pause, snapshot memory and disk, resume ...
    label = backup_stop(conn)       # same session, after the snapshot
    conn.close()
    make_replica(qga_path_of_clone, label, primary_host=parent_ip,
                 repl_user=user, repl_password=password,
                 mac=..., ip="192.0.2.21/24", hostname="db-c1")

The database user and password are the operator's (the cluster file's
`fork:` section, or remusdb fork's options): a role with REPLICATION
LOGIN and EXECUTE on pg_backup_start/pg_backup_stop (MariaDB: REPLICATION
SLAVE and RELOAD). Connections to the parent go through `connect_via`
(default: from this machine), a function that calls the connect function
it is given wherever the caller's clients reach the database LAN.
"""
import base64
from contextlib import closing
import ipaddress
import os
import re
import time

from .guest_agent import GuestAgent, GuestAgentError

HOOK = "/usr/libexec/remusdb/remusdb-clone-identity"
BACKUP_LABEL = "remusdb-fork"
# Under TCG a standby can take a while to replay up to the backup's end.
DEFAULT_TIMEOUT = 600


class CloneIdentityError(Exception):
    pass


def direct(connect, *args, **kwargs):
    """connect_via's default: the connection is made from here."""
    return connect(*args, **kwargs)


# ---------------------------------------------------------------- parent side

def parent_connection(host, user, password, dbname="postgres", connect_timeout=10,
                      connect_via=direct):
    """An autocommit session on the parent for backup_start/backup_stop (the
    backup belongs to this session: closing it aborts the backup)."""
    import psycopg2
    # As any client reaches the parent over the LAN.
    conn = connect_via(psycopg2.connect, host=host, user=user, password=password,
                       dbname=dbname, connect_timeout=connect_timeout)
    conn.autocommit = True
    return conn


def backup_start(conn, label=BACKUP_LABEL, fast=True):
    """pg_backup_start on the parent, BEFORE the snapshot: forces a checkpoint
    (fast) from which the clone's recovery will start; full-page writes are
    on until backup_stop. Returns the start LSN as text."""
    with conn.cursor() as cur:
        cur.execute("SELECT pg_backup_start(%s, %s)::text", (label, fast))
        return cur.fetchone()[0]


def backup_stop(conn):
    """pg_backup_stop(false) on the same session, AFTER the snapshot; returns
    the backup label text to give the clone (it writes the backup end
    record the standby must replay up to)."""
    with conn.cursor() as cur:
        cur.execute("SELECT labelfile, spcmapfile FROM pg_backup_stop(false)")
        labelfile, spcmapfile = cur.fetchone()
    if spcmapfile and spcmapfile.strip():
        raise CloneIdentityError("the parent has tablespaces (pg_backup_stop returned a "
                                 "tablespace map): not supported by the clone hook")
    return labelfile


# ---------------------------------------------------------------- guest side

def qga_path(host, vm_name):
    from .vm_layout import vm_files
    return vm_files(host, vm_name)["qga"]


def write_guest_file(ga, path, data):
    """Writes bytes to a file in the guest (created or truncated)."""
    handle = ga.command("guest-file-open", path=path, mode="w")
    try:
        ga.command("guest-file-write", handle=handle,
                   **{"buf-b64": base64.b64encode(data).decode()})
        ga.command("guest-file-flush", handle=handle)
    finally:
        ga.command("guest-file-close", handle=handle)


def connect_agent(qga, wait=60.0, agent_timeout=10.0):
    """A GuestAgent, retried for `wait` seconds: right after a boot (or a
    resume under load) the agent may not answer its first sync yet."""
    deadline = time.monotonic() + wait
    while True:
        try:
            return GuestAgent(qga, agent_timeout)
        except GuestAgentError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(1)


def run_hook(qga, args, timeout=DEFAULT_TIMEOUT, files=None, agent_timeout=10.0):
    """Runs the hook with `args` in the guest, after writing `files`
    ({guest path: bytes}, removed afterwards). Returns the hook's stdout;
    raises CloneIdentityError with its stderr if it fails or does not end
    within `timeout` seconds."""
    files = files or {}
    try:
        with closing(connect_agent(qga, agent_timeout=agent_timeout)) as ga:
            for path, data in files.items():
                write_guest_file(ga, path, data)
            # The hook's own waits end before ours: it reports which step
            # timed out rather than us killing it blind.
            pid = ga.exec_start(["/usr/bin/timeout", "-k", "5", str(int(timeout)), HOOK] + args)
            status = ga.wait_exec(pid, timeout + 15)
            if files:
                rm = ga.exec_start(["/bin/rm", "-f"] + list(files))
                ga.wait_exec(rm, 30)
    except GuestAgentError as e:
        raise CloneIdentityError(f"{HOOK}: {e}") from e
    if status["exitcode"] != 0 or status["signal"]:
        err = status["err"].strip() or status["out"].strip() or "(no output)"
        if status["exitcode"] == 124:
            err = f"timed out after {timeout} s; {err}"
        raise CloneIdentityError(f"{HOOK} failed (exit {status['exitcode']}"
                                 f"{', signal ' + str(status['signal']) if status['signal'] else ''}"
                                 f"): {err}")
    return status["out"]


def identity_args(mac=None, ip=None, hostname=None, dev=None, gw=None):
    args = []
    for opt, value in (("--mac", mac), ("--ip", ip), ("--hostname", hostname),
                       ("--dev", dev), ("--gw", gw)):
        if value:
            args += [opt, value]
    return args


def with_prefix(ip, prefix_len=None):
    """ADDR/PREFIX for the hook: ip as it is if it has one, else with
    prefix_len, else with the cluster file's fork.prefix_len."""
    if "/" in ip:
        return ip
    if prefix_len is None:
        from . import cluster
        c = cluster.current()
        prefix_len = c.fork.prefix_len
        if prefix_len is None:
            raise CloneIdentityError(f"{ip} has no /PREFIX and {c.path} names no "
                                     f"fork: prefix_len")
    return f"{ip}/{prefix_len}"


def set_identity(qga, mac=None, ip=None, hostname=None, timeout=120, prefix_len=None, **kw):
    """New MAC, address (ADDR or ADDR/PREFIX) and hostname; PostgreSQL is
    left alone."""
    return run_hook(qga, identity_args(mac, ip and with_prefix(ip, prefix_len), hostname, **kw),
                    timeout=timeout)


def make_replica(qga, label, primary_host, *, repl_user, repl_password, primary_port=5432,
                 slot=None, mac=None, ip=None, hostname=None, timeout=DEFAULT_TIMEOUT,
                 prefix_len=None, **kw):
    """New identity, then the clone's PostgreSQL becomes a hot standby of
    primary_host from the backup label `label` (backup_stop's). Returns when
    it accepts read-only connections."""
    tag = os.urandom(4).hex()
    label_path = f"/run/remusdb-clone-{tag}.label"
    pw_path = f"/run/remusdb-clone-{tag}.pw"
    args = identity_args(mac, ip and with_prefix(ip, prefix_len), hostname, **kw) + [
        "--role", "replica", "--primary-host", primary_host,
        "--primary-port", str(primary_port), "--repl-user", repl_user,
        "--repl-password-file", pw_path, "--backup-label-file", label_path,
        "--wait-timeout", str(max(30, int(timeout) - 30))]
    if slot:
        args += ["--slot", slot]
    return run_hook(qga, args, timeout=timeout,
                    files={label_path: label.encode(), pw_path: repl_password.encode() + b"\n"})


def make_copy(qga, mac=None, ip=None, hostname=None, timeout=DEFAULT_TIMEOUT, prefix_len=None,
              **kw):
    """New identity, then the clone's PostgreSQL becomes an independent
    primary with a new system_identifier."""
    args = identity_args(mac, ip and with_prefix(ip, prefix_len), hostname, **kw) + [
        "--role", "copy", "--wait-timeout", str(max(30, int(timeout) - 30))]
    return run_hook(qga, args, timeout=timeout)


def wait_replica_caught_up(standby_conn, primary_conn, timeout=300, poll=1.0):
    """Waits until the standby has replayed the primary's current WAL
    position (taken once, at the call). Returns (target, replayed) LSNs."""
    with primary_conn.cursor() as cur:
        cur.execute("SELECT pg_current_wal_lsn()::text")
        target = cur.fetchone()[0]
    deadline = time.monotonic() + timeout
    while True:
        with standby_conn.cursor() as cur:
            cur.execute("SELECT pg_last_wal_replay_lsn()::text, "
                        "pg_last_wal_replay_lsn() >= %s::pg_lsn", (target,))
            replayed, done = cur.fetchone()
        if done:
            return target, replayed
        if time.monotonic() > deadline:
            raise CloneIdentityError(f"standby replayed up to {replayed}, not {target}, "
                                     f"within {timeout} s")
        time.sleep(poll)


# ---------------------------------------------------------------- MariaDB
# A MariaDB clone becomes a GTID replica in two hook runs with a check
# between them (docs/fork.md, "MariaDB"):
#
#    out = make_mariadb_replica(clone_qga, parent_qga, primary_host=parent_ip,
#                               server_id=server_id_for(clone_ip), repl_user=user,
#                               repl_password=password, mac=..., ...)
#
# The clone's mariadbd ran on from the parent's state for a moment before
# the hook killed it; any commit it made in that moment is in its binlog.
# Its binlog must be a prefix of the parent's, byte for byte, or its GTID
# position names transactions the parent has in another order, or not at
# all, and replication from that position would diverge silently.

MARIADB_DATA = "/var/lib/mysql"
BINLOG_NAME = re.compile(r"^mariadb-bin\.[0-9]{6,}$")

# For each NAME SIZE pair: NAME, the parent's file size (-1: no such file)
# and the SHA-256 of its first SIZE bytes.
_PARENT_BINLOG_SCRIPT = (
    'cd "$0" || exit 1; while [ $# -gt 1 ]; do '
    's=$(stat -c %s "$1" 2>/dev/null || echo -1); '
    'h=$(head -c "$2" "$1" 2>/dev/null | sha256sum | cut -d" " -f1); '
    'echo "$1 $s $h"; shift 2; done')


def mariadb_block_commits(host, user, password, connect_via=direct):
    """BACKUP STAGE up to BLOCK_COMMIT on the parent, BEFORE the snapshot: no
    commit and no binlog write until mariadb_unblock_commits. The clones
    inherit this session still holding the lock, so their mariadbd cannot
    commit either until the hook kills it: the window is empty, and the
    binlog check passes under load. Returns the session."""
    import pymysql
    conn = connect_via(pymysql.connect, host=host, user=user, password=password,
                       connect_timeout=10, read_timeout=120, autocommit=True)
    with conn.cursor() as cur:
        for stage in ("START", "FLUSH", "BLOCK_DDL", "BLOCK_COMMIT"):
            cur.execute(f"BACKUP STAGE {stage}")
    return conn


def mariadb_unblock_commits(conn):
    """BACKUP STAGE END on the same session, AFTER the snapshot."""
    try:
        with conn.cursor() as cur:
            cur.execute("BACKUP STAGE END")
    finally:
        conn.close()


def server_id_for(ip):
    """A clone's server_id: its IPv4 address as a number (unique on its
    LAN; the image's parent is server 1, which no usable address gives)."""
    return int(ipaddress.IPv4Address(ip.split("/")[0]))


def hook_lines(out, key):
    """The values of the hook's `remusdb-clone-identity: KEY: ...` lines."""
    prefix = f"remusdb-clone-identity: {key}: "
    return [line[len(prefix):] for line in out.splitlines() if line.startswith(prefix)]


def parse_binlog_manifest(out):
    """[(name, size, sha256)] from the prepare run's `binlog:` lines."""
    files = []
    for v in hook_lines(out, "binlog"):
        name, size, sha = v.split()
        if not BINLOG_NAME.match(name):
            raise CloneIdentityError(f"the clone reported an odd binlog name {name!r}")
        files.append((name, int(size), sha))
    if not files:
        raise CloneIdentityError("the clone reported no binlog file")
    return files


def parent_binlog_prefixes(parent_qga, files, timeout=120):
    """{name: (parent's size, sha256 of its first `size` bytes)}, read in the
    parent through its guest agent."""
    args = []
    for name, size, _ in files:
        args += [name, str(size)]
    r = run_guest(parent_qga, ["/bin/sh", "-c", _PARENT_BINLOG_SCRIPT, MARIADB_DATA] + args,
                  timeout)
    out = {}
    for line in r.splitlines():
        name, psize, sha = line.split()
        out[name] = (int(psize), sha)
    return out


def binlog_divergence(clone_files, parent):
    """None if every clone binlog file is a byte prefix of the parent's file
    of the same name, else where it is not (one phrase)."""
    for name, size, sha in clone_files:
        psize, psha = parent.get(name, (-1, ""))
        if psize < 0:
            return f"{name} (the parent has no such file)"
        if psize < size:
            return f"{name} byte {psize} (the clone has {size} bytes, the parent {psize})"
        if psha != sha:
            return f"{name} within its first {size} bytes"
    return None


def check_binlog_prefix(clone_files, parent_qga):
    where = binlog_divergence(clone_files, parent_binlog_prefixes(parent_qga, clone_files))
    if where:
        raise CloneIdentityError(f"the clone's binlog diverged from the parent's at {where}; "
                                 f"fork again")


def run_guest(qga, argv, timeout):
    from . import guest_agent
    try:
        r = guest_agent.run(qga, argv, timeout)
    except GuestAgentError as e:
        raise CloneIdentityError(f"{argv[0]} in the guest: {e}") from e
    if r["exitcode"] != 0:
        raise CloneIdentityError(f"{argv[0]} in the guest failed (exit {r['exitcode']}): "
                                 f"{r['err'].strip()}")
    return r["out"]


def make_mariadb_replica(qga, parent_qga, primary_host, server_id, *, repl_user,
                         repl_password, primary_port=3306, mac=None, ip=None, hostname=None,
                         timeout=DEFAULT_TIMEOUT, check_divergence=True, prefix_len=None,
                         **kw):
    """New identity; the clone's MariaDB killed, restarted read-only as
    server `server_id`, checked against the parent's binlog (through
    parent_qga), then replicating from primary_host by GTID. Returns the
    hooks' output. check_divergence=False is for the negative control."""
    tag = os.urandom(4).hex()
    pw_path = f"/run/remusdb-clone-{tag}.pw"
    wait = ["--wait-timeout", str(max(30, int(timeout) - 30))]
    args = identity_args(mac, ip and with_prefix(ip, prefix_len), hostname, **kw) + [
        "--dbms", "mariadb", "--role", "replica", "--phase", "prepare",
        "--server-id", str(server_id), "--primary-host", primary_host,
        "--primary-port", str(primary_port), "--repl-user", repl_user,
        "--repl-password-file", pw_path] + wait
    out = run_hook(qga, args, timeout=timeout,
                   files={pw_path: repl_password.encode() + b"\n"})
    if check_divergence:
        check_binlog_prefix(parse_binlog_manifest(out), parent_qga)
    return out + run_hook(qga, ["--dbms", "mariadb", "--role", "replica", "--phase", "start"]
                          + wait, timeout=timeout)


def make_mariadb_copy(qga, server_id, mac=None, ip=None, hostname=None,
                      timeout=DEFAULT_TIMEOUT, prefix_len=None, **kw):
    """New identity; the clone's MariaDB an independent read-write primary,
    server `server_id`, its binlog going on from the parent's."""
    args = identity_args(mac, ip and with_prefix(ip, prefix_len), hostname, **kw) + [
        "--dbms", "mariadb", "--role", "copy", "--server-id", str(server_id),
        "--wait-timeout", str(max(30, int(timeout) - 30))]
    return run_hook(qga, args, timeout=timeout)
