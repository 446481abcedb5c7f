"""`remusdb fork`: clone a running database VM into N serving clones
(FlurryDB on QEMU; docs/fork.md).

For each fork:
  0. the DBMS: --dbms, or the one running in the parent (asked through
     its guest agent);
  1. role replica, PostgreSQL: pg_backup_start on the parent (its session
     stays open);
  1b. role replica, MariaDB: BACKUP STAGE BLOCK_COMMIT on the parent (its
     session stays open): no commit on the parent during the snapshot, and
     none in the clones until their hooks kill mariadbd;
  2. remusdbd on the parent's host migrates the parent into its page
     source, freezes the parent's disk and resumes the parent
     (`fork-start`); a protected parent is not touched: remusdbd on its
     backup forks its own committed image and disk replica instead;
  3. role replica, PostgreSQL: pg_backup_stop on the same session: the
     backup label the clones recover from; MariaDB: BACKUP STAGE END (a
     clone replicates from its own binlog's GTID position, once its binlog
     is checked to be a prefix of the parent's);
  4. per clone, on its host: a qcow2 overlay backed by the frozen disk over
     NBD, remusdbd given the clone (`vm-add` with `clone_of`: its NIC starts
     quarantined, its postcopy resume is watched), QEMU started with
     `-incoming defer` and `postcopy-ram`, then the page source told to
     serve it (`fork-serve`): the clone runs at once and pulls its pages;
  5. through qemu-guest-agent, the guest hook gives the clone a new MAC,
     address and hostname and its role (clone_identity.py);
  6. only then is the clone let onto the LAN (`vm-release`), and its first
     read query is timed, asked as a client would.

Every step is timed from the fork's start; the clone's pages and the disk
bytes it read come from remusdbd's status, never estimated here.

What fork knows of the cluster comes from the cluster file (remusdb.cluster):
the hosts (a clone's host must share the files of the machine fork runs
on: control `via: local`; its QEMU is started through the host's
exec_prefix), the guests' bridge, the clones' addresses and prefix length, and the database role
the parent side and the clones' replication use (`fork:` db_user,
db_password_file; remusdb fork's --db-user and --db-password-file win).
Connections to the databases (the parent's backup session, each clone's
first query) are made through `connect_via` (clone_identity.direct: from
this machine), so a caller whose clients sit elsewhere says where.

A parent on a host reached through ssh is forked there: `remusdb fork`
runs itself on that host (remusdb.remote_verb; parent_host_of finds the
host), where the parent's files are; its clones then go on hosts that
share that host's files. Clones on a host reached through ssh from a
parent whose files are here cannot work (local_host says so): the
clone's QEMU is started, and its overlay and run directory written, by
the machine that holds the parent's command line and guest agent.
"""
import json
import subprocess
import threading
import time
from functools import partial
import xml.etree.ElementTree as ET

from . import clone_identity, cluster, control, guest_agent, libvirt, output, paths, protection
from .clone_identity import direct
from .libvirt_hook import wired_to_remusdbd
from .qmp import QMP, QMPError, wait_for_socket
from .vm_layout import check_name, mac_for, running_pid, stop_qemu, vm_files

CLONE_PORT_BASE = 4700
SNAPSHOT_TIMEOUT = 300
CLONE_RUN_TIMEOUT = 60
DBMS = ("postgresql", "mariadb")
# The server processes that tell which DBMS a parent runs.
DBMS_PROCESS = {"postgresql": "postgres", "mariadb": "mariadbd"}


class ForkError(Exception):
    pass


say = partial(output.say, "remusdb-fork", err=True)


def cluster_hosts():
    try:
        return cluster.current().names()
    except cluster.ClusterError as e:
        raise ForkError(" ".join(e.problems))


def local_host(host):
    """The cluster host `host`, which must share this machine's files
    (control via local): fork writes the clone's run directory and
    overlay and starts its QEMU from here."""
    try:
        h = cluster.current().host(host)
    except cluster.ClusterError as e:
        raise ForkError(" ".join(e.problems))
    if h.control.via != "local":
        raise ForkError(f"{host} is reached through ssh from the parent's host: its clones "
                        f"are started from the host the parent runs on, so they go on that "
                        f"host or one sharing its files (`via: local` in its cluster file); "
                        f"give --hosts naming such hosts, or fork a parent running on {host}")
    return h


