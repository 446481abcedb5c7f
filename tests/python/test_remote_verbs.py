"""The verbs that run on a host reached through ssh (remusdb.remote_verb:
libvirt-wire and fork forwarded whole, check-image's page sums), without
a network: an `ssh` on PATH runs the remote command here, as sshd would
on the far host, with the far host's own cluster file (far.yml next to
it, when the test writes one) as $REMUSDB_CLUSTER. sshd itself, and a
far host in another namespace, are exercised by
tests/integration/test_cluster_remote.py."""
import argparse
import shlex
import subprocess
from pathlib import Path

import pytest

from remusdb import cluster, image_check, remote_verb
from remusdb.cli import check_image, fork as fork_cli, libvirt_wire
from fake_ssh import put_fake_ssh_on_path
from stand_in_daemon import stand_in_daemon

REPO = Path(__file__).resolve().parents[2]
REMUSDB = REPO / "tools" / "remusdb"

# A remusdb from before forwarding: its parser knows the verb, not --forwarded.
OLD_REMUSDB = """#!/usr/bin/python3
import argparse
p = argparse.ArgumentParser(prog="remusdb")
v = p.add_subparsers().add_parser("libvirt-wire")
v.add_argument("domain"); v.add_argument("--connect"); v.add_argument("--host")
p.parse_args()
"""


@pytest.fixture
def fake_ssh(tmp_path, monkeypatch):
    return put_fake_ssh_on_path(tmp_path, monkeypatch)


def cluster_text(far_via, command=REMUSDB, here=True):
    """`far` through ssh (or local), and a local `here`."""
    lines = ["hosts:"]
    if here:
        lines += ["  - {name: here, replication: 192.0.2.1, control: {via: local}}"]
    if far_via == "ssh":
        lines += [f"  - {{name: far, replication: 192.0.2.2, control: {{via: ssh, target: "
                  f"root@192.0.2.2, port: 2222, command: '{command}'}}}}"]
    else:
        lines += ["  - {name: far, replication: 192.0.2.2, control: {via: local}}"]
    return "\n".join(lines) + "\n"


@pytest.fixture
def near(tmp_path, fake_ssh, monkeypatch):
    """This machine's cluster file (far through ssh) as the current one,
    and the far host's (far local) for the far side."""
    f = tmp_path / "near.yml"
    f.write_text(cluster_text("ssh"))
    (fake_ssh / "far.yml").write_text(cluster_text("local"))
    monkeypatch.setenv("REMUSDB_CLUSTER", str(f))
    cluster.use(f)
    yield f
    cluster.use(None)


def remusdb(*args, stdin=None):
    return subprocess.run([str(REMUSDB), *args], capture_output=True, text=True, timeout=60,
                          input=stdin)


def test_a_forwarded_verb_uses_the_cluster_files_ssh_settings():
    access = cluster.Control(via="ssh", socket="/run/remusdb/db2/remusdbd.sock",
                             target="root@db2.example.com", port=2222,
                             identity_file="/root/.ssh/remusdb",
                             known_hosts_file="/etc/remusdb/known_hosts",
                             command="/usr/bin/remusdb")
    argv = remote_verb.forward_argv(access, "libvirt-wire", "db", "--connect", "qemu:///system",
                                    "--host", "db2")
    assert argv == ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", "-p", "2222",
                    "-i", "/root/.ssh/remusdb", "-o", "IdentitiesOnly=yes",
                    "-o", "UserKnownHostsFile=/etc/remusdb/known_hosts",
                    "-o", "StrictHostKeyChecking=yes", "--", "root@db2.example.com",
                    "/usr/bin/remusdb libvirt-wire db --connect qemu:///system --host db2 "
                    "--forwarded 1"]


def test_libvirt_wire_and_fork_forward_their_arguments_for_the_far_host():
    args = argparse.Namespace(domain="db", connect="qemu:///system", host="db2")
    assert libvirt_wire.forwarded_args(args) == ["db", "--connect", "qemu:///system",
                                                 "--host", "db2"]
    args = argparse.Namespace(vm="db", n=2, role="copy", hosts="db2,db3", dbms=None,
                              clone_ip="192.0.2.51,192.0.2.52", db_user="replicator",
                              libvirt=None, clone_libvirt=None, json="/tmp/r.json",
                              db_password_file="/etc/secret")
    argv = fork_cli.forwarded_args(args, "db2")
    assert argv == ["db", "-n", "2", "--host", "db2", "--role", "copy", "--hosts", "db2,db3",
                    "--clone-ip", "192.0.2.51,192.0.2.52", "--db-user", "replicator",
                    "--json", "/tmp/r.json", "--db-password-file", "-"]


