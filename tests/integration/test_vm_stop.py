"""`tools/remusdb-vm stop` on a host whose remusdbd is down, as after a
power cut before the daemon came back: the stop must really forget the
VM (remove the definition the daemon persisted and would reload), or say
in one line that it could not and exit non-zero.

The sequence: a daemon that lives but does not answer (SIGSTOPped) gets
a refusal and keeps its definition; the host loses power (QEMU and
remusdbd SIGKILLed); control: a daemon started now reloads the VM (the
trap itself); after a stop with the daemon down, a daemon started again
holds nothing of the VM, and `start --fresh` is not refused."""
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
    definition, marker = vm.persisted_files(host, name)
    assert vm.held_definition(host, name) and definition.exists()

    pid = vm.daemon_pid(host)
    os.kill(pid, signal.SIGSTOP)
    try:
        r = remusdb_vm("stop", name, "--host", host)
    finally:
        os.kill(pid, signal.SIGCONT)
    assert r.returncode == 1, r.stderr
    lines = r.stderr.strip().splitlines()
    assert "does not answer" in lines[-1] and "stopped on" not in r.stderr, r.stderr
    assert lines[-1].startswith("remusdb-vm: ") and len(lines) == 1, r.stderr
    assert definition.exists()
    assert vm.held_definition(host, name)  # it answers again, still holding the VM
    assert not vm.running_pid(vm.vm_files(host, name))  # QEMU went first

    power_cut_daemon(host)
    vm.ensure_daemon(host)
    assert vm.held_definition(host, name)  # control: the trap; a restart brings it back
    power_cut_daemon(host)

    r = remusdb_vm("stop", name, "--host", host)
    assert r.returncode == 0, r.stderr
    assert f"removed what it persisted of {name}" in r.stderr and str(definition) in r.stderr
    assert not definition.exists() and not marker.exists()
    vm.ensure_daemon(host)
    assert vm.held_definition(host, name) is None

    r = remusdb_vm("start", name, "--host", host, "--fresh", "--no-wait")
    assert r.returncode == 0, r.stderr
    wait_for(lambda: vm.held_definition(host, name), 30, "the fresh VM to be added")
    r = remusdb_vm("stop", name, "--host", host)
    assert r.returncode == 0, r.stderr