def ask(host, cmd, **fields):
    """control.request to cluster host `host`'s remusdbd."""
    return control.request_via(local_host(host).control, cmd, **fields)


def credentials(user=None, password=None):
    """The database role fork uses (user, password): the ones given, else
    the cluster file's fork.db_user and the first line of its
    fork.db_password_file."""
    f = cluster.current().fork if (user is None or password is None) else None
    user = user or (f and f.db_user)
    if password is None and f and f.db_password_file:
        try:
            with open(f.db_password_file, encoding="utf-8") as pw:
                password = pw.readline().rstrip("\r\n")
        except OSError as e:
            raise ForkError(f"cannot read the database password file "
                            f"{f.db_password_file}: {e.strerror}")
    if not user or password is None:
        raise ForkError("fork needs the database role it works as: --db-user and "
                        "--db-password-file, or `fork: {db_user: ..., db_password_file: "
                        "...}` in the cluster file")
    return user, password


def parent_host_of(parent, libvirt_uri=None):
    """The host of the cluster the parent runs on: one whose files this
    machine shares (its vm.json and QEMU, or for a libvirt domain its
    remusdbd), else one reached through ssh whose remusdbd runs it (one
    ssh login per such host, asked only when no local host runs it)."""
    local = [h for h in cluster_hosts() if cluster.current().hosts[h].control.via == "local"]
    if libvirt_uri is None:
        for host in local:
            if running_pid(vm_files(host, parent)):
                return host
    remote = [h for h in cluster_hosts() if h not in local]
    found, unreachable = [], []
    for host in (local if libvirt_uri else []) + remote:
        try:
            state = protection.request(host, "status", vm=parent)["vm"].get("run_state")
            # A protected parent may be caught in a checkpoint's pause:
            # what counts is a QEMU there.
            if state not in (None, "unknown", "no-qemu", "shutdown"):
                found.append(host)
        except protection.ProtectionError as e:
            if "no VM named" not in str(e):
                unreachable.append(f"{host} ({e})")
    if len(found) == 1:
        return found[0]
    if found:
        raise ForkError(f"{parent} runs on {', '.join(found)}: say which with --host")
    raise ForkError(f"VM {parent} is not running on any host of the cluster"
                    + (f"; not asked: {'; '.join(unreachable)}" if unreachable else ""))


def parent_meta(parent, libvirt_uri=None, clone_libvirt_uri=None, parent_host=None):
    """The parent's host and its vm.json, on whichever host of the cluster
    whose files this machine shares it runs (parent_host: on that one).
    libvirt_uri: the parent is a libvirt domain there
    (libvirt_parent_meta)."""
    if libvirt_uri:
        return libvirt_parent_meta(parent, libvirt_uri, clone_libvirt_uri or libvirt_uri,
                                   parent_host)
    for host in [parent_host] if parent_host else cluster_hosts():
        files = vm_files(host, parent)
        if files["meta"].exists() and running_pid(files):
            return host, json.loads(files["meta"].read_text())
    if parent_host:
        raise ForkError(f"VM {parent} is not running on {parent_host} (no QEMU of its own "
                        f"there: `remusdb-vm start {parent} --host {parent_host}`)")
    raise ForkError(f"VM {parent} is not running on any host of the cluster whose files "
                    f"this machine shares")


def libvirt_parent_meta(parent, uri, clone_uri, parent_host=None):
    """A libvirt domain's stand-in for vm.json (docs/libvirt.md, "Fork"):
    its host is the one whose remusdbd serves it, its command line is its
    migratable XML (its clones are libvirt domains of the same XML,
    started through clone_uri), its address what its guest agent reports."""
    try:
        state = libvirt.domain_state(uri, parent)
        if state != "running":
            raise ForkError(f"libvirt domain {parent} is {state or 'not defined'} at {uri}")
        xml = libvirt.migratable_xml(uri, parent)
    except libvirt.LibvirtError as e:
        raise ForkError(f"libvirt: {e}")
    if not wired_to_remusdbd(ET.fromstring(xml), parent):
        raise ForkError(f"libvirt domain {parent} is not wired to remusdbd "
                        f"(`remusdb libvirt-wire {parent}`): nothing serves its disk to fork")
    hosts = []
    for host in [parent_host] if parent_host else cluster_hosts():
        if cluster.current().hosts[host].control.via != "local":
            continue
        try:
            if daemon_status(host, parent).get("run_state") == "running":
                hosts.append(host)
        except control.ControlError:
            continue  # no remusdbd there, or it does not hold the domain
    if len(hosts) != 1:
        raise ForkError(f"libvirt domain {parent}: {len(hosts)} hosts whose files this machine "
                        f"shares run it ({', '.join(hosts) or 'none'}); fork needs the one")
    host = hosts[0]
    files = vm_files(host, parent)
    if f"path={files['qga']}," not in xml:
        raise ForkError(f"libvirt domain {parent} has no guest agent socket at {files['qga']} "
                        f"(wired before fork knew it): `remusdb libvirt-wire` it again")
    return host, {"vm": parent, "libvirt": uri, "clone_libvirt": clone_uri, "xml": xml,
                  "ip": guest_ipv4(files["qga"], parent)}