def test_fork_of_a_far_parent_runs_there_with_the_password_on_stdin(near, fake_ssh, tmp_path):
    secret = tmp_path / "pw"
    secret.write_text("s3cret-pw\n")
    r = remusdb("fork", "db", "--host", "far", "--db-user", "replicator",
                "--db-password-file", str(secret))
    print(r.stdout, r.stderr)
    assert r.returncode == 1
    # The far side got as far as looking for the parent among its own files.
    assert r.stderr.startswith("remusdb: error: far: VM db is not running on far (no QEMU "
                               "of its own there"), r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    command = (fake_ssh / "commands").read_text()
    assert "fork db -n 1 --host far" in command and "--db-password-file - --forwarded 1" in \
        command
    assert "s3cret" not in command and "s3cret" not in (fake_ssh / "options").read_text()


def test_clones_on_a_host_reached_through_ssh_from_a_local_parent_are_refused(
        near, fake_ssh, tmp_path, monkeypatch):
    run = tmp_path / "run"
    monkeypatch.setenv("REMUSDB_RUN", str(run))
    vm_dir = run / "here" / "vms" / "db"
    vm_dir.mkdir(parents=True)
    (vm_dir / "vm.json").write_text('{"command": ["qemu-system-x86_64"], "ip": "192.0.2.9"}')
    stand_in = subprocess.Popen(["sleep", "60"])
    try:
        (vm_dir / "qemu.pid").write_text(f"{stand_in.pid}\n")
        pw = tmp_path / "pw"
        pw.write_text("pw\n")
        r = remusdb("fork", "db", "--hosts", "far", "--dbms", "postgresql", "--db-user", "u",
                    "--db-password-file", str(pw))
        print(r.stdout, r.stderr)
        assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1
        assert r.stderr.startswith("remusdb: error: far is reached through ssh from the "
                                   "parent's host: its clones are started from the host the "
                                   "parent runs on"), r.stderr
        # Nothing went through ssh: the parent is here.
        assert not (fake_ssh / "targets").exists()
    finally:
        stand_in.kill()
        stand_in.wait()


def write_pages(path, pages):
    path.write_bytes(b"".join(bytes([i % 251]) * image_check.PAGE for i in pages))


def test_page_sums_of_a_far_host_are_hashed_there(near, fake_ssh, tmp_path):
    dump = tmp_path / "rdb-db-memory.dump"
    write_pages(dump, range(6))
    here = image_check.page_sums_of_dump(dump)
    far = check_image.page_sums_on("far", dump, "dump", remove=False)
    assert far == here and len(far) == 6
    assert (fake_ssh / "targets").read_text() == "root@192.0.2.2\n"
    # Control: one flipped bit in page 4 is that page differing.
    data = bytearray(dump.read_bytes())
    data[4 * image_check.PAGE + 17] ^= 1
    dump.write_bytes(bytes(data))
    flipped = check_image.page_sums_on("far", dump, "dump", remove=True)
    assert image_check.differing_pages(flipped, here) == [4]
    assert not dump.exists()  # --remove took it, there
    # The backup's checksum file passes as it is.
    sums = tmp_path / "rdb-db-backup.sums"
    sums.write_bytes(b"".join(i.to_bytes(8, "big") for i in here))
    assert check_image.page_sums_on("far", sums, "sums", remove=False) == here
    # Only check-image's own files are read there.
    other = tmp_path / "rdb-db-backup.sum"
    other.write_bytes(sums.read_bytes())
    with pytest.raises(remote_verb.RemoteVerbError) as e:
        check_image.page_sums_on("far", other, "sums", remove=True)
    assert str(e.value).startswith(f"remusdb page-sums on far: {other} is not a check-image "
                                   f"sums file"), e.value
    assert other.exists()
    # A local host's file is read here: no ssh.
    (fake_ssh / "targets").unlink()
    assert check_image.page_sums_on("here", sums, "sums", remove=False) == here
    assert not (fake_ssh / "targets").exists()


def test_a_far_host_that_reaches_itself_through_ssh_does_not_forward_again(
        near, fake_ssh):
    # The far side reads the near file (far through ssh) as its own.
    (fake_ssh / "far.yml").unlink()
    r = remusdb("libvirt-wire", "dom", "--host", "far")
    print(r.stdout, r.stderr)
    assert r.returncode == 1
    assert r.stderr == (f"remusdb: error: far: far was asked to run this verb itself, but its "
                        f"cluster file {near} reaches far through ssh: make far `via: local` "
                        f"in the cluster file on far\n")
    assert (fake_ssh / "targets").read_text() == "root@192.0.2.2\n"  # once, not again
    # Control: with the far host's own file (far local) the far side goes
    # on to wire the domain, and fails there on what it lacks.
    (fake_ssh / "far.yml").write_text(cluster_text("local"))
    r = remusdb("libvirt-wire", "dom", "--host", "far")
    assert r.returncode == 1 and "asked to run this verb itself" not in r.stderr
    assert r.stderr.startswith("remusdb: error: far: ") and "names no `bridge:`" in r.stderr


