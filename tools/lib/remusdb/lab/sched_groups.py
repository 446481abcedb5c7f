"""Scheduling groups of the lab's processes.

Under autogroup (sched(7), "The autogroup feature"; on in Debian's
kernels) the kernel shares the CPU between sessions first: each session is
a group with a nice value of its own, and a thread's nice orders it only
among its own session's threads. remusdbd and every daemonized QEMU run in
sessions of their own, so what weighs one against another is their
groups' nice values (/proc/PID/autogroup), which remusdbd sets for itself
(dom0-daemon/src/base/sched_group.h)."""
import ctypes
import os
import struct
from pathlib import Path


def autogroup_in_use():
    """Whether the kernel schedules each session as a group of its own
    (sched_autogroup_enabled): then a process's nice value orders it only
    among its session's threads, and its group's nice is what counts
    against the other sessions (sched(7), "The autogroup feature")."""
    try:
        return Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip() == "1"
    except OSError:
        return False


def autogroup_nice(pid):
    """The nice value of pid's autogroup ("/autogroup-N nice V"), or None
    for a process in the init session (session 0, as under a container's
    init that never called setsid): the kernel prints nothing for it, its
    group being the root, which has no autogroup."""
    words = Path(f"/proc/{pid}/autogroup").read_text().split()
    return int(words[-1]) if words else None


class group_niced:
    """The scheduling groups of pids at nice `value` inside the block, as
    they were after it. Under autogroup the group is the process's session
    (remusdbd and each daemonized QEMU have one of their own), and the
    group's nice is what weighs against the other sessions; a thread's own
    nice would only order it against its own session's threads. Without
    autogroup every thread is niced instead."""

    def __init__(self, pids, value):
        self.pids, self.value, self.before = list(pids), value, {}
        self.kind = "autogroup" if autogroup_in_use() else "threads"

    def _threads(self):
        for pid in self.pids:
            try:
                yield from (int(t) for t in os.listdir(f"/proc/{pid}/task"))
            except OSError:
                pass  # ended meanwhile

    def __enter__(self):
        if self.kind == "autogroup":
            for pid in self.pids:
                before = autogroup_nice(pid)
                if before is None:
                    continue  # the root group: its weight cannot be set
                self.before[pid] = before
                Path(f"/proc/{pid}/autogroup").write_text(f"{self.value}\n")
        else:
            for tid in self._threads():
                try:
                    self.before[tid] = os.getpriority(os.PRIO_PROCESS, tid)
                    os.setpriority(os.PRIO_PROCESS, tid, self.value)
                except OSError:
                    pass
        return self

    def __exit__(self, *exc):
        for who, prio in self.before.items():
            try:
                if self.kind == "autogroup":
                    Path(f"/proc/{who}/autogroup").write_text(f"{prio}\n")
                else:
                    os.setpriority(os.PRIO_PROCESS, who, prio)
            except OSError:
                pass  # ended meanwhile


# ---- slices (EEVDF's latency hint) ------------------------------------------

_SYS_SCHED_SETATTR, _SYS_SCHED_GETATTR = 314, 315  # x86_64
_SCHED_ATTR = "IIQiIQQQII"  # struct sched_attr, 56 bytes (SCHED_ATTR_SIZE_VER1)


_libc = ctypes.CDLL(None, use_errno=True)


def sched_attr(tid):
    """(policy, nice, priority, slice_ns) of thread tid."""
    buf = ctypes.create_string_buffer(struct.calcsize(_SCHED_ATTR))
    if _libc.syscall(_SYS_SCHED_GETATTR, tid, buf, len(buf), 0) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"sched_getattr({tid}): {os.strerror(e)}")
    _, policy, _, nice, prio, runtime, *_ = struct.unpack(_SCHED_ATTR, buf.raw)
    return policy, nice, prio, runtime


def set_slice(tid, slice_ns):
    """The thread's EEVDF slice (sched_attr.sched_runtime for SCHED_OTHER,
    Linux 6.12 and later): a shorter one gives its wakeups an earlier
    deadline, so they preempt sooner, without changing its share of the
    CPU. Its nice value is kept; real-time threads are left alone."""
    policy, nice, prio, _ = sched_attr(tid)
    if policy != 0:  # SCHED_FIFO/RR (the heartbeats), SCHED_BATCH, ...
        return False
    buf = struct.pack(_SCHED_ATTR, struct.calcsize(_SCHED_ATTR), policy, 0, nice, prio,
                      slice_ns, 0, 0, 0, 0)
    if _libc.syscall(_SYS_SCHED_SETATTR, tid, ctypes.c_char_p(buf), 0) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"sched_setattr({tid}): {os.strerror(e)}")
    return True


class short_slices:
    """Every SCHED_OTHER thread of pids at a slice of slice_ns inside the
    block, as it was after it."""

    def __init__(self, pids, slice_ns):
        self.pids, self.slice_ns, self.before = list(pids), slice_ns, {}

    def __enter__(self):
        for pid in self.pids:
            for t in os.listdir(f"/proc/{pid}/task"):
                tid = int(t)
                try:
                    before = sched_attr(tid)[3]
                    if set_slice(tid, self.slice_ns):
                        self.before[tid] = before
                except OSError:
                    pass  # ended meanwhile
        return self

    def __exit__(self, *exc):
        for tid, ns in self.before.items():
            try:
                set_slice(tid, ns)
            except OSError:
                pass