def guest_ipv4(qga, vm):
    """The guest's first global IPv4 address, from its guest agent."""
    try:
        agent = guest_agent.GuestAgent(qga, 10.0)
        try:
            nics = agent.command("guest-network-get-interfaces")
        finally:
            agent.close()
    except guest_agent.GuestAgentError as e:
        raise ForkError(f"cannot ask {vm}'s guest agent for its address: {e}")
    for nic in nics:
        for a in nic.get("ip-addresses") or []:
            ip = a.get("ip-address", "")
            if a.get("ip-address-type") == "ipv4" and not ip.startswith("127."):
                return ip
    raise ForkError(f"{vm}'s guest agent reports no IPv4 address")


def detect_dbms(parent_host, parent):
    """The DBMS running in the parent, asked through its guest agent; an
    error if none or both run (then --dbms says which). One pgrep for
    both server names: under load a guest command takes seconds."""
    qga = vm_files(parent_host, parent)["qga"]
    names = "|".join(DBMS_PROCESS[dbms] for dbms in DBMS)
    try:
        r = guest_agent.run(qga, ["/usr/bin/pgrep", "-l", "-x", names], 30)
    except guest_agent.GuestAgentError as e:
        raise ForkError(f"cannot ask {parent}'s guest agent which DBMS runs: {e}")
    if r["exitcode"] not in (0, 1):  # 1: no process matched
        raise ForkError(f"cannot ask {parent} which DBMS runs: pgrep exited with "
                        f"{r['exitcode']}: {r['err'].strip()}")
    seen = {line.split()[1] for line in r["out"].splitlines() if len(line.split()) == 2}
    running = [dbms for dbms in DBMS if DBMS_PROCESS[dbms] in seen]
    if len(running) != 1:
        raise ForkError(f"{' and '.join(running) or 'no DBMS'} running in {parent}: "
                        f"say which to fork with --dbms {'|'.join(DBMS)}")
    return running[0]


def daemon_status(host, name):
    return ask(host, "status", vm=name)["vm"]


def fork_source(parent, parent_host):
    """The host whose remusdbd forks the parent: its own, or, while it is
    protected, its backup's (the committed image, at no cost to it)."""
    p = daemon_status(parent_host, parent).get("protection") or {}
    if p.get("state") not in ("protected", "syncing", "connecting", "arbitrating"):
        return parent_host
    if p.get("state") != "protected":
        raise ForkError(f"{parent} is being protected ({p.get('state')}): its backup has "
                        f"no committed image to fork yet; wait for PROTECTED")
    backup = protection.host_of(p.get("peer", ""))
    if not backup:
        raise ForkError(f"{parent}'s backup {p.get('peer')} is not a host of the cluster file")
    return backup


def fork_status(host, parent):
    """The fork of `parent` on host: a running VM's, or its replica's."""
    return fork_in(ask(host, "status"), parent)


def fork_in(status, parent):
    """The fork of `parent` in a daemon's status reply, or {}."""
    for v in status.get("vms", []):
        if v.get("name") == parent and v.get("fork"):
            return v["fork"]
    for r in status.get("replicas", []):
        if r.get("vm") == parent and r.get("fork"):
            return r["fork"]
    return {}


def wait_fork_serving(host, parent, timeout=SNAPSHOT_TIMEOUT):
    deadline = time.monotonic() + timeout
    while True:
        f = fork_status(host, parent)
        if f.get("state") in ("serving", "served"):
            return f
        if f.get("state") == "failed":
            raise ForkError(f"the snapshot of {parent} failed: {f.get('error')}")
        if time.monotonic() > deadline:
            raise ForkError(f"the snapshot of {parent} did not finish within {timeout} s "
                            f"(state {f.get('state')})")
        time.sleep(0.05)


