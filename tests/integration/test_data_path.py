"""The unprotected data path: a PostgreSQL guest whose disk (NBD) and NIC
(stream socket <-> tap) both pass through remusdbd on the primary host."""
import os
import signal
import socket
import struct
import time

from remusdb import control, paths
from remusdb.lab import vm, workload
from peers import closed_by_peer
from nbd_client import REQUEST_MAGIC, handshake, recv_exact
from polling import acked_count, wait_for_acks


def daemon_status(host="primary"):
    reply = control.request(paths.control_socket(host), "status")
    return {v["name"]: v for v in reply["vms"]}


def thread_bytes_written(pid, name):
    """wchar (bytes written by system calls) of pid's threads called name."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                if f.read().strip() != name:
                    continue
            with open(f"/proc/{pid}/task/{tid}/io") as f:
                total += int(dict(line.split(": ") for line in f.read().splitlines())["wchar"])
        except FileNotFoundError:
            pass  # the thread ended meanwhile
    return total


def test_pgbench_through_relay_and_nbd(db_vm):
    before = daemon_status()[db_vm["name"]]
    daemon = control.request(paths.control_socket("primary"), "ping")["pid"]
    worker_written = thread_bytes_written(daemon, "remusdb-nbd")
    # The verdict needs a load that went through remusdbd, not a long one:
    # pgbench's numbers and the daemon's counters are checked, never its speed.
    r = workload.pgbench(db_vm["ip"], seconds=5, clients=4)
    assert r["exit_code"] == 0, r["output"]
    assert r["tps"] and r["tps"] > 0
    assert r["transactions"] > 0
    assert (r["failed"] or 0) == 0
    print(f"pgbench through remusdbd: {r['tps']:.1f} TPS, {r['latency_ms']:.1f} ms average")
    after = daemon_status()[db_vm["name"]]
    disk, nic = after["disks"][0], after["nics"][0]
    # the load really went through remusdbd: its counters moved
    assert disk["writes"] > before["disks"][0]["writes"]
    assert disk["bytes_written"] > before["disks"][0]["bytes_written"]
    # ...and its writes were made by the connection's worker thread, off
    # the event loop (nbd_io_batch.c): that thread's own write count grew
    # by at least the bytes the guest wrote.
    worker_written = thread_bytes_written(daemon, "remusdb-nbd") - worker_written
    assert worker_written >= disk["bytes_written"] - before["disks"][0]["bytes_written"], \
        worker_written
    assert nic["connected"]
    assert nic["frames_from_guest"] > before["nics"][0]["frames_from_guest"]
    assert nic["frames_to_guest"] > before["nics"][0]["frames_to_guest"]
    rc, text = workload.amcheck(db_vm["ip"])
    assert rc == 0, text


def test_daemon_sigkill_and_restart_loses_nothing(db_vm, tmp_path):
    ledger_file = tmp_path / "ledger.txt"
    # Planned long enough for both waits below; ended (SIGUSR1, ledger.py)
    # as soon as they are met, or when one of them fails.
    ledger = workload.start_ledger(db_vm["ip"], ledger_file, seconds=150)
    try:
        wait_for_acks(ledger_file, 30, timeout=60)
        pid = control.request(paths.control_socket("primary"), "ping")["pid"]
        acked_before_kill = acked_count(ledger_file)
        os.kill(pid, signal.SIGKILL)
        time.sleep(0.5)
        vm.ensure_daemon("primary")  # loads the persisted VM definitions
        # the load goes on: new commits are acknowledged after the restart
        wait_for_acks(ledger_file, acked_before_kill + 30, timeout=60)
    finally:
        if ledger.poll() is None:
            ledger.send_signal(signal.SIGUSR1)
        out, _ = ledger.communicate(timeout=120)
    assert ledger.returncode == 0, out
    status = daemon_status()[db_vm["name"]]
    assert status["disks"][0]["connections"] >= 1, "QEMU's NBD client did not reconnect"
    assert status["nics"][0]["connected"], "QEMU's stream netdev was not reconnected"
    assert vm.status(db_vm["name"], "primary")["run_state"] == "running"
    acked = workload.ledger_acked_ids(ledger_file)
    missing = workload.missing_acked(db_vm["ip"], acked)
    print(f"ledger: {len(acked)} commits acknowledged ({acked_before_kill} before the "
          f"SIGKILL), {len(missing)} missing; {out.strip().splitlines()[-1]}")
    assert missing == []
    workload.psql(db_vm["ip"], "CHECKPOINT", check=False)
    rc, text = workload.amcheck(db_vm["ip"])
    assert rc == 0, text


def test_malformed_nbd_peers_are_closed_and_daemon_survives(db_vm):
    nbd = str(vm.vm_files("primary", db_vm["name"])["nbd"])
    # bad request magic after a valid handshake: that connection is closed
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(10)
        s.connect(nbd)
        handshake(s, db_vm["name"])
        s.sendall(struct.pack(">IHHQQI", 0xDEADBEEF, 0, 0, 1, 0, 512))
        assert closed_by_peer(s)
    # a write whose payload never arrives: the peer vanishes mid-request
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(10)
        s.connect(nbd)
        handshake(s, db_vm["name"])
        s.sendall(struct.pack(">IHHQQI", REQUEST_MAGIC, 0, 1, 2, 1 << 40, 4096) + b"x" * 100)
    # garbage instead of a handshake
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(10)
        s.connect(nbd)
        recv_exact(s, 18)
        s.sendall(b"\xff" * 64)
        assert closed_by_peer(s)
    # the daemon is alive, says what happened, and the guest still works
    assert control.reachable(paths.control_socket("primary"))
    assert workload.psql(db_vm["ip"], "SELECT 1") == "1"
    log = (paths.host_run_dir("primary") / "remusdbd.log").read_text()
    assert "magic" in log.lower()


def test_control_socket_rejects_bad_requests(db_vm):
    sock_path = str(paths.control_socket("primary"))
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(10)
        s.connect(sock_path)
        f = s.makefile("rwb")
        for line in (b"{not json\n", b'{"cmd": "no-such-command"}\n', b'{"cmd": "vm-add"}\n'):
            f.write(line)
            f.flush()
            reply = f.readline()
            assert b'"ok": false' in reply or b'"ok":false' in reply, reply
        f.write(b'{"cmd": "ping"}\n')
        f.flush()
        assert b"true" in f.readline()


def test_guest_agent_and_qmp_are_exposed(db_vm):
    files = vm.vm_files("primary", db_vm["name"])
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(30)
        s.connect(str(files["qga"]))
        f = s.makefile("rwb")
        # guest-sync flushes anything stale on the channel and echoes our id
        f.write(b'{"execute": "guest-sync", "arguments": {"id": 4242}}\n')
        f.flush()
        assert b"4242" in f.readline()
        f.write(b'{"execute": "guest-info"}\n')
        f.flush()
        assert b'"version"' in f.readline()
    info = vm.status(db_vm["name"], "primary")
    assert info["run_state"] == "running"
    assert info["accel"] in ("kvm", "tcg")
