"""`tools/remusdb-vm stop` on a host whose remusdbd is down, as after a
power cut before the daemon came back: the stop must really forget the
VM (remove the definition the daemon persisted and would reload), or say
in one line that it could not and exit non-zero.

The sequence: the VM's QEMU is SIGKILLed (a power cut); a daemon that
lives but does not answer (SIGSTOPped) gets a refusal and keeps its
definition; the daemon is SIGKILLed too; control: a daemon started now
reloads the VM (the trap itself); after a stop with the daemon down, a
daemon started again holds nothing of the VM, and `start --fresh` is not
refused."""
import os
import signal
import subprocess
from pathlib import Path

from remusdb.lab import vm
from remusdb.drill.inject import wait_gone
from polling import wait_for

REPO = Path(__file__).resolve().parents[2]
REMUSDB_VM = REPO / "tools" / "remusdb-vm"


def remusdb_vm(*args):
    r = subprocess.run([str(REMUSDB_VM), *args], capture_output=True, text=True, timeout=600)
    print(f"$ remusdb-vm {' '.join(args)} -> {r.returncode}\n{r.stdout[-2000:]}"
          f"{r.stderr[-2000:]}")
    return r


def power_cut_daemon(host):
    pid = vm.daemon_pid(host)
    assert pid
    os.kill(pid, signal.SIGKILL)
    wait_gone([pid])
    assert not vm.daemon_running(host)


def test_stop_with_the_daemon_down_forgets_the_vm(db_vm):
    name, host = db_vm["name"], db_vm["host"]
    definition, marker, settings = vm.persisted_files(host, name)
    assert vm.held_definition(host, name) and definition.exists()
    # The host loses power: its QEMU first (a stopped daemon would hold up
    # a QEMU that quits, on its disk's last flush).
    qemu = vm.running_pid(vm.vm_files(host, name))
    os.kill(qemu, signal.SIGKILL)
    wait_gone([qemu])

    pid = vm.daemon_pid(host)
    os.kill(pid, signal.SIGSTOP)
    try:
        r = remusdb_vm("stop", name, "--host", host)
    finally:
        os.kill(pid, signal.SIGCONT)
    assert r.returncode == 1, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("remusdb-vm: "), r.stderr
    assert "does not answer" in lines[0] and "stopped on" not in r.stderr, r.stderr
    assert definition.exists()
    assert vm.held_definition(host, name)  # it answers again, still holding the VM

    power_cut_daemon(host)
    vm.ensure_daemon(host)
    assert vm.held_definition(host, name)  # control: the trap; a restart brings it back
    power_cut_daemon(host)

    r = remusdb_vm("stop", name, "--host", host)
    assert r.returncode == 0, r.stderr
    assert f"removed what it persisted of {name}" in r.stderr and str(definition) in r.stderr
    assert not definition.exists() and not marker.exists() and not settings.exists()
    vm.ensure_daemon(host)
    assert vm.held_definition(host, name) is None

    r = remusdb_vm("start", name, "--host", host, "--fresh", "--no-wait")
    assert r.returncode == 0, r.stderr
    wait_for(lambda: vm.held_definition(host, name), 30, "the fresh VM to be added")
    r = remusdb_vm("stop", name, "--host", host)
    assert r.returncode == 0, r.stderr
