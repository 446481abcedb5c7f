"""A forked clone's new identity and role, through qemu-guest-agent.

The clone starts network-quarantined, so everything here goes through the
VM's qga socket (vm.vm_files(host, name)['qga']): files are written with
guest-file-*, the guest hook /usr/local/sbin/remusdb-clone-identity is run
with guest-exec.  docs/fork.md has the hook's contract.

The parent side of role replica is a non-exclusive base backup whose
"copy" is the fork's atomic snapshot:

    conn = parent_connection(parent_ip)
    backup_start(conn)              # before the VM is paused and snapshotted
    ... pause, snapshot memory and disk, resume ...
    label = backup_stop(conn)       # same session, after the snapshot
    conn.close()
    make_replica(qga_path_of_clone, label, primary_host=parent_ip,
                 mac=..., ip="10.77.0.21/24", hostname="db-c1")
"""
import base64
from contextlib import closing
import os
import time

from . import netns
from .guest_agent import GuestAgent, GuestAgentError

HOOK = "/usr/local/sbin/remusdb-clone-identity"
# The lab's replication role (tools/guest/customize.sh): REPLICATION LOGIN,
# and EXECUTE on pg_backup_start/pg_backup_stop.
REPL_USER = "replicator"
REPL_PASSWORD = "replicator"
BACKUP_LABEL = "remusdb-fork"
# Under TCG a standby can take a while to replay up to the backup's end.
DEFAULT_TIMEOUT = 600


class CloneIdentityError(Exception):
    pass


# ---------------------------------------------------------------- parent side

def parent_connection(host, user=REPL_USER, password=REPL_PASSWORD, dbname="postgres",
                      connect_timeout=10):
    """An autocommit session on the parent for backup_start/backup_stop (the
    backup belongs to this session: closing it aborts the backup)."""
    import psycopg2
    # From the client host, as any client reaches the parent over the LAN.
    conn = netns.call_in("rdb-client", psycopg2.connect, host=host, user=user,
                         password=password, dbname=dbname, connect_timeout=connect_timeout)
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
    from . import vm
    return vm.vm_files(host, vm_name)["qga"]


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


def with_prefix(ip):
    return ip if "/" in ip else f"{ip}/{netns.PREFIX_LEN}"


def set_identity(qga, mac=None, ip=None, hostname=None, timeout=120, **kw):
    """New MAC, address (ADDR or ADDR/PREFIX) and hostname; PostgreSQL is
    left alone."""
    return run_hook(qga, identity_args(mac, ip and with_prefix(ip), hostname, **kw),
                    timeout=timeout)


def make_replica(qga, label, primary_host, primary_port=5432, repl_user=REPL_USER,
                 repl_password=REPL_PASSWORD, slot=None, mac=None, ip=None,
                 hostname=None, timeout=DEFAULT_TIMEOUT, **kw):
    """New identity, then the clone's PostgreSQL becomes a hot standby of
    primary_host from the backup label `label` (backup_stop's). Returns when
    it accepts read-only connections."""
    tag = os.urandom(4).hex()
    label_path = f"/run/remusdb-clone-{tag}.label"
    pw_path = f"/run/remusdb-clone-{tag}.pw"
    args = identity_args(mac, ip and with_prefix(ip), hostname, **kw) + [
        "--role", "replica", "--primary-host", primary_host,
        "--primary-port", str(primary_port), "--repl-user", repl_user,
        "--repl-password-file", pw_path, "--backup-label-file", label_path,
        "--wait-timeout", str(max(30, int(timeout) - 30))]
    if slot:
        args += ["--slot", slot]
    return run_hook(qga, args, timeout=timeout,
                    files={label_path: label.encode(), pw_path: repl_password.encode() + b"\n"})


def make_copy(qga, mac=None, ip=None, hostname=None, timeout=DEFAULT_TIMEOUT, **kw):
    """New identity, then the clone's PostgreSQL becomes an independent
    primary with a new system_identifier."""
    args = identity_args(mac, ip and with_prefix(ip), hostname, **kw) + [
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