def test_a_caller_of_another_forwarding_protocol_is_refused(near):
    r = remusdb("libvirt-wire", "dom", "--host", "here", "--forwarded", "99")
    assert r.returncode == 1 and r.stderr == (
        "remusdb: error: forwarded by a remusdb of forwarding protocol 99; this one speaks 1: "
        "install the same remusdb version on both hosts\n")
    # Control: protocol 1 gets past that check.
    r = remusdb("libvirt-wire", "dom", "--host", "here", "--forwarded", "1")
    assert "forwarding protocol" not in r.stderr and "names no `bridge:`" in r.stderr


@pytest.mark.parametrize("case", ["host key", "missing", "older"])
def test_ssh_and_the_far_remusdb_failing_are_one_line(near, fake_ssh, tmp_path, case):
    command = REMUSDB
    if case == "host key":
        (fake_ssh / "ssh").write_text(
            "#!/bin/sh\necho '@@@ WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED! @@@' >&2\n"
            "echo 'Host key verification failed.' >&2\nexit 255\n")
    elif case == "missing":
        command = tmp_path / "nowhere" / "remusdb"
    else:
        command = tmp_path / "old-remusdb"
        command.write_text(OLD_REMUSDB)
        command.chmod(0o755)
    near.write_text(cluster_text("ssh", command))
    r = remusdb("libvirt-wire", "dom", "--host", "far")
    print(r.stderr)
    assert r.returncode == 1 and len(r.stderr.splitlines()) == 1, r.stderr
    expected = {
        "host key": "remusdb: error: ssh root@192.0.2.2: Host key verification failed.",
        "missing": f"remusdb: error: far: cannot run {str(command)!r} through ssh "
                   f"root@192.0.2.2 (exit 127: ",
        "older": "remusdb: error: remusdb on far (root@192.0.2.2) does not know "
                 "`libvirt-wire --forwarded` (an older version): install the same remusdb "
                 "version there",
    }[case]
    assert r.stderr.startswith(expected), r.stderr
    assert "Traceback" not in r.stderr


def test_the_forwarded_command_line_quotes_every_argument(near, fake_ssh):
    r = remusdb("libvirt-wire", "dom", "--host", "far", "--connect", "qemu:///system?x=a b;c")
    assert r.returncode == 1
    [command] = (fake_ssh / "commands").read_text().splitlines()
    assert shlex.split(command)[1:] == ["libvirt-wire", "dom", "--connect",
                                        "qemu:///system?x=a b;c", "--host", "far",
                                        "--forwarded", "1"]


@pytest.fixture
def forking_daemon(tmp_path):
    """A stand-in remusdbd holding a replica of `db` with a fork: status
    shows it, fork-release ends it (and says so)."""
    released = []

    def reply_for(req):
        fork = {"id": "db@fork-1", "state": "released" if released else "serving"}
        if req["cmd"] == "fork-release":
            released.append(req["vm"])
            fork["state"] = "released"
            return {"ok": True, "fork": fork}
        return {"ok": True, "vms": [], "replicas": [{"vm": "db", "fork": fork}]}

    with stand_in_daemon(tmp_path / "far.sock", reply_for) as path:
        yield path, released


def test_fork_release_ends_a_fork_on_a_host_reached_through_ssh(forking_daemon, fake_ssh,
                                                                 tmp_path, monkeypatch):
    path, released = forking_daemon
    f = tmp_path / "only-far.yml"
    f.write_text(f"hosts:\n  - {{name: far, replication: 192.0.2.2, control: {{via: ssh, "
                 f"target: root@192.0.2.2, socket: {path}, command: {REMUSDB}}}}}\n")
    r = remusdb("--cluster", str(f), "fork-release", "db")
    print(r.stdout, r.stderr)
    assert r.returncode == 0 and r.stdout == "db: fork db@fork-1 released (released)\n"
    assert released == ["db"]
    # Control: a VM with no fork there is named as such, after asking.
    r = remusdb("--cluster", str(f), "fork-release", "other")
    assert r.returncode == 1 and r.stderr == ("remusdb: error: other has no fork on any host "
                                              "of the cluster\n"), r.stderr
    assert released == ["db"]
