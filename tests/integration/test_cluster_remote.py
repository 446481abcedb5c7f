"""`remusdb status` run on one host of the cluster shows another host's
remusdbd through the cluster file's remote access: the CLI runs in the
primary's namespace with the cluster file as the primary sees it
(lab/cluster_file.py: the primary local, the backup through ssh to the
sshd the lab runs in the backup's namespace), as an operator would run
it on the primary. No VM.

Negative controls: the same file with the backup's host key replaced in
known_hosts is refused by ssh (so the answer did come over ssh, checked
against the host key), and a backup whose remusdbd is stopped shows as
unreachable, with the primary still listed.

The verbs that need a host's files (remusdb.remote_verb), the same way:
`libvirt-wire --host backup` from the primary wires a domain defined in
a libvirtd of the backup's (no boot); `check-image` of a protected VM
(the guest restored from its saved state, not booted) from the primary
(the backup's checksums hashed there through ssh) and from the backup
(the primary's memory dump hashed there, its daemon and vm.json asked
there); `fork` of that VM from the backup finds it on the primary
through ssh and runs there, where it stops at a planted error before it
touches anything (a full clone over ssh is left to the fork tests'
machinery: it costs a clone's postcopy and identity). Each has the
forged host key as its control: one line from ssh, nothing done."""
import json
import subprocess
import time
from pathlib import Path

import pytest
from conftest import fresh_guest

from remusdb import cluster, libvirt, paths, protection
from remusdb.drill.lab import forget_ownership
from remusdb.lab import cluster_file, libvirtd, netns, sshd, vm

REPO = Path(__file__).resolve().parents[2]
REMUSDB = REPO / "tools" / "remusdb"
# test_memory_optimizations' guest: its saved state is cached, so this
# module restores it rather than booting a guest of its own.
GUEST = "asctest"
DOMAIN = "rvwire"


def remusdb_on(host, cluster_path, *args, timeout=300):
    """`remusdb --cluster FILE ARGS` run in host's namespace, as an
    operator on that host would."""
    began = time.monotonic()
    r = subprocess.run(["ip", "netns", "exec", netns.namespace_of(host), str(REMUSDB),
                        "--cluster", str(cluster_path), *args],
                       capture_output=True, text=True, timeout=timeout)
    print(f"on {host}: remusdb {' '.join(args)}: exit {r.returncode} in "
          f"{time.monotonic() - began:.2f} s\n{r.stdout}{r.stderr}")
    return r


def status_from_primary(cluster_path, *args):
    return remusdb_on("primary", cluster_path, "status", *args, timeout=120)


def forged(cluster_path, tmp_path, host):
    """The cluster file with another host key for `host`'s address in
    its known_hosts."""
    other_key = tmp_path / f"other_key_{host}"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other_key)],
                   check=True)
    known = tmp_path / f"known_hosts_{host}"
    known.write_text(f"{netns.HOSTS[host][1]} {other_key.with_suffix('.pub').read_text()}")
    path = tmp_path / f"forged-{host}.yml"
    path.write_text(Path(cluster_path).read_text().replace(str(sshd.known_hosts()), str(known)))
    return path


def one_ssh_refusal(r, host):
    """The verb failed with ssh's refusal of the host key, in one line."""
    assert r.returncode == 1, r.stderr
    assert r.stderr == (f"remusdb: error: ssh root@{netns.HOSTS[host][1]}: Host key "
                        f"verification failed.\n"), r.stderr


def test_status_on_the_primary_shows_the_backup_through_ssh(lab, tmp_path):
    vm.ensure_daemon("primary")
    vm.ensure_daemon("backup")
    path = cluster_file.from_host_path("primary")
    seen = cluster.load(path)
    assert seen.host("primary").control.via == "local"
    assert seen.host("backup").control.via == "ssh"

    r = status_from_primary(path)
    assert r.returncode == 0, r.stderr
    assert "host primary: remusdbd" in r.stdout.splitlines()
    assert "host backup: remusdbd" in r.stdout.splitlines()

    # The backup's own daemon answered (it names itself), over ssh.
    r = status_from_primary(path, "--host", "backup", "--json")
    assert r.returncode == 0, r.stderr
    reply = json.loads(r.stdout)["backup"]
    assert reply["ok"] and reply["host"] == "backup"

    # Control: another host key for the backup's address: ssh refuses,
    # and status says so on the backup's line.
    r = status_from_primary(forged(path, tmp_path, "backup"))
    assert r.returncode == 0  # the primary still answers
    [line] = [x for x in r.stdout.splitlines() if x.startswith("host backup:")]
    assert line.startswith("host backup: unreachable (ssh root@") and \
        "Host key verification failed" in line, line

    # Control: the backup's remusdbd stopped: unreachable, one line, through ssh.
    vm.stop_daemon("backup")
    try:
        r = status_from_primary(path)
        [line] = [x for x in r.stdout.splitlines() if x.startswith("host backup:")]
        assert "unreachable" in line and "remusdbd is not running" in line, line
        assert "host primary: remusdbd" in r.stdout.splitlines()
    finally:
        vm.ensure_daemon("backup")


