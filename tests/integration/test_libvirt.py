"""A libvirt domain protected, failed over, failed back and forked (issue
12, part 3, and issue 22; docs/libvirt.md).

Each host gets its own plain libvirtd as root, started here in the host's
namespace with its state in the test's directory. A small TCG domain
(1 vCPU, 1 GiB) booting the lab's guest image is defined on the
primary's libvirt with a plain file disk and a bridged NIC, as an
operator would have it; `remusdb libvirt-wire` hands its disk and NIC to
remusdbd. Then the host "reboots" as far as the wiring goes: its /run
state of the domain is deleted and its libvirtd and remusdbd restarted,
so that what follows stands on what survives a reboot (libvirt's
persistent definition and managed-save image, remusdbd's state
directory). `virsh start` starts it, `remusdb protect --libvirt` protects
it. The start resumes a guest booted once and saved with `virsh
managedsave` (cached across runs, as conftest.py's saved guests are:
lab/saved_domain.py) rather than booting it for ~30 s; the first run
boots and saves it before the reboot.

1. Failover: the primary host loses power as in the power drill (its
   namespace silenced by nftables, then its QEMU and its remusdbd
   SIGKILLed: no FIN or RST leaves it, so only the missing heartbeats
   tell the backup), and the backup's remusdbd takes over through the
   backup's libvirt: `virsh list` there shows the domain running, and
   PostgreSQL in the guest answers with every row committed before the
   failure, from the same postmaster (the guest resumed, it did not boot
   again).
2. Failback (docs/operations.md, "Failback"): the primary is repaired,
   the domain protected from the backup back to it (a changed-block
   resync), and failed over to it: it runs in the primary's libvirt
   again, etcd names the primary, the backup's copy is destroyed and its
   definition there refused by the owner hook, and every committed row is
   there, those written on the backup included.
3. Fork: the running domain forks into one clone, itself a libvirt domain
   on the same host's libvirt, with its address and the database role
   from the cluster file; the clone answers a query with the parent's
   rows.

The three share one booted domain, in that order; run alone, a test makes
the state it needs itself.

Controls: before the failure the backup's libvirt does not know the
domain (so `virsh list` there can fail the test); protecting a domain
that is defined but not wired is refused with one line. The data checks
(missing_rows) name each missing row: at the failover and at the failback
a row inserted in a transaction left open at that moment must be named
missing (the check catches one absent row among the committed ones), and
a row inserted into the parent after the fork must be missing on the
clone (the check reads the clone, not its parent).

Both libvirtds run the owner hook (remusdb.libvirt_hook): after the
failover `virsh start` of the domain on the old primary is refused,
naming the backup as its owner (check_owner_hook has its controls), and
after the failback the same on the backup, naming the primary."""
import shutil
import subprocess
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from remusdb import cluster, failback, fork, libvirt, ownership, paths, protection
from remusdb.lab import libvirtd, netns, saved_domain, vm, workload
from remusdb.drill.lab import forget_ownership, stop_vm_everywhere
from remusdb.drill.inject import Cut, kill_pids, live_pid, remove_leftover_cut, wait_gone
from polling import wait_for

REPO = Path(__file__).resolve().parents[2]
REMUSDB = REPO / "tools" / "remusdb"
NAME = "lvdb"
ROWS = set(range(20))         # committed on the primary before the power cut
UNCOMMITTED = 999             # inserted in a transaction left open (the controls)
# fixed, for the cached managed-save image (saved_domain.py)
DOMAIN_UUID = str(uuid.uuid5(uuid.NAMESPACE_URL, f"remusdb-lab:libvirt-domain:{NAME}"))


def remusdb(*args, check=True, timeout=1200):
    r = subprocess.run([str(REMUSDB), *args], capture_output=True,
                       text=True, timeout=timeout)
    print(f"$ remusdb {' '.join(args)}\n{r.stdout[-3000:]}{r.stderr[-3000:]}")
    if check:
        assert r.returncode == 0, r.stderr
    return r


class Domain:
    """Where the shared domain is: the host running it (None: not booted)
    and its libvirtds."""

    def __init__(self, primary, backup, workdir):
        self.libvirtd = {"primary": primary, "backup": backup}
        self.primary, self.backup = primary, backup
        self.workdir = workdir
        self.runs_on = None
        self.protected_to = None
        self.started_at = None   # the guest's pg_postmaster_start_time
        self.committed = set()   # rows whose INSERT was acknowledged
        self.clones = []         # fork's clones, to stop
        self.backup_probed = None  # the backup libvirtd's emulator probe (a Future)


