"""The CLI's remote path without a network: `remusdb control-relay`
against a stand-in daemon (a unix socket that answers as remusdbd does),
and control.request_over_ssh with an `ssh` on PATH that runs the remote
command here, as sshd would run it on the far host. sshd itself is
exercised by tests/integration/test_cluster_remote.py."""
import io
import json
import os
import subprocess
from pathlib import Path

import pytest

from remusdb import cluster, control
from remusdb.cli import control_relay
from fake_ssh import put_fake_ssh_on_path
from stand_in_daemon import stand_in_daemon

REPO = Path(__file__).resolve().parents[2]
REMUSDB = REPO / "tools" / "remusdb"


@pytest.fixture
def daemon(tmp_path):
    """A stand-in remusdbd: answers each request line with the request
    echoed back ({"ok": true, "echo": ...}), or refuses "bad"."""
    def reply_for(req):
        return ({"ok": False, "error": "unknown command 'bad'"} if req["cmd"] == "bad"
                else {"ok": True, "echo": req, "vms": [], "replicas": []})

    with stand_in_daemon(tmp_path / "remusdbd.sock", reply_for) as path:
        yield path


@pytest.fixture
def fake_ssh(tmp_path, monkeypatch):
    return put_fake_ssh_on_path(tmp_path, monkeypatch)


def relay(socket_path, stdin):
    out = io.BytesIO()
    assert control_relay.relay(socket_path, io.BytesIO(stdin), out, 5.0) == 0
    return json.loads(out.getvalue())


def test_the_relay_passes_one_request_and_its_response(daemon):
    reply = relay(daemon, b'{"cmd": "status", "vm": "db"}\n')
    assert reply["ok"] and reply["echo"] == {"cmd": "status", "vm": "db"}


def test_the_relay_answers_for_a_daemon_that_is_not_there(tmp_path):
    reply = relay(tmp_path / "none.sock", b'{"cmd": "status"}\n')
    assert reply["ok"] is False
    assert reply["error"].startswith(f"remusdbd is not running (no control socket at "
                                     f"{tmp_path}/none.sock)")
    assert relay(tmp_path / "none.sock", b"")["error"] == "control-relay: no request line on stdin"


def ssh_access(daemon, **kw):
    return cluster.Control(via="ssh", socket=str(daemon), target="root@db2.example.com",
                           command=str(REMUSDB), **kw)


def test_a_request_over_ssh_reaches_the_daemon_through_the_relay(daemon, fake_ssh):
    reply = control.request_via(ssh_access(daemon, port=2222), "status", timeout=5, vm="db")
    assert reply["echo"] == {"cmd": "status", "vm": "db"}
    assert (fake_ssh / "targets").read_text() == "root@db2.example.com\n"
    # The daemon's refusal comes back as the daemon said it.
    with pytest.raises(control.ControlError) as e:
        control.request_via(ssh_access(daemon), "bad", timeout=5)
    assert str(e.value) == "unknown command 'bad'"


def test_ssh_failing_is_one_line_naming_the_target(daemon, fake_ssh):
    (fake_ssh / "ssh").write_text("#!/bin/sh\necho 'debug noise' >&2\n"
                                  "echo 'root@db2.example.com: Permission denied (publickey).'"
                                  " >&2\nexit 255\n")
    with pytest.raises(control.ControlError) as e:
        control.request_via(ssh_access(daemon), "status", timeout=5)
    assert str(e.value) == ("ssh root@db2.example.com: root@db2.example.com: Permission "
                            "denied (publickey).")


def test_no_remusdb_on_the_far_host_is_one_line_saying_what_to_install(daemon, fake_ssh):
    """The shell there found no remusdb (exit 127): the same line a
    forwarded verb gives (Control.ssh_failure), not a bare exit status."""
    (fake_ssh / "ssh").write_text("#!/bin/sh\necho 'sh: 1: remusdb: not found' >&2\n"
                                  "exit 127\n")
    with pytest.raises(control.ControlError) as e:
        control.request_via(ssh_access(daemon), "status", timeout=5)
    assert str(e.value).startswith("root@db2.example.com: cannot run ")
    assert "(exit 127: sh: 1: remusdb: not found): install remusdb there" in str(e.value)


