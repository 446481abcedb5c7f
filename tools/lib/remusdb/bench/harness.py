"""What every benchmark of remusdb-bench shares to run and report a
measurement: the lab's backup it protects to, its progress lines, the
head of its result, its list of checkpoint intervals, and the sequence of
a protected measurement (protect, warm up, reset the checkpoint
statistics, measure, unprotect), so that the numbers of every benchmark
cover their window the same way."""
import time
from contextlib import contextmanager

from .. import protection
from ..drill.lab import forget_ownership
from ..lab import netns, vm

# Every benchmark protects its VM on the primary to the backup host's remusdbd.
BACKUP = f"{netns.HOSTS['backup'][1]}:{vm.REPLICATION_PORT}"
PROTECT_TIMEOUT_S = 900


def say(bench, msg):
    """One progress line, named after the benchmark: say("bench remus", ...)."""
    print(f"[{bench}] {msg}", flush=True)


def result_head(benchmark, accel):
    """The first fields of a benchmark's result: what ran, when, on what."""
    return {"benchmark": benchmark, "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "accel": accel, "guest": {"vcpus": 1, "memory_mib": 1024, "pgbench_scale": 5}}


def intervals(text):
    """argparse type of --intervals MS,MS,...: checkpoint intervals in range."""
    values = [int(x) for x in text.split(",") if x.strip()]
    lo, hi = protection.INTERVAL_MS_RANGE
    bad = [v for v in values if not lo <= v <= hi]
    if not values or bad:
        raise ValueError(f"intervals must be in {lo}..{hi} ms: {text!r}")
    return values


@contextmanager
def protected(vm_name, interval_ms, progress=None, options=None):
    """The VM protected to BACKUP every interval_ms for the with-block
    (entered once it is protected), unprotected after it, also when the
    block fails. The witness's record of the VM's last owner goes first:
    a benchmark's VM is a fresh one under a reused name."""
    forget_ownership(vm_name)
    protection.protect(vm_name, BACKUP, interval_ms, options=options)
    protection.wait_protected(vm_name, "primary", PROTECT_TIMEOUT_S, progress=progress)
    try:
        yield
    finally:
        protection.unprotect(vm_name)


def measured_window(vm_name, warm_up, measure):
    """warm_up(), then the primary's checkpoint statistics start again from
    zero and measure() runs. Returns what measure() returned and the
    primary's protection status right after it, whose statistics cover
    that window only."""
    warm_up()
    protection.reset_stats(vm_name)
    measured = measure()
    return measured, protection.primary_protection("primary", vm_name)