@pytest.fixture(scope="module")
def domain(lab, tmp_path_factory):
    remove_leftover_cut()
    stop_vm_everywhere(NAME)
    forget_ownership(NAME)
    failback.forget_replica_files(NAME)  # a replica file from an earlier run changes a failback
    workdir = tmp_path_factory.mktemp("libvirt")
    started, shared = [], None
    probing = ThreadPoolExecutor(max_workers=1)
    try:
        for host in ("primary", "backup"):
            started.append(libvirtd.LabLibvirtd(host, workdir / f"libvirt-{host}").start())
        shared = Domain(*started, workdir)
        # while the domain boots, not inside the takeover (probe_emulator)
        shared.backup_probed = probing.submit(probe_emulator, shared.backup)
        yield shared
    finally:
        probing.shutdown(wait=True)
        if shared is not None and shared.clones:
            fork.stop_clones(shared.clones)
        for d in started:
            d.stop()
        stop_vm_everywhere(NAME)
        vm.stop_daemon("backup")  # it took the VM over: the next tests get a clean one


def probe_emulator(daemon):
    """A libvirtd that has run for a while has probed the emulator
    already; ours are fresh, and a first probe alone takes ~4 s under TCG:
    the backup's is done while the domain boots, not inside the takeover,
    and the primary's before the failback's."""
    libvirt.virsh(daemon.uri, "domcapabilities", "--emulatorbin", str(paths.qemu_binary()),
                  "--virttype", "qemu")


def sql(query, ip=vm.DEFAULT_IP):
    return workload.psql(ip, query)


def missing_rows(expected, ip=vm.DEFAULT_IP):
    """The rows of `expected` that lv_ledger on the server at ip lacks."""
    present = {int(x) for x in sql("SELECT id FROM lv_ledger", ip).split()}
    return set(expected) - present


def missing_rows_answer(d):
    """The shared domain runs and has every acknowledged row."""
    try:
        return missing_rows(d.committed) == set()
    except RuntimeError:  # psql: the server does not answer
        return False


def insert(d, row_id):
    sql(f"INSERT INTO lv_ledger (id) VALUES ({row_id})")  # acknowledged = committed
    d.committed.add(row_id)


def insert_each(d, row_ids):
    """Inserts each row in a transaction of its own, as insert() does, in
    one psql session (a -c per INSERT, each sent and acknowledged before
    the next) rather than a psql process per row; with ON_ERROR_STOP, a
    failure stops it and no row of the batch counts as committed."""
    row_ids = sorted(row_ids)
    commands = [a for i in row_ids for a in ("-c", f"INSERT INTO lv_ledger (id) VALUES ({i})")]
    r = subprocess.run(["ip", "netns", "exec", workload.CLIENT_NS, "psql", "-h", vm.DEFAULT_IP,
                        "-U", workload.DB_USER, "-d", workload.DB_NAME, "-X", "-q", "-v",
                        "ON_ERROR_STOP=1", *commands], env=workload.PG_ENV,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"inserting rows {row_ids}: {r.stderr.strip()}"
    d.committed.update(row_ids)


class OpenTransaction:
    """A client session that inserted a row and never commits: it stays
    open across a takeover (connections are kept), the row invisible to
    every other session."""

    def __init__(self, row_id, ip=vm.DEFAULT_IP):
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", workload.CLIENT_NS, "psql", "-h", ip, "-U",
             workload.DB_USER, "-d", workload.DB_NAME, "-X", "-q", "-v", "ON_ERROR_STOP=1"],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env=workload.PG_ENV, text=True)
        self.proc.stdin.write(f"BEGIN;\nINSERT INTO lv_ledger (id) VALUES ({row_id});\n")
        self.proc.stdin.flush()
        wait_for(lambda: sql("SELECT count(*) FROM pg_stat_activity "
                             "WHERE state = 'idle in transaction'") == "1", 30,
                 "the open transaction's INSERT")

    def close(self):
        self.proc.kill()  # the connection ends: PostgreSQL rolls the row back
        self.proc.wait()


