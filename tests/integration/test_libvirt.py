"""A libvirt domain protected and failed over (issue 12, part 3;
docs/libvirt.md).

Each host gets its own plain libvirtd as root, started here in the host's
namespace with its state in the test's directory. A small TCG domain
(1 vCPU, 1 GiB) booting the lab's guest image is defined on the
primary's libvirt with a plain file disk and a bridged NIC, as an
operator would have it; `remusdb libvirt-wire` hands its disk and NIC to
remusdbd, `virsh start` boots it, `remusdb protect --libvirt` protects it.
Then the primary host loses power as in the power drill (its namespace
silenced by nftables, then its QEMU and its remusdbd SIGKILLed: no FIN
or RST leaves it, so only the missing heartbeats tell the backup),
and the backup's remusdbd takes over through the backup's libvirt:
`virsh list` there shows the domain running, and PostgreSQL in the guest
answers with every row committed before the failure, from the same
postmaster (the guest resumed, it did not boot again).

Controls: before the failure the backup's libvirt does not know the
domain (so `virsh list` there can fail the test), and protecting a
domain that is defined but not wired is refused with one line.

Both libvirtds run the owner hook (remusdb.libvirt_hook): after the
failover `virsh start` of the domain on the old primary is refused,
naming the backup as its owner (check_owner_hook has its controls)."""
import subprocess
import time
from pathlib import Path

import pytest

from remusdb import libvirt, paths, protection
from remusdb.lab import libvirtd, netns, vm, workload
from remusdb.drill.lab import forget_ownership, stop_vm_everywhere
from remusdb.drill.inject import Cut, kill_pids, live_pid, remove_leftover_cut, wait_gone
from polling import wait_for

REPO = Path(__file__).resolve().parents[2]
REMUSDB = REPO / "tools" / "remusdb"
NAME = "lvdb"


def remusdb(*args, check=True, timeout=1200):
    r = subprocess.run([str(REMUSDB), *args], capture_output=True,
                       text=True, timeout=timeout)
    print(f"$ remusdb {' '.join(args)}\n{r.stdout[-3000:]}{r.stderr[-3000:]}")
    if check:
        assert r.returncode == 0, r.stderr
    return r


@pytest.fixture
def libvirtds(lab, tmp_path):
    remove_leftover_cut()
    stop_vm_everywhere(NAME)
    forget_ownership(NAME)
    started = []
    try:
        for host in ("primary", "backup"):
            started.append(libvirtd.LabLibvirtd(host, tmp_path / f"libvirt-{host}").start())
        yield started
    finally:
        for d in started:
            d.stop()
        stop_vm_everywhere(NAME)
        vm.stop_daemon("backup")  # it took the VM over: the next tests get a clean one


def sql(query):
    return workload.psql(vm.DEFAULT_IP, query)


def test_libvirt_domain_protect_and_failover(libvirtds, tmp_path):
    primary, backup = libvirtds
    disk = vm.prepare_disk(NAME, fresh=True)
    console = paths.vm_run_dir("primary", NAME) / "console.log"
    xml = tmp_path / f"{NAME}.xml"
    xml.write_text(libvirtd.lab_domain_xml(NAME, disk, vm.DEFAULT_IP, vm.mac_for(NAME), console))
    libvirt.virsh(primary.uri, "define", str(xml))

    # Control: a defined domain that is not wired to remusdbd is refused.
    r = remusdb("protect", NAME, "--libvirt", primary.uri, "--backup", "backup", check=False)
    assert r.returncode == 1 and "libvirt-wire" in r.stderr, r.stderr

    vm.ensure_daemon("primary")  # a host's remusdbd runs as its service would
    remusdb("libvirt-wire", NAME, "--connect", primary.uri, "--host", "primary")
    wired = libvirt.virsh(primary.uri, "dumpxml", "--inactive", NAME).stdout
    assert "protocol='nbd'" in wired and "transport='unix'" in wired, wired
    assert "<interface" not in wired
    libvirt.virsh(primary.uri, "start", NAME)
    # the disk is libvirt's -blockdev nbd on remusdbd's socket
    qemu_pid_file = primary.base / "run/libvirt/qemu" / f"{NAME}.pid"
    qemu_pid = live_pid(qemu_pid_file, b"qemu")
    cmdline = Path(f"/proc/{qemu_pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    assert '"driver":"nbd"' in cmdline and str(paths.vm_run_dir("primary", NAME) / "nbd.sock") \
        in cmdline, cmdline
    vm.wait_for_postgres(vm.DEFAULT_IP, 400)
    started_at = sql("SELECT pg_postmaster_start_time()")

    vm.ensure_daemon("backup")
    remusdb("protect", NAME, "--libvirt", primary.uri, "--backup-libvirt", backup.uri,
            "--backup", "backup", "--interval", "50", "--timeout", "900")
    sql("CREATE TABLE lv_ledger (id int PRIMARY KEY, at timestamptz DEFAULT now())")
    for i in range(20):
        sql(f"INSERT INTO lv_ledger (id) VALUES ({i})")  # each acknowledged = committed
    replica = protection.replica("backup", NAME)
    assert replica and replica["state"] == "ready", replica
    peer_timeout_ms = protection.primary_protection("primary", NAME)["peer_timeout_ms"]
    assert peer_timeout_ms
    # A libvirtd that has run for a while has probed the emulator already;
    # ours is fresh, and its first probe alone takes ~4 s under TCG: do it
    # now, not inside the takeover.
    libvirt.virsh(backup.uri, "domcapabilities", "--emulatorbin", str(paths.qemu_binary()),
                  "--virttype", "qemu")
    # Control: until the takeover, the backup's libvirt has never heard of it.
    assert NAME not in libvirt.virsh(backup.uri, "list", "--all", "--name").stdout.split()

    # The primary host loses power: silenced, then its QEMU and remusdbd killed.
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
    # silence, not a closed connection, told the backup
    assert fo["detected_ms_after_last_heard"] >= peer_timeout_ms, fo
    # the backup's libvirt keeps it: persistent, with no -incoming in its definition
    info = libvirt.virsh(backup.uri, "dominfo", NAME).stdout
    assert "Persistent:     yes" in info, info
    inactive = libvirt.virsh(backup.uri, "dumpxml", "--inactive", NAME).stdout
    assert "-incoming" not in inactive
    assert str(paths.vm_run_dir("backup", NAME) / "nbd.sock") in inactive

    check_owner_hook(primary, backup)

    vm.wait_for_postgres(vm.DEFAULT_IP, 120)
    assert sql("SELECT count(*) FROM lv_ledger") == "20"
    assert sql("SELECT pg_postmaster_start_time()") == started_at  # resumed, not rebooted
    sql("INSERT INTO lv_ledger (id) VALUES (100)")  # and it writes on the backup's disk
    assert sql("SELECT count(*) FROM lv_ledger") == "21"


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
