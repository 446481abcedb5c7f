"""What every benchmark of remusdb-bench shares to run and report a
measurement: the lab's backup it protects to, the
head of its result, its list of checkpoint intervals, and the sequence of
a protected measurement (protect, warm up, reset the checkpoint
statistics, measure, unprotect), so that the numbers of every benchmark
cover their window the same way. Every benchmark that protects its VM to
the backup does it here: protected(), or protect() alone where the VM is
not unprotected before it is stopped (silence). Those whose numbers cover
the whole protection (silence, the compress benchmark's trace recording)
do not reset the statistics, and so do without measured_window()."""
import os
import time
from contextlib import contextmanager
from pathlib import Path

from .. import protection
from ..drill.lab import forget_ownership
from ..lab import netns, vm

# Every benchmark protects its VM on the primary to the backup host's remusdbd.
BACKUP = f"{netns.HOSTS['backup'][1]}:{vm.REPLICATION_PORT}"
PROTECT_TIMEOUT_S = 900


def result_head(benchmark, accel):
    """The first fields of a benchmark's result: what ran, when, on what."""
    return {"benchmark": benchmark, "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "accel": accel, "guest": {"vcpus": 1, "memory_mib": 1024, "pgbench_scale": 5}}


def csv_ints(text):
    """"1,2,4" -> [1, 2, 4]; "" -> []."""
    return [int(x) for x in text.split(",") if x.strip()]


def intervals(text):
    """argparse type of --intervals MS,MS,...: checkpoint intervals in range."""
    values = [int(x) for x in text.split(",") if x.strip()]
    lo, hi = protection.INTERVAL_MS_RANGE
    bad = [v for v in values if not lo <= v <= hi]
    if not values or bad:
        raise ValueError(f"intervals must be in {lo}..{hi} ms: {text!r}")
    return values


@contextmanager
def protected(vm_name, interval_ms, progress=None, options=None, output_commit=True,
              on_failed_try=None):
    """The VM protected to BACKUP every interval_ms for the with-block
    (entered once it is protected, see protect()), unprotected after it,
    also when the block fails."""
    protect(vm_name, interval_ms, progress=progress, options=options,
            output_commit=output_commit, on_failed_try=on_failed_try)
    try:
        yield
    finally:
        protection.unprotect(vm_name)


def protect(vm_name, interval_ms, progress=None, options=None, output_commit=True,
            on_failed_try=None):
    """Protects the VM to BACKUP every interval_ms and waits until it is
    protected. The witness's record of the VM's last owner goes first: a
    benchmark's VM is a fresh one under a reused name. options: more
    protect fields (e.g. {"compress": False}, {"trace_pages": PATH}).
    on_failed_try(error): given, a first try that fails with a
    ProtectionError is followed by on_failed_try and one more try (see
    clear_backup); not given, the error is raised."""
    tries = 2 if on_failed_try else 1
    for attempt in range(1, tries + 1):
        forget_ownership(vm_name)
        try:
            protection.protect(vm_name, BACKUP, interval_ms, output_commit=output_commit,
                               options=options)
            protection.wait_protected(vm_name, "primary", PROTECT_TIMEOUT_S, progress=progress)
            return
        except protection.ProtectionError as e:
            if attempt == tries:
                raise
            on_failed_try(e)


def clear_backup(vm_name):
    """The backup host without a QEMU of the VM, for a second try of
    protect(): an `unprotect` that landed in the middle of a checkpoint
    once left the backup taking the VM over (the primary's close sent an
    RST that dropped its BYE; it now half-closes and waits, see
    repl_conn_finish), and the backup refuses to protect a VM it runs."""
    if protection.qemu_running("backup", vm_name):
        vm.stop(vm_name, "backup")
    time.sleep(2)


def measured_window(vm_name, warm_up, measure):
    """warm_up() (None: nothing; it may also read a clock), then the
    primary's checkpoint statistics start again from zero and measure()
    runs. Returns what measure() returned and the primary's protection
    status read right after it, whose statistics cover that window only."""
    if warm_up is not None:
        warm_up()
    protection.reset_stats(vm_name)
    measured = measure()
    return measured, protection.primary_protection("primary", vm_name)


def cpu_seconds(pids):
    """User + system CPU seconds the processes used so far (their own
    threads; a process gone meanwhile counts nothing)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
            total += int(fields[11]) + int(fields[12])
        except (OSError, ValueError, IndexError):
            pass
    return total / tick