def check_data(d, what):
    """Every acknowledged row is there; the control: the open
    transaction's row is named missing by the same check."""
    assert missing_rows(d.committed) == set(), what
    assert missing_rows(d.committed | {UNCOMMITTED}) == {UNCOMMITTED}, \
        f"{what}: the check missed a row that was never committed"


def start_over(d):
    """No domain anywhere: what a test run alone, or after a failed one,
    starts from."""
    for daemon in (d.primary, d.backup):
        libvirt.virsh(daemon.uri, "destroy", NAME, check=False)
        libvirt.virsh(daemon.uri, "undefine", "--managed-save", NAME, check=False)
    stop_vm_everywhere(NAME)
    forget_ownership(NAME)
    failback.forget_replica_files(NAME)
    d.runs_on, d.committed = None, set()


def boot(d):
    """Defines, wires and starts the domain on the primary, through a
    simulated reboot of the primary between wiring and start. The start
    resumes the domain from its managed-save image (saved_domain.py):
    cached by an earlier run, else made here by a boot and a `virsh
    managedsave` before the reboot."""
    primary = d.primary
    console = paths.vm_run_dir("primary", NAME) / "console.log"
    lab_xml = libvirtd.lab_domain_xml(NAME, paths.vm_disk(NAME), vm.DEFAULT_IP,
                                      vm.mac_for(NAME), console, uuid=DOMAIN_UUID)
    entry = saved_domain.cache_entry(NAME, lab_xml, paths.vm_run_dir("primary", NAME),
                                     vm.mac_for(NAME))
    cached = saved_domain.complete(entry)
    disk = vm.prepare_disk(NAME, fresh=True, saved=entry if cached else None)
    assert str(disk) in lab_xml
    xml = d.workdir / f"{NAME}.xml"
    xml.write_text(lab_xml)
    libvirt.virsh(primary.uri, "define", str(xml))

    # Control: a defined domain that is not wired to remusdbd is refused.
    r = remusdb("protect", NAME, "--libvirt", primary.uri, "--backup", "backup", check=False)
    assert r.returncode == 1 and "libvirt-wire" in r.stderr, r.stderr

    vm.ensure_daemon("primary")  # a host's remusdbd runs as its service would
    remusdb("libvirt-wire", NAME, "--connect", primary.uri, "--host", "primary")
    wired = libvirt.virsh(primary.uri, "dumpxml", "--inactive", NAME).stdout
    assert "protocol='nbd'" in wired and "transport='unix'" in wired, wired
    assert "<interface" not in wired
    if not cached:  # the first run: booted once, and saved as a host's shutdown would
        libvirt.virsh(primary.uri, "start", NAME)
        vm.wait_for_postgres(vm.DEFAULT_IP, 400)
        saved_domain.save(entry, primary, NAME, disk)

    # A reboot of the primary, as far as the wiring goes: /run is a tmpfs,
    # so the domain's run directory goes, and both daemons start again.
    # What is left: libvirt's persistent definition and managed-save image,
    # and remusdbd's state directory (the VM it serves). Everything below
    # must work from those.
    vm.stop_daemon("primary")
    primary.stop()
    shutil.rmtree(paths.vm_run_dir("primary", NAME))
    if cached:
        saved_domain.place(entry, primary, NAME)
    primary.start()
    vm.ensure_daemon("primary")

    managed_save = saved_domain.managed_save_path(primary, NAME)
    assert managed_save.exists()  # what the start finds (the check below can see it)
    libvirt.virsh(primary.uri, "start", NAME)
    # libvirt resumed the saved guest and dropped the image (it would have
    # booted the domain without one, and left the image there)
    assert not managed_save.exists()
    qemu_pid = live_pid(primary.base / "run/libvirt/qemu" / f"{NAME}.pid", b"qemu")
    # the disk is libvirt's -blockdev nbd on remusdbd's socket
    cmdline = Path(f"/proc/{qemu_pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    assert '"driver":"nbd"' in cmdline and str(paths.vm_run_dir("primary", NAME) / "nbd.sock") \
        in cmdline, cmdline
    vm.settle_restored_guest(NAME, libvirt.vm_files(paths.vm_run_dir("primary", NAME)))
    vm.wait_for_postgres(vm.DEFAULT_IP, 400)
    d.started_at = sql("SELECT pg_postmaster_start_time()")
    sql("CREATE TABLE lv_ledger (id int PRIMARY KEY, at timestamptz DEFAULT now())")
    d.runs_on = "primary"


def protect_and_fail_over(d):
    """Protects the domain from the primary to the backup and cuts the
    primary's power; the backup takes it over through its libvirt."""
    primary, backup = d.primary, d.backup
    vm.ensure_daemon("backup")
    remusdb("protect", NAME, "--libvirt", primary.uri, "--backup-libvirt", backup.uri,
            "--backup", "backup", "--interval", "50", "--timeout", "900")
    insert_each(d, ROWS)
    replica = protection.replica("backup", NAME)
    assert replica and replica["state"] == "ready", replica
    peer_timeout_ms = protection.primary_protection("primary", NAME)["peer_timeout_ms"]
    assert peer_timeout_ms
    d.backup_probed.result()  # probe_emulator, started with the libvirtds
    # Control: until the takeover, the backup's libvirt has never heard of it.
    assert NAME not in libvirt.virsh(backup.uri, "list", "--all", "--name").stdout.split()
    open_tx = OpenTransaction(UNCOMMITTED)

    # The primary host loses power: silenced, then its QEMU and remusdbd killed.
    qemu_pid = live_pid(primary.base / "run/libvirt/qemu" / f"{NAME}.pid", b"qemu")
    daemon_pid = live_pid(paths.host_run_dir("primary") / "remusdbd.pid", b"remusdbd")
    assert qemu_pid and daemon_pid
    cut = Cut()
    try:
        cut.install()
        killed_at = time.monotonic()
        kill_pids([qemu_pid, daemon_pid])
        wait_gone([qemu_pid, daemon_pid])
        r = wait_for(lambda: (lambda x: x if x and x["state"] in ("active", "failed")
                              else None)(protection.replica("backup", NAME)), 180,
                     "the takeover to end")
        listed_s = time.monotonic() - killed_at
        evidence = cut.finish()
    finally:
        cut.remove()  # the dead primary stays silent until the backup has taken over
    d.runs_on = "backup"
    assert evidence["lan_frames_from_primary_after_cut"] == 0, evidence
    assert r["state"] == "active", r
    wait_for(lambda: libvirt.domain_state(backup.uri, NAME) == "running", 30,
             "the backup's libvirt to list the domain as running")
    out = libvirt.virsh(backup.uri, "list").stdout
    print(f"virsh list on the backup (takeover done {listed_s:.1f} s after the kill):\n{out}")
    assert any(line.split()[1:3] == [NAME, "running"] for line in out.splitlines()), out
    fo = r["failover"]
    print("failover:", fo)
    assert fo["total_ms"] and fo["restore_ms"] is not None, fo
    # the backup streamed every page into the QEMU libvirt started: a
    # launcher chooses the guest's memory itself, so the default shared
    # restore fell back, saying why
    assert fo["restore"] == "eager" and fo["stream_bytes"] > 0, fo
    assert "not qemu-system-*" in fo.get("not_shared", ""), fo
    # silence, not a closed connection, told the backup
    assert fo["detected_ms_after_last_heard"] >= peer_timeout_ms, fo
    vm.wait_for_postgres(vm.DEFAULT_IP, 120)
    try:
        check_data(d, "after the failover")
    finally:
        open_tx.close()
    return peer_timeout_ms


def test_libvirt_domain_protect_and_failover(domain):
    d = domain
    primary, backup = d.primary, d.backup
    boot(d)
    protect_and_fail_over(d)
    # the backup's libvirt keeps it: persistent, with no -incoming in its definition
    info = libvirt.virsh(backup.uri, "dominfo", NAME).stdout
    assert "Persistent:     yes" in info, info
    inactive = libvirt.virsh(backup.uri, "dumpxml", "--inactive", NAME).stdout
    assert "-incoming" not in inactive
    assert str(paths.vm_run_dir("backup", NAME) / "nbd.sock") in inactive
    assert ownership.owner(NAME)["owner"] == "backup"

    check_owner_hook(primary, backup)

    assert sql("SELECT pg_postmaster_start_time()") == d.started_at  # resumed, not rebooted
    insert(d, 100)  # and it writes on the backup's disk
    assert missing_rows(d.committed) == set()


def test_libvirt_domain_failback(domain):
    """The procedure of docs/operations.md, "Failback", for a libvirt
    domain: the repaired primary's remusdbd starts, the domain is protected
    from the backup to it (its libvirt URIs swapped), and failed over to it
    by `remusdb failover`; the backup's copy, fenced, is destroyed."""
    d = domain
    primary, backup = d.primary, d.backup
    if d.runs_on != "backup":  # run alone, or after a failed failover
        start_over(d)
        boot(d)
        protect_and_fail_over(d)
        insert(d, 100)

    vm.ensure_daemon("primary")  # the repaired host: its remusdbd starts, nothing else
    assert libvirt.domain_state(primary.uri, NAME) == "shut off"
    r = remusdb("protect", NAME, "--host", "backup", "--backup", "primary",
                "--libvirt", backup.uri, "--backup-libvirt", primary.uri,
                "--interval", "50", "--timeout", "900")
    assert "resync copy" in r.stdout, r.stdout  # the changed extents only
    d.protected_to = "primary"
    insert(d, 101)  # committed under the failback's protection
    assert (protection.replica("primary", NAME) or {}).get("state") == "ready"
    probe_emulator(primary)
    open_tx = OpenTransaction(UNCOMMITTED)
    try:
        remusdb("failover", NAME, "--host", "primary")
        d.runs_on = "primary"
        wait_for(lambda: libvirt.domain_state(primary.uri, NAME) == "running", 30,
                 "the primary's libvirt to list the domain as running")
        vm.wait_for_postgres(vm.DEFAULT_IP, 120)
        check_data(d, "after the failback")
    finally:
        open_tx.close()
    assert sql("SELECT pg_postmaster_start_time()") == d.started_at  # resumed, not rebooted
    out = libvirt.virsh(primary.uri, "list").stdout
    print(f"virsh list on the primary after the failback:\n{out}")
    assert any(line.split()[1:3] == [NAME, "running"] for line in out.splitlines()), out
    assert "Persistent:     yes" in libvirt.virsh(primary.uri, "dominfo", NAME).stdout
    inactive = libvirt.virsh(primary.uri, "dumpxml", "--inactive", NAME).stdout
    assert "-incoming" not in inactive
    assert str(paths.vm_run_dir("primary", NAME) / "nbd.sock") in inactive
    rec = ownership.owner(NAME)
    print("etcd after the failback:", rec)
    assert rec["owner"] == "primary", rec

    # The backup's copy was fenced by the takeover; the operator destroys it.
    # (the backup's remusdbd fences it once it hears of the takeover)
    state = wait_for(lambda: (lambda st: st if st in ("paused", "shut off") else None)(
        libvirt.domain_state(backup.uri, NAME)), 30, "the backup's copy to be fenced")
    print(f"the backup's copy after the failback: {state}")
    libvirt.virsh(backup.uri, "destroy", NAME, check=False)
    assert libvirt.domain_state(backup.uri, NAME) == "shut off"
    r = libvirt.virsh(backup.uri, "start", NAME, check=False)
    print(f"virsh start {NAME} on the backup -> {r.returncode}: {r.stderr.strip()}")
    assert r.returncode != 0 and "Hook script execution failed" in r.stderr, r.stderr
    assert "etcd says host primary owns it" in r.stderr and "not backup" in r.stderr, r.stderr
    running = libvirt.virsh(primary.uri, "dumpxml", NAME).stdout
    assert run_hook(primary, NAME, running).returncode == 0  # the owner's is allowed
    insert(d, 102)
    assert missing_rows(d.committed) == set()


def test_libvirt_domain_fork(domain):
    """`remusdb fork --libvirt` of the running domain into one clone, a
    transient libvirt domain on the same host's libvirt, an independent
    copy at the cluster file's first clone address with its database
    role: the clone answers with the parent's rows at the fork, and a row
    the parent commits after the fork is missing there (the control)."""
    d = domain
    if d.runs_on is None or not missing_rows_answer(d):  # run alone, or after a failure
        start_over(d)
        boot(d)
        insert_each(d, ROWS)
    host, uri = d.runs_on, d.libvirtd[d.runs_on].uri
    clone = f"{NAME}c1"
    d.clones = [{"host": host, "name": clone}]
    report = fork.fork(NAME, 1, role="copy", connect_via=netns.client_call, libvirt_uri=uri)
    d.clones = report["clones"]
    c = report["clones"][0]
    print(f"fork of the libvirt domain: {report['marks']}; clone {c['name']} at {c['ip']}: "
          f"running {c['running_s']} s, first query {c['first_query_s']} s")
    assert c["name"] == clone and c["host"] == host
    assert c["ip"] == cluster.current().fork.clone_addresses[0]  # the cluster file's
    out = libvirt.virsh(uri, "list").stdout
    print(f"virsh list on {host} with the clone:\n{out}")
    assert any(line.split()[1:3] == [clone, "running"] for line in out.splitlines()), out
    cmdline = libvirt.virsh(uri, "dumpxml", clone).stdout
    assert "qcow2" in cmdline and "protocol='nbd'" in cmdline, cmdline  # overlay on the snapshot

    assert missing_rows(d.committed, ip=c["ip"]) == set()  # the parent's data, in the clone
    assert sql("SELECT count(*) FROM lv_ledger", c["ip"]) == str(len(d.committed))
    insert(d, 300)  # the parent goes on after the fork; the copy does not follow
    assert missing_rows(d.committed) == set()
    assert missing_rows(d.committed, ip=c["ip"]) == {300}, "the check read the parent"

    fork.stop_clones(d.clones)
    d.clones = []
    fork.release(NAME)
    # transient: destroyed, it is gone from the host's libvirt
    assert clone not in libvirt.virsh(uri, "list", "--all", "--name").stdout.split()
    assert missing_rows(d.committed) == set()  # the parent runs on


def run_hook(daemon, domain, xml, operation=("prepare", "begin")):
    """The hook as daemon's libvirtd runs it: its script, its config, in
    its host's namespace (where etcd is reachable)."""
    hook = daemon.base / "etc/libvirt/hooks/qemu.d/remusdb"
    r = subprocess.run(["ip", "netns", "exec", netns.namespace_of(daemon.host), str(hook),
                        domain, *operation, "-"], input=xml, capture_output=True,
                       text=True, timeout=30)
    print(f"hook on {daemon.host}: {domain} {' '.join(operation)} -> {r.returncode} "
          f"{r.stderr.strip()}")
    return r


def check_owner_hook(primary, backup):
    """After the takeover the old primary's libvirt still has the domain,
    shut off: its owner hook refuses `virsh start` there, naming the new
    owner (the start would fail later anyway, the primary's remusdbd being
    dead: the error must be the hook's). Controls, with each host's own
    hook: the owner's is not refused, nor a wired domain with no owner in
    etcd, nor a domain not wired to remusdbd; the domain's first start on
    the primary (no owner yet) and the takeover's `virsh create` on the
    backup (its owner) went through the same hooks."""
    assert libvirt.domain_state(primary.uri, NAME) == "shut off"
    r = libvirt.virsh(primary.uri, "start", NAME, check=False)
    print(f"virsh start {NAME} on the old primary -> {r.returncode}: {r.stderr.strip()}")
    assert r.returncode != 0
    assert "Hook script execution failed" in r.stderr, r.stderr
    assert "etcd says host backup owns it" in r.stderr and "not primary" in r.stderr, r.stderr
    assert libvirt.domain_state(primary.uri, NAME) == "shut off"

    inactive = libvirt.virsh(primary.uri, "dumpxml", "--inactive", NAME).stdout
    r = run_hook(primary, NAME, inactive)
    assert r.returncode == 1 and "etcd says host backup owns it" in r.stderr, r.stderr
    assert run_hook(primary, NAME, inactive, ("release", "end")).returncode == 0
    running = libvirt.virsh(backup.uri, "dumpxml", NAME).stdout
    assert run_hook(backup, NAME, running).returncode == 0
    other = "lvnokey"
    forget_ownership(other)
    renamed = inactive.replace(f"<name>{NAME}</name>", f"<name>{other}</name>").replace(
        f"name='{NAME}'", f"name='{other}'")
    assert run_hook(primary, other, renamed).returncode == 0
    plain = libvirtd.lab_domain_xml(NAME, "/nonexistent.img", vm.DEFAULT_IP, vm.mac_for(NAME),
                                    "/nonexistent.log")
    assert run_hook(primary, NAME, plain).returncode == 0