def test_libvirt_wire_of_a_domain_on_the_backup_from_the_primary(lab, tmp_path):
    """The backup's libvirt has a defined, shut-off domain (a small raw
    disk: it is never started); libvirt-wire --host backup, run on the
    primary, runs on the backup through ssh and wires it there."""
    vm.ensure_daemon("backup")
    path = cluster_file.from_host_path("primary")
    daemon = libvirtd.LabLibvirtd("backup", tmp_path / "libvirt-backup").start()
    disk = tmp_path / f"{DOMAIN}.img"
    try:
        subprocess.run(["truncate", "-s", "64M", str(disk)], check=True)
        xml = tmp_path / f"{DOMAIN}.xml"
        xml.write_text(libvirtd.lab_domain_xml(DOMAIN, disk, vm.DEFAULT_IP, vm.mac_for(DOMAIN),
                                               tmp_path / "console.log"))
        libvirt.virsh(daemon.uri, "define", str(xml))

        # Control: the backup's host key forged: one line, nothing wired.
        r = remusdb_on("primary", forged(path, tmp_path, "backup"), "libvirt-wire", DOMAIN,
                       "--host", "backup", "--connect", daemon.uri)
        one_ssh_refusal(r, "backup")
        assert "protocol='nbd'" not in libvirt.virsh(daemon.uri, "dumpxml", "--inactive",
                                                     DOMAIN).stdout

        r = remusdb_on("primary", path, "libvirt-wire", DOMAIN, "--host", "backup",
                       "--connect", daemon.uri)
        assert r.returncode == 0, r.stderr
        assert r.stdout.startswith(f"{DOMAIN}: disk {disk} served by remusdbd on backup"), \
            r.stdout
        wired = libvirt.virsh(daemon.uri, "dumpxml", "--inactive", DOMAIN).stdout
        run_dir = paths.vm_run_dir("backup", DOMAIN)
        assert "protocol='nbd'" in wired and f"{run_dir}/nbd.sock" in wired, wired
        assert protection.request("backup", "status", vm=DOMAIN)["vm"]["name"] == DOMAIN

        # Wired once is refused the second time, and that refusal comes
        # back from the backup as one line naming it.
        r = remusdb_on("primary", path, "libvirt-wire", DOMAIN, "--host", "backup",
                       "--connect", daemon.uri)
        assert r.returncode == 1 and r.stderr == (f"remusdb: error: backup: domain {DOMAIN} is "
                                                  f"already wired to remusdbd\n"), r.stderr
    finally:
        libvirt.virsh(daemon.uri, "undefine", DOMAIN, check=False)
        daemon.stop()
        try:
            protection.request("backup", "vm-remove", vm=DOMAIN)
        except protection.ProtectionError as e:
            print(f"vm-remove {DOMAIN}: {e}")


@pytest.fixture(scope="module")
def protected_guest(lab):
    """GUEST on the primary, protected to the backup."""
    with fresh_guest(GUEST) as name:
        forget_ownership(name)
        protection.protect(name, f"{netns.HOSTS['backup'][1]}:7788", 50)
        try:
            protection.wait_protected(name, timeout=900)
            yield name
        finally:
            protection.unprotect(name)


def leftovers(vm_name):
    return sorted(Path("/dev/shm").glob(f"rdb-{vm_name}-*"))


@pytest.mark.parametrize("where", ["primary", "backup"])
def test_check_image_with_one_host_reached_through_ssh(protected_guest, tmp_path, where):
    """From the primary, the backup's checksums are hashed through ssh;
    from the backup, the primary's memory dump (and its daemon and
    vm.json are asked there)."""
    path = cluster_file.from_host_path(where)
    other = "backup" if where == "primary" else "primary"
    assert cluster.load(path).host(other).control.via == "ssh"
    args = ["check-image", protected_guest, "--host", "primary", "--backup", "backup"]

    # Control: the other host's key forged: one line from ssh, the VM
    # not left held, no file left behind.
    # (From the primary the hold and the dump happen, and ssh fails at
    # the first request to the backup; from the backup, at the first
    # question to the primary.)
    r = remusdb_on(where, forged(path, tmp_path, other), *args)
    assert r.returncode == 1 and "Host key verification failed" in r.stderr, r.stderr
    assert len(r.stderr.splitlines()) == 1, r.stderr
    p = protection.primary_protection("primary", protected_guest)
    assert p["state"] == "protected" and (p.get("checkpoint_hold") or {}).get("state") in \
        (None, "released"), p
    assert leftovers(protected_guest) == []

    r = remusdb_on(where, path, *args)
    assert r.returncode == 0 and ", 0 differ" in r.stdout, (r.stdout, r.stderr)
    assert "262144 of 262144 pages of pc.ram equal on the backup" in r.stdout, r.stdout
    assert leftovers(protected_guest) == []


def test_fork_from_the_backup_runs_on_the_parents_host(protected_guest, tmp_path):
    """From the backup, fork finds the parent on the primary through ssh
    and runs there. One clone address for two clones stops it before it
    touches anything: the error comes from the primary, naming it."""
    path = cluster_file.from_host_path("backup")
    args = ["fork", protected_guest, "-n", "2", "--clone-ip", "192.0.2.51"]

    r = remusdb_on("backup", forged(path, tmp_path, "primary"), *args)
    assert r.returncode == 1 and "Host key verification failed" in r.stderr, r.stderr
    assert len(r.stderr.splitlines()) == 1, r.stderr

    r = remusdb_on("backup", path, *args)
    assert r.returncode == 1, r.stderr
    assert r.stderr.startswith("remusdb: error: primary: 2 clone(s) need 2 address(es)"), \
        r.stderr
    assert len(r.stderr.splitlines()) == 1, r.stderr

    # From the primary, clones on the backup (reached through ssh) of a
    # parent here cannot be started: one line saying where they can go.
    r = remusdb_on("primary", cluster_file.from_host_path("primary"), "fork", protected_guest,
                   "--hosts", "backup")
    assert r.returncode == 1 and r.stderr.startswith(
        "remusdb: error: backup is reached through ssh from the parent's host"), r.stderr
    assert len(r.stderr.splitlines()) == 1, r.stderr
    assert protection.primary_protection("primary", protected_guest)["state"] == "protected"