def clone_command(meta, parent_files, files, name, mac, disk_opts):
    """The parent's QEMU command line, re-pointed at the clone's run dir, its
    overlay disk and its MAC, with `-incoming defer`: the devices must be
    the parent's, or its device state would not load."""
    old, new = str(parent_files["dir"]), str(files["dir"])
    cmd = [a.replace(old + "/", new + "/") for a in meta["command"]]
    cmd[cmd.index("-name") + 1] = name
    blockdev = [i for i, a in enumerate(cmd) if a == "-blockdev"]
    # The parent's disk node(s) go; the clone's node is named disk0 too.
    for i in reversed(blockdev):
        del cmd[i:i + 2]
    at = blockdev[0]
    cmd[at:at] = disk_opts
    cmd = [a if not a.startswith("virtio-net-pci,") else
           ",".join(p if not p.startswith("mac=") else f"mac={mac}" for p in a.split(","))
           for a in cmd]
    return cmd + ["-incoming", "defer"]


def snapshot_disk_opts(fork, source_host, clone_host, overlay):
    disk = fork["disk"]
    if clone_host == source_host:
        server = f"server.type=unix,server.path={disk['socket']}"
    else:
        server = f"server.type=inet,server.host={disk['host']},server.port={disk['port']}"
    return ["-blockdev", f"driver=nbd,node-name=snap0,{server},export={disk['export']},"
                         f"read-only=on",
            "-blockdev", f"driver=qcow2,node-name=disk0,file.driver=file,"
                         f"file.filename={overlay},backing=snap0"]