def test_status_shows_every_host_reachable_or_not(daemon, fake_ssh, tmp_path):
    f = tmp_path / "cluster.yml"
    f.write_text(f"""hosts:
  - name: here
    replication: 192.0.2.1:7788
    control: {{via: local, socket: {daemon}}}
  - name: there
    replication: 192.0.2.2:7788
    control: {{via: ssh, target: root@192.0.2.2, socket: {daemon}, command: {REMUSDB}}}
  - name: gone
    replication: 192.0.2.3:7788
    control: {{via: ssh, target: root@192.0.2.3, socket: {tmp_path}/gone.sock,
              command: {REMUSDB}}}
""")
    r = subprocess.run([str(REMUSDB), "status", "--cluster", str(f)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "host here: remusdbd" and lines[1] == "  no VMs"
    assert lines[2] == "host there: remusdbd" and lines[3] == "  no VMs"
    assert lines[4].startswith(f"host gone: unreachable (ssh root@192.0.2.3, socket "
                               f"{tmp_path}/gone.sock): remusdbd is not running")
    # --host takes any host of the file, and only those.
    r = subprocess.run([str(REMUSDB), "--cluster", str(f), "status", "--host", "there"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.splitlines()[0] == "host there: remusdbd"
    r = subprocess.run([str(REMUSDB), "--cluster", str(f), "status", "--host", "primary"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.strip() == (
        f"remusdb: error: {f} names no host 'primary': the hosts are here, there, gone")


def test_a_backup_is_a_host_of_the_cluster_an_address_or_a_dns_name(tmp_path):
    from remusdb import protection
    f = tmp_path / "cluster.yml"
    f.write_text("hosts:\n  - {name: db2, replication: 'localhost:7799', "
                 "control: {via: local}}\n")
    cluster.use(f)
    try:
        assert protection.parse_backup("db2") == "127.0.0.1:7799"
        assert protection.parse_backup("db2:7000") == "127.0.0.1:7000"
        assert protection.parse_backup("192.0.2.7") == "192.0.2.7:7788"
        assert protection.parse_backup("localhost:7001") == "127.0.0.1:7001"
        assert protection.host_of("127.0.0.1:7799") == "db2"
        with pytest.raises(protection.ProtectionError) as e:
            protection.parse_backup("no-such-host.invalid")
        assert "is not a host of the cluster (hosts of" in str(e.value)
        with pytest.raises(protection.ProtectionError) as e:
            protection.parse_backup("db2:99999")
        assert "bad backup port in 'db2:99999'" in str(e.value)
    finally:
        cluster.use(None)


def test_protect_reads_a_remote_vms_command_line_through_ssh(daemon, fake_ssh, tmp_path,
                                                             monkeypatch):
    """vm_meta of a host reached through ssh: `remusdb vm-meta` there reads
    the VM's vm.json and its QEMU's liveness in that host's run directory
    (here REMUSDB_RUN, which the far side's process inherits), and
    protect sends that host's run directory to its daemon."""
    from remusdb import protection
    run = tmp_path / "far-run"
    monkeypatch.setenv("REMUSDB_RUN", str(run))
    vm_dir = run / "there" / "vms" / "db"
    vm_dir.mkdir(parents=True)
    (vm_dir / "vm.json").write_text(json.dumps({"command": ["qemu-system-x86_64", "-name",
                                                            "db"]}))
    # A process whose command line says qemu stands in for the VM's QEMU.
    fake_qemu = tmp_path / "qemu-stand-in"
    os.symlink("/bin/sleep", fake_qemu)
    proc = subprocess.Popen([str(fake_qemu), "60"])
    f = tmp_path / "cluster.yml"
    f.write_text(f"hosts:\n  - name: there\n    replication: 192.0.2.2:7788\n"
                 f"    control: {{via: ssh, target: root@192.0.2.2, socket: {daemon}, "
                 f"command: {REMUSDB}}}\n")
    cluster.use(f)
    try:
        (vm_dir / "qemu.pid").write_text(f"{proc.pid}\n")
        meta = protection.vm_meta("there", "db")
        assert meta["command"] == ["qemu-system-x86_64", "-name", "db"]
        assert meta["run_dir"] == str(vm_dir)
        # Control: the far side's QEMU gone: refused, naming the host.
        proc.kill()
        proc.wait()
        with pytest.raises(protection.ProtectionError) as e:
            protection.vm_meta("there", "db")
        assert str(e.value).startswith("VM db on there is not running (its QEMU is gone)")
        (vm_dir / "vm.json").unlink()
        with pytest.raises(protection.ProtectionError) as e:
            protection.vm_meta("there", "db")
        assert f"no VM named 'db' on there (no {vm_dir}/vm.json)" in str(e.value)
    finally:
        cluster.use(None)
        proc.kill()
