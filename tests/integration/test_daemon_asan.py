"""Both hosts' remusdbd under ASan+UBSan through a real protection and a
manual takeover: boot a VM on the primary, protect it to the backup at a
short interval, let epochs commit under a commit ledger, `remusdb
failover` it (the backup runs the fencing command, then the VM), check
that the VM answers on the backup with every acknowledged commit, then
shut both daemons down through their control sockets.  Every sanitizer
report goes to a file (ASAN_OPTIONS/UBSAN_OPTIONS log_path); the test
passes only when there is none and both daemons exited 0.

The unit tests run under ASan and valgrind too, but only here do the
replication server, protection, the fence child and the takeover run
together in the real daemon, with real QEMU on both ends.

The VM is restored from its saved guest rather than booted (conftest.py):
the daemon sees the same vm-add, NBD export and QMP as for a boot, and
the test saves the half minute of a TCG boot. The ledger runs 8 s, long
enough for its connections to commit while the epochs go by (the
40 epochs are waited for on their own)."""
import os
import subprocess
from pathlib import Path

from remusdb import control, paths, protection
from remusdb.lab import vm, workload
from remusdb.drill.lab import forget_ownership, stop_vm_everywhere
from polling import wait_for

REPO = Path(__file__).resolve().parents[2]
ASAN_BINARY = REPO / "dom0-daemon" / "build" / "remusdbd-asan"
REMUSDB = REPO / "tools" / "remusdb"
NAME = "asan"
BACKUP_ADDRESS = "10.77.0.2:7788"
INTERVAL_MS = 50
EPOCHS_BEFORE_FAILOVER = 40
LEDGER_S = 8


def build_asan_daemon():
    """The test builds what it runs, so `make test` needs no extra step."""
    r = subprocess.run(["make", "-s", "-C", str(REPO / "dom0-daemon"), "build/remusdbd-asan"],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, f"building remusdbd-asan failed:\n{r.stdout}\n{r.stderr}"
    assert ASAN_BINARY.exists()


def start_daemon(host, reports, **extra_env):
    """Starts host's remusdbd from the ASan build through vm.ensure_daemon
    (REMUSDBD_BINARY), with the sanitizer reports sent to files in
    reports; the environment is put back afterwards, so that nothing
    started later (QEMU, other tests' daemons) gets it."""
    env = {
        "REMUSDBD_BINARY": str(ASAN_BINARY),
        "ASAN_OPTIONS": f"log_path={reports}/asan-{host}:detect_leaks=1",
        "UBSAN_OPTIONS": f"log_path={reports}/ubsan-{host}:print_stacktrace=1",
        **extra_env,
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        proc = vm.ensure_daemon(host)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    assert proc is not None, f"a remusdbd was still running on {host}"
    # ip netns exec and nice exec in turn: the process is the daemon itself.
    assert os.readlink(f"/proc/{proc.pid}/exe") == str(ASAN_BINARY)
    return proc



def epochs_committed():
    r = protection.replica("backup", NAME)
    return (r or {}).get("epochs_committed", 0)


def shut_down(host, proc):
    """Through the control socket, as an operator would; returns the exit
    status (LeakSanitizer runs at exit and sets it on a leak)."""
    control.request(paths.control_socket(host), "shutdown")
    return proc.wait(timeout=120)


def sanitizer_reports(reports):
    found = {}
    for f in sorted(reports.iterdir()):
        if f.stat().st_size > 0:
            found[f.name] = f.read_text(errors="replace")[-6000:]
    return found


def test_protection_and_failover_with_both_daemons_under_asan(lab, tmp_path):
    build_asan_daemon()
    reports = tmp_path / "sanitizer"
    reports.mkdir()
    fenced = tmp_path / "fenced.txt"
    fence = tmp_path / "fence.sh"
    fence.write_text(f'#!/bin/sh\necho "$REMUSDB_VM $REMUSDB_PRIMARY" >> {fenced}\n')
    fence.chmod(0o755)

    stop_vm_everywhere(NAME)
    forget_ownership(NAME)
    vm.stop_daemon("primary")
    vm.stop_daemon("backup")
    procs = {}
    try:
        procs["primary"] = start_daemon("primary", reports)
        procs["backup"] = start_daemon("backup", reports,
                                       REMUSDBD_EXTRA_ARGS=f"--fence-command {fence}")
        vm.start(NAME, "primary", from_saved=True, wait_timeout=400)
        protection.protect(NAME, BACKUP_ADDRESS, INTERVAL_MS)
        protection.wait_protected(NAME, timeout=900)

        # A fork from the backup's committed image (its page source: a
        # fork() of the ASan daemon), left waiting for its clone through
        # the epochs and the takeover below: the commits preserve into its
        # disk snapshot, and the takeover hands it to the VM's export.
        backup_sock = paths.control_socket("backup")
        f = control.request(backup_sock, "fork-start", vm=NAME, clones=1)["fork"]
        assert f["from"] == "backup" and f["state"] == "serving", f

        ledger_file = tmp_path / "ledger.txt"
        ledger = workload.start_ledger(vm.DEFAULT_IP, ledger_file, LEDGER_S)
        first = epochs_committed()
        wait_for(lambda: epochs_committed() >= first + EPOCHS_BEFORE_FAILOVER, 300,
                 f"{EPOCHS_BEFORE_FAILOVER} epochs to commit on the backup")
        ledger.wait(timeout=120)
        acked = workload.ledger_acked_ids(ledger_file)
        assert acked, "no commit was acknowledged while protected"
        print(f"{epochs_committed()} epochs committed, {len(acked)} commits acknowledged")

        r = subprocess.run([str(REMUSDB), "failover", NAME,
                            "--timeout", "180"], capture_output=True, text=True, timeout=300)
        print(r.stdout, r.stderr)
        assert r.returncode == 0, r.stderr
        assert protection.replica("backup", NAME)["state"] == "active"
        assert (paths.vm_run_dir("backup", NAME) / "qemu.pid").exists()

        # The VM answers from the backup, with every acknowledged commit.
        vm.wait_for_postgres(vm.DEFAULT_IP, 120)
        assert workload.missing_acked(vm.DEFAULT_IP, acked) == []
        assert fenced.read_text() == f"{NAME} primary\n"
        log = (paths.host_run_dir("backup") / "remusdbd.log").read_text()
        assert f"vm {NAME}: fencing command '{fence}' succeeded" in log
        assert "the taken-over VM's writes now preserve the snapshot" in log
        fork_now = protection.replica("backup", NAME)["fork"]
        assert fork_now["state"] == "serving" and fork_now["pagesrc_running"], fork_now
        assert fork_now["disk"]["blocks_preserved"] > 0, fork_now["disk"]

        # Shut down with the VMs still up: every teardown path runs.
        status = {host: shut_down(host, proc) for host, proc in procs.items()}
        procs.clear()
        found = sanitizer_reports(reports)
        assert not found, "sanitizer reports:\n" + "\n".join(
            f"== {name}\n{text}" for name, text in found.items())
        assert status == {"primary": 0, "backup": 0}, status
    finally:
        for host, proc in procs.items():  # only after a failure above
            if proc.poll() is None:
                vm.stop_daemon(host)
        # Normal daemons again (the environment no longer names the ASan
        # build), so that the VM's definition is removed on both hosts.
        vm.ensure_daemon("backup")
        stop_vm_everywhere(NAME)
        vm.stop_daemon("backup")