def start_clone(fork, parent, parent_host, meta, clone, index, guarded=True,
                on_registered=None, watched=True, source_host=None):
    """Starts one clone's QEMU waiting for its memory; returns its incoming
    address for the page source. The negative controls of the fork tests
    turn one guard off each: guarded=False lifts the clone's quarantine
    before it runs, watched=False registers it without the watch of its
    page source. source_host: where the fork is (the parent's host, or
    its backup's)."""
    source_host = source_host or parent_host
    name, host = clone["name"], clone["host"]
    check_name(name)
    h = local_host(host)
    bridge = cluster.current().bridge
    if not bridge:
        raise ForkError(f"{cluster.current().path} names no `bridge:` (the guests' bridge "
                        f"the clones' NICs join)")
    files = vm_files(host, name)
    if running_pid(files):
        raise ForkError(f"a VM named {name} already runs on {host}")
    subprocess.run(["rm", "-rf", str(files["dir"])], check=True)
    files["dir"].mkdir(parents=True)
    overlay = paths.vm_disk(name).with_suffix(".qcow2")
    overlay.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(overlay),
                    str(fork["disk"]["size"])], check=True)
    ask(host, "vm-add", name=name,
        qmp_socket=str(files["qmp_daemon"]), net_socket=str(files["net"]),
        tap=f"rdbt-{name}", bridge=bridge, mac=clone["mac"],
        clone_of=fork["id"], **({} if watched else {"clone_watch": "off"}))
    if not guarded:
        ask(host, "vm-release", vm=name)
    if on_registered:
        on_registered(clone)
    parent_files = vm_files(parent_host, parent)
    address = incoming_address(files, host, source_host, h, index, name)
    if meta.get("libvirt"):
        start_libvirt_clone(fork, parent, meta, parent_files, files, clone, overlay,
                            source_host, address)
        return address
    cmd = clone_command(meta, parent_files, files, name, clone["mac"],
                        snapshot_disk_opts(fork, source_host, host, overlay))
    files["meta"].write_text(json.dumps({
        "vm": name, "host": host, "ip": clone["ip"], "mac": clone["mac"],
        "accel": meta.get("accel"), "wiring": "clone", "disk_via": "overlay",
        "net_via": "relay", "disk": str(overlay), "clone_of": fork["id"],
        "parent": parent, "qemu": meta.get("qemu"), "command": cmd}, indent=2))
    r = subprocess.run(list(h.exec_prefix or ()) + cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise ForkError(f"clone {name}: QEMU failed to start: {r.stderr.strip()}")
    with wait_for_socket(files["qmp"]) as q:
        q.command("migrate-set-capabilities", capabilities=[
            {"capability": "postcopy-ram", "state": True}])
        q.command("migrate-incoming", uri=address)
    return address


def incoming_address(files, host, source_host, h, index, name):
    """Where the clone's QEMU waits for the page source."""
    if host == source_host:
        return f"unix:{files['dir']}/incoming.sock"
    try:
        ip = cluster.resolve_ipv4(h.address)
    except cluster.ClusterError as e:
        raise ForkError(f"clone {name}: {host}'s address: {' '.join(e.problems)}")
    return f"tcp:{ip}:{CLONE_PORT_BASE + index}"


def start_libvirt_clone(fork, parent, meta, parent_files, files, clone, overlay,
                        source_host, address):
    """A libvirt parent's clone: a transient domain of the parent's XML
    (the same devices, so its device state loads; libvirt's own command
    line for them could not be replayed by hand), its disk the overlay on
    the frozen snapshot, started through the clone host's libvirt with
    `-incoming defer`, postcopy on, and the page source's URI given by
    libvirt's QMP passthrough, as the takeover does."""
    disk = fork["disk"]
    backing = {"export": disk["export"]}
    if clone["host"] == source_host:
        backing["socket"] = disk["socket"]
    else:
        backing.update(host=disk["host"], port=disk["port"])
    uri = meta["clone_libvirt"]
    try:
        xml = libvirt.clone_xml(meta["xml"], parent, parent_files["dir"], files["dir"],
                                clone["name"], clone["mac"], overlay, backing)
        files["meta"].write_text(json.dumps({
            "vm": clone["name"], "host": clone["host"], "ip": clone["ip"],
            "mac": clone["mac"], "wiring": "clone", "disk_via": "overlay",
            "net_via": "relay", "disk": str(overlay), "clone_of": fork["id"],
            "parent": parent, "libvirt": uri, "xml": xml}, indent=2))
        libvirt.create_incoming(uri, xml, address, postcopy=True)
    except libvirt.LibvirtError as e:
        raise ForkError(f"clone {clone['name']}: {e}")


def clone_libvirt_uri(host, name):
    """The libvirt URI a clone was started through, or None (plain QEMU)."""
    try:
        return json.loads(vm_files(host, name)["meta"].read_text()).get("libvirt")
    except (OSError, ValueError):
        return None


def wait_running_libvirt(uri, name, deadline):
    """libvirt starts QEMU with -S and `cont`s it before the page source
    has run it; whether QEMU then kept that as its autostart is QEMU's and
    libvirt's business: once the postcopy has switched over, a clone still
    paused is continued here."""
    while True:
        status = libvirt.monitor_command(uri, name, "query-status")["status"]
        if status == "running":
            return
        st = (libvirt.monitor_command(uri, name, "query-migrate") or {}).get("status")
        if st in ("postcopy-active", "completed") and status == "paused":
            libvirt.monitor_command(uri, name, "cont")
        elif st in ("failed", "postcopy-paused") or time.monotonic() > deadline:
            raise ForkError(f"clone {name} did not start running (migration {st}, {status})")
        time.sleep(0.01)


def wait_running(host, name, timeout=CLONE_RUN_TIMEOUT):
    files = vm_files(host, name)
    deadline = time.monotonic() + timeout
    uri = clone_libvirt_uri(host, name)
    if uri:
        return wait_running_libvirt(uri, name, deadline)
    try:
        with QMP(files["qmp"]) as q:
            while True:
                if q.command("query-status")["status"] == "running":
                    return
                st = q.command("query-migrate").get("status")
                if st in ("failed", "postcopy-paused") or time.monotonic() > deadline:
                    raise ForkError(f"clone {name} did not start running (migration {st})")
                time.sleep(0.01)
    except (OSError, QMPError) as e:
        raise ForkError(f"clone {name} on {host}: its QEMU went away while starting "
                        f"({e}); {qemu_last_words(files)}") from e


def qemu_last_words(files, lines=5):
    """The end of a daemonized QEMU's stderr (its -D log), for an error."""
    try:
        tail = files["qemu_log"].read_text(errors="replace").strip().splitlines()[-lines:]
    except OSError as e:
        return f"no QEMU log at {files['qemu_log']} ({e.strerror})"
    if not tail:
        return f"QEMU said nothing in {files['qemu_log']}"
    return f"QEMU's last words ({files['qemu_log']}): " + " | ".join(tail)


PG_FIRST_QUERY = "SELECT count(*) FROM pg_class"


def first_query(ip, timeout=120, dbms="postgresql", user=None, password=None,
                connect_via=direct):
    """Returns once a read query answers on ip, asked the way a client
    would (psycopg2 or PyMySQL over the LAN, through connect_via), as the
    fork's database role (credentials())."""
    user, password = credentials(user, password)
    if dbms == "mariadb":
        return first_query_mariadb(ip, timeout, user, password, connect_via)
    import psycopg2
    deadline = time.monotonic() + timeout
    while True:
        try:
            conn = connect_via(psycopg2.connect, host=ip, user=user, password=password,
                               dbname="postgres", connect_timeout=2)
            try:
                with conn.cursor() as cur:
                    cur.execute(PG_FIRST_QUERY)
                    if cur.fetchone():
                        return
            finally:
                conn.close()
        except psycopg2.Error as e:
            if time.monotonic() > deadline:
                raise ForkError(f"no read query answered at {ip} within {timeout} s: "
                                f"{str(e).strip()}")
        time.sleep(0.05)


def mariadb_query(ip, sql, timeout=10, user=None, password=None, database=None,
                  connect_via=direct):
    """One query's first row, over the LAN through connect_via, as `user`
    (default: the fork's database role), autocommit."""
    import pymysql
    user, password = credentials(user, password)

    def run():
        conn = pymysql.connect(host=ip, user=user, password=password, database=database,
                               connect_timeout=timeout, read_timeout=timeout,
                               autocommit=True)
        try:
            with conn.cursor() as cur:
                cur.execute(sql)
                return cur.fetchone()
        finally:
            conn.close()
    return connect_via(run)


def first_query_mariadb(ip, timeout, user, password, connect_via):
    deadline = time.monotonic() + timeout
    while True:
        try:
            if mariadb_query(ip, "SELECT @@read_only", 2, user, password,
                             connect_via=connect_via):
                return
        except Exception as e:  # not up yet: PyMySQL's and socket errors alike
            if time.monotonic() > deadline:
                raise ForkError(f"no read query answered at {ip} within {timeout} s: {e}")
        time.sleep(0.05)


def plan_clones(parent, n, hosts, ips=None):
    """Names, hosts, MACs and addresses of n clones. ips: their addresses,
    else the first n of the cluster file's fork.clone_addresses."""
    if ips is None:
        ips = cluster.current().fork.clone_addresses[:n]
    if len(ips) < n:
        raise ForkError(f"{n} clone(s) need {n} address(es): give --clone-ip, or list "
                        f"them in the cluster file's fork.clone_addresses "
                        f"({len(ips)} there)")
    clones = []
    for i in range(n):
        name = f"{parent}c{i + 1}"
        clones.append({"name": name, "host": hosts[i % len(hosts)], "ip": ips[i],
                       "mac": mac_for(name), "hostname": name})
    return clones


def snapshot(parent, n, push_mbps=0, where=None):
    """Freezes the parent's memory and disk for n clones (fork-start) and
    waits until the parent runs again. where: parent_meta(parent), when the
    caller has it already. Returns (parent_host, meta, fork); fork["host"]
    is the host whose remusdbd holds it."""
    parent_host, meta = where or parent_meta(parent)
    source_host = fork_source(parent, parent_host)
    try:
        ask(source_host, "fork-start", vm=parent, clones=n, push_mbps=push_mbps)
        f = wait_fork_serving(source_host, parent)
    except control.ControlError as e:
        raise ForkError(f"cannot fork {parent}: {e}")
    f["host"] = source_host
    if f.get("from") == "backup":
        say(f"{parent}: snapshot {f['id']}: the committed image of epoch {f.get('epoch')} "
            f"on {source_host}; the protected parent was not asked for anything (the "
            f"backup's fork() held its event loop {f.get('backup_fork_call_ms', 0):.1f} ms)")
    else:
        say(f"{parent}: snapshot {f['id']}: parent paused {f.get('parent_pause_ms', 0):.0f} ms "
            f"(QEMU downtime {f.get('qemu_downtime_ms')} ms)")
    return parent_host, meta, f


def launch(f, parent, parent_host, meta, clones, guarded=True, on_registered=None,
           watched=True):
    """Starts every clone's QEMU, has the page source serve it, and waits
    until each runs (sets its running_s relative to now)."""
    t0 = time.monotonic()
    source_host = f.get("host", parent_host)
    for i, c in enumerate(clones):
        c["address"] = start_clone(f, parent, parent_host, meta, c, i, guarded,
                                   on_registered, watched, source_host)
        ask(source_host, "fork-serve", vm=parent, clone=c["name"], address=c["address"])
    for c in clones:
        wait_running(c["host"], c["name"])
        c["running_after_launch_s"] = round(time.monotonic() - t0, 3)


def become(c, role, label, parent, source_host, parent_ip, guarded, before_release, t0,
           dbms="postgresql", check_divergence=True, parent_host=None, user=None,
           password=None, connect_via=direct):
    """Gives clone c its identity and role through its guest agent, lets it
    onto the LAN, and times its first read query. user, password: the
    database role (credentials())."""
    user, password = credentials(user, password)
    qga = vm_files(c["host"], c["name"])["qga"]
    kw = dict(mac=c["mac"], ip=c["ip"], hostname=c["hostname"])
    repl = dict(repl_user=user, repl_password=password)
    # Only the new identity may pass from now on: the replica needs the
    # parent's WAL as soon as it has re-identified, and nothing it sends
    # as the parent (its old sessions' last segments) may ever leave.
    if guarded:
        ask(c["host"], "vm-release", vm=c["name"], mac=c["mac"], ip=c["ip"])
    if dbms == "mariadb" and role in ("replica", "copy"):
        sid = clone_identity.server_id_for(c["ip"])
        c["server_id"] = sid
        if role == "replica":
            # The parent's binlog, read in the parent (wherever the fork is).
            parent_qga = vm_files(parent_host or source_host, parent)["qga"]
            c["hook_output"] = clone_identity.make_mariadb_replica(
                qga, parent_qga, parent_ip, sid, check_divergence=check_divergence, **repl,
                **kw)
        else:
            c["hook_output"] = clone_identity.make_mariadb_copy(qga, sid, **kw)
    elif role == "replica":
        clone_identity.make_replica(qga, label, parent_ip, **repl, **kw)
    elif role == "copy":
        clone_identity.make_copy(qga, **kw)
    else:
        clone_identity.set_identity(qga, **kw)
    c["identity_s"] = round(time.monotonic() - t0, 3)
    if before_release:
        before_release(c)
    if guarded:
        ask(c["host"], "vm-release", vm=c["name"])
    c["released_s"] = round(time.monotonic() - t0, 3)
    first_query(c["ip"], dbms=dbms, user=user, password=password, connect_via=connect_via)
    c["first_query_s"] = round(time.monotonic() - t0, 3)
    st = fork_status(source_host, parent)
    c["pages_at_first_query"] = st.get("clones", {}).get(c["name"], {})
    c["disk_bytes_read_at_first_query"] = st.get("disk", {}).get("bytes_read")


def fork(parent, n, hosts=None, role="replica", ips=None, timeline=None,
         push_mbps=0, guarded=True, on_registered=None, before_release=None, dbms=None,
         user=None, password=None, connect_via=direct, libvirt_uri=None,
         clone_libvirt_uri=None, parent_host=None):
    """Forks `parent` into n clones and returns a report of every step's time
    (seconds from the start) and what each clone fetched.

    role: "replica", "copy", or "identity" (a new identity only).
    ips: the clones' addresses (default: the cluster file's
    fork.clone_addresses). user, password: the database role (default:
    the cluster file's); connect_via: where database connections are
    made from (clone_identity.direct: here). libvirt_uri: the parent is a
    libvirt domain there, and its clones are libvirt domains started
    through clone_libvirt_uri (default the same). parent_host: the host
    the parent runs on (default: whichever of those whose files this
    machine shares runs it).
    dbms: "postgresql" or "mariadb"; None asks the parent which one runs.
    on_registered(clone) is called once remusdbd has the clone, before its
    QEMU starts; before_release(clone) just before the clone joins the LAN
    (the tests watch the clone's tap from the first to the second)."""
    t0 = time.monotonic()
    marks = {}

    def mark(key):
        marks[key] = round(time.monotonic() - t0, 3)
        if timeline is not None:
            timeline.append((time.time(), key))

    user, password = credentials(user, password)
    parent_host, meta = parent_meta(parent, libvirt_uri, clone_libvirt_uri, parent_host)
    hosts = hosts or [parent_host]
    for h in hosts:
        local_host(h)
    clones = plan_clones(parent, n, hosts, ips)
    if dbms is None:
        dbms = detect_dbms(parent_host, parent)
    elif dbms not in DBMS:
        raise ForkError(f"unknown DBMS {dbms!r}; one of {', '.join(DBMS)}")
    conn = None
    if role == "replica" and dbms == "postgresql":
        conn = clone_identity.parent_connection(meta["ip"], user, password,
                                                connect_via=connect_via)
        clone_identity.backup_start(conn)
        mark("backup_started")
    blocked = None
    if role == "replica" and dbms == "mariadb":
        blocked = clone_identity.mariadb_block_commits(meta["ip"], user, password,
                                                       connect_via=connect_via)
        mark("commits_blocked")
    try:
        parent_host, meta, f = snapshot(parent, n, push_mbps, (parent_host, meta))
        mark("parent_resumed")
    finally:
        if blocked is not None:
            clone_identity.mariadb_unblock_commits(blocked)
            mark("commits_unblocked")
    label = None
    if conn is not None:
        label = clone_identity.backup_stop(conn)
        conn.close()
        mark("backup_stopped")
    launch(f, parent, parent_host, meta, clones, guarded, on_registered)
    for c in clones:
        c["running_s"] = round(marks["parent_resumed"] + c["running_after_launch_s"], 3)
    mark("clones_running")
    # Each clone gets its identity and role at once, all in parallel: until
    # its hook stops its PostgreSQL, a clone's server runs on from the
    # parent's state and may write what the parent never will.
    errors = []

    def settle(c):
        try:
            become(c, role, label, parent, f["host"], meta["ip"], guarded,
                   before_release, t0, dbms, parent_host=parent_host, user=user,
                   password=password, connect_via=connect_via)
        except Exception as e:  # reported below, with the clone's name
            errors.append((c["name"], e))

    threads = [threading.Thread(target=settle, args=(c,)) for c in clones]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        name, e = errors[0]
        raise ForkError(f"clone {name}: {e}") from e
    mark("clones_serving")
    return {"parent": parent, "parent_host": parent_host, "source_host": f["host"],
            "role": role, "n": n, "dbms": dbms, "fork": fork_status(f["host"], parent),
            "marks": marks, "clones": clones}


def stop_clone(host, name):
    """Stops clone `name`'s QEMU (QMP quit, else SIGKILL; a libvirt clone
    through its libvirt, where it vanishes, being transient) and takes it
    out of its host's remusdbd."""
    uri = clone_libvirt_uri(host, name)
    if uri:
        libvirt.virsh(uri, "destroy", name, check=False)
    else:
        stop_qemu(vm_files(host, name))
    try:
        ask(host, "vm-remove", vm=name)
    except control.ControlError as e:
        say(f"{name} on {host}: {e}")


def stop_clones(clones):
    for c in clones:
        stop_clone(c["host"], c["name"])
        paths.vm_disk(c["name"]).with_suffix(".qcow2").unlink(missing_ok=True)


def release(parent):
    """Ends the parent's fork (page source and disk snapshot). The clones'
    disks read through that snapshot: stop them first."""
    hosts = [h for h in cluster_hosts()
             if cluster.current().hosts[h].control.via == "local"]
    try:
        hosts.insert(0, hosts.pop(hosts.index(parent_meta(parent)[0])))
    except ForkError:
        pass  # the parent is gone (taken over elsewhere, stopped): its fork may remain
    for host in hosts:
        if fork_status(host, parent):
            return ask(host, "fork-release", vm=parent)["fork"]
    # A fork made on a host reached through ssh (`remusdb fork` ran there)
    # is ended there: only its daemon is asked, as status asks it.
    unreachable = []
    for host in cluster_hosts():
        if host in hosts:
            continue
        try:
            if fork_in(protection.status(host), parent):
                return protection.request(host, "fork-release", vm=parent)["fork"]
        except protection.ProtectionError as e:
            unreachable.append(f"{host} ({e})")
    raise ForkError(f"{parent} has no fork on any host of the cluster"
                    + (f"; not asked: {'; '.join(unreachable)}" if unreachable else ""))
