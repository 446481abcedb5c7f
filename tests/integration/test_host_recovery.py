"""Host recovery, as a new operator meets it: the primary host dies during
the initial disk copy (its QEMU and remusdbd killed at once, as a power
cut would); the backup rightly refuses to take over; the host comes back.

What must hold: the restarted remusdbd shows the VM's QEMU as gone, never
as running; `tools/remusdb-vm start` restarts the VM from its own disk
when etcd says this host owns it, and refuses in one line (no traceback,
nothing started) when etcd names the other host; `remusdb forget`
retires the backup's dead replica."""
import os
import signal
import subprocess
from pathlib import Path

from remusdb import paths, protection
from remusdb import ownership
from remusdb.lab import vm, workload
from remusdb.drill.lab import forget_ownership, stop_vm_everywhere
from remusdb.drill.lab import ensure_witness
from polling import wait_for

REPO = Path(__file__).resolve().parents[2]
TOOLS = REPO / "tools"
NAME = "hrec"
IP = "10.77.0.15"


def tool(*args):
    r = subprocess.run([str(TOOLS / args[0]), *args[1:]],
                       capture_output=True, text=True, timeout=900)
    print(f"$ {' '.join(args)} -> {r.returncode}\n{r.stdout[-1500:]}{r.stderr[-1500:]}")
    return r


def held_state(host):
    v = vm.held_definition(host, NAME)
    return v and v.get("run_state")


def test_a_primary_killed_during_the_disk_copy_comes_back(lab):
    ensure_witness()
    stop_vm_everywhere(NAME)
    forget_ownership(NAME)
    # A fresh disk, restored from the saved guest rather than booted
    # (conftest.py): the boot this test is about is the restart below.
    files = vm.start(NAME, "primary", ip=IP, from_saved=True, wait_timeout=400)
    try:
        # one connection (each costs ~0.4 s to the TCG guest), one transaction
        workload.psql(IP, "CREATE TABLE hrec_mark (v int); INSERT INTO hrec_mark VALUES (1)")
        vm.ensure_daemon("backup")
        protection.protect(NAME, "10.77.0.2:7788", 100)
        wait_for(lambda: (protection.primary_protection("primary", NAME) or {}).get("state")
                 == "syncing", 120, "the initial copy to start")
        # The primary host dies mid-copy: QEMU and remusdbd at once, no goodbye.
        daemon_pid = int((paths.host_run_dir("primary") / "remusdbd.pid").read_text())
        os.kill(vm.running_pid(files), signal.SIGKILL)
        os.kill(daemon_pid, signal.SIGKILL)
        replica = wait_for(lambda: (r := protection.replica("backup", NAME)) and
                           r["state"] in ("failed", "passive", "active") and r, 60,
                           "the backup to settle")
        assert replica["state"] != "active", replica  # no complete replica: no takeover

        # The host comes back: its remusdbd loads the VM and says no QEMU runs it.
        vm.ensure_daemon("primary")
        try:
            wait_for(lambda: held_state("primary") == "no-qemu", 20, "run state no-qemu")
        except AssertionError:
            log = paths.host_run_dir("primary") / "remusdbd.log"
            tail = [li for li in log.read_text(errors="replace").splitlines()
                    if NAME in li][-40:]
            print(f"held: {vm.held_definition('primary', NAME)}\n" + "\n".join(tail))
            raise
        # Its kept settings would protect it again, but nothing runs to protect:
        # the tries fail on the missing QEMU, and no disk copy starts.
        prot = wait_for(lambda: (p := protection.primary_protection("primary", NAME)) and
                        "no QEMU runs the VM here" in
                        ((p.get("reprotect") or {}).get("last_error") or "") and p,
                        20, "a re-protection try refused for want of QEMU")
        assert prot["state"] == "unprotected", prot
        st = tool("remusdb", "status", "--host", "primary")
        assert st.returncode == 0
        line = next(li for li in st.stdout.splitlines() if f"VM {NAME}:" in li)
        assert "state=no-qemu" in line and "QEMU IS NOT RUNNING" in line, line

        # etcd names the backup (as after its takeover): refused, one line, nothing started.
        ownership.set_owner(NAME, "backup", 999)
        r = tool("remusdb-vm", "start", NAME, "--host", "primary", "--ip", IP)
        assert r.returncode == 1
        assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert "etcd says backup owns it" in r.stderr and "remusdb protect" in r.stderr
        assert not vm.running_pid(files) and held_state("primary") == "no-qemu"

        # etcd names this host: the VM restarts from its own disk, data and all.
        ownership.set_owner(NAME, "primary", 1000)
        r = tool("remusdb-vm", "start", NAME, "--host", "primary", "--ip", IP)
        assert r.returncode == 0, r.stderr
        assert "restarting it from its own disk" in r.stderr
        assert workload.psql(IP, "SELECT count(*) FROM hrec_mark") == "1"
        wait_for(lambda: held_state("primary") == "running", 20, "run state running")
        # Started again while it runs: re-attached, not a second QEMU.
        r = tool("remusdb-vm", "start", NAME, "--host", "primary", "--ip", IP)
        assert r.returncode == 0 and "re-attached" in r.stderr, r.stderr

        # The backup's replica of the dead protection: retired on demand.
        r = tool("remusdb", "forget", NAME, "--host", "backup")
        assert r.returncode == 0, r.stderr
        assert protection.replica("backup", NAME) is None
        r = tool("remusdb", "forget", NAME, "--host", "backup")
        assert r.returncode == 1 and f"no replica of {NAME}" in r.stderr
        assert "Traceback" not in r.stderr
    finally:
        stop_vm_everywhere(NAME)
        forget_ownership(NAME)
