"""Failback with changed-block resync, as a round trip under load:

  primary runs the VM, protected to backup; the primary loses power (no FIN
  or RST: the backup hears it only from missing heartbeats) and the backup
  takes over; the primary is repaired and the VM is protected back to it
  from the backup, which sends only the extents that may differ; then the
  backup loses power and the primary takes the VM over again, from the
  file the resync made.

The commit ledger (and pgbench) run throughout. What must hold:
- not one acknowledged commit is missing from what the PostgreSQL server
  shows after the second takeover, with >= 50 acknowledged in each phase;
- the failback was a resync, and sent well under a full copy;
- the new primary's disk file and the old primary's replica file are
  byte-identical at a held checkpoint (failback.disk_compare);
- the negative control: a resync that drops one extent
  (debug_resync_omit_extent) is caught by that same comparison.

Both tests share one VM: the negative control protects the VM, back on
the primary after the round trip, to the power-cut backup host, which is
the same failback in the other direction. Run alone, it makes that state
itself."""
import re
import time

import pytest

from remusdb.drill import failover
from remusdb import failback, paths, protection
from remusdb.lab import vm, workload
from remusdb.drill.database import amcheck, ledger_ids_in_db
from remusdb.drill.inject import remove_leftover_cut
from remusdb.drill.lab import ensure_witness, forget_ownership, stop_vm_everywhere

NAME = "fback"
IP = "10.77.0.17"
PER_PHASE = 50                # acknowledged commits each phase must have at least
PHASE_TIMEOUT_S = 300


class RoundTrip:
    """Where the shared VM is: the host running it and, once one lost
    power, the injection that cut the other one."""

    def __init__(self):
        self.runs_on = None
        self.dead = None          # the Injection of the host that lost power
        self.loads = []
        self.workdir = None
        self.full_copy_bytes = None  # what the first protection's full copy sent


@pytest.fixture(scope="module")
def trip(lab, tmp_path_factory):
    ensure_witness()
    for host in ("primary", "backup"):
        remove_leftover_cut(host=host)
    stop_vm_everywhere(NAME)
    forget_ownership(NAME)
    failback.forget_replica_files(NAME)  # hosts that never held a replica of it
    t = RoundTrip()
    t.workdir = tmp_path_factory.mktemp("failback")
    yield t
    for load in t.loads:
        load.stop()
    if t.dead is not None:
        try:
            t.dead.evidence()
        finally:
            t.dead.undo()
    stop_vm_everywhere(NAME)
    forget_ownership(NAME)


def boot_and_protect(t):
    # A fresh copy of the saved guest's disk, with no change log beside it.
    vm.start(NAME, "primary", ip=IP, from_saved=True, wait_timeout=400)
    vm.ensure_daemon("backup")
    _, p = failback.protect_back(NAME, "primary")
    copy = p.get("disk_copy") or {}
    assert copy.get("mode") == "full", copy  # a fresh disk: nothing to resync from
    t.full_copy_bytes = copy.get("bytes_sent")
    t.runs_on = "primary"


def start_load(t, seconds, tag):
    d = t.workdir / tag
    d.mkdir()
    load = failover.Load(IP, 2, seconds, d, ledger_connections=4, think_ms=failback.INTERVAL_MS)
    t.loads.append(load)
    return load


def acks_between(loads, t0, t1):
    return sum(1 for load in loads for at, _ in list(load.acks.acks) if t0 <= at < t1)


def wait_acks(loads, since, n, what):
    deadline = time.monotonic() + PHASE_TIMEOUT_S
    while acks_between(loads, since, time.time() + 1) < n:
        for load in loads:
            load.check_running()
        assert time.monotonic() < deadline, f"fewer than {n} commits acknowledged {what}"
        time.sleep(0.5)


def cut_and_take_over(t):
    """Power cut of the host running the VM; the other takes over."""
    victim = t.runs_on
    injection, at, replica = failback.power_cut(NAME, victim)
    t.dead, t.runs_on = injection, failback.other(victim)
    fo = replica.get("failover") or {}
    print(f"takeover on {t.runs_on}: {fo}")
    assert replica["state"] == "active"
    resumed = fo.get("resumed_at_unix") or time.time()
    return at, resumed


def repair_dead(t):
    evidence = failback.repair(t.dead)
    t.dead = None
    assert evidence["lan_frames_from_primary_after_cut"] == 0, evidence
    return evidence


def test_round_trip_loses_no_acknowledged_commit(trip):
    t = trip
    boot_and_protect(t)

    # Phase 1: the primary runs it; the primary loses power.
    load1 = start_load(t, 600, "load1")
    begun = time.time()
    wait_acks([load1], begun, PER_PHASE, "on the primary before the first power cut")
    cut1, resumed1 = cut_and_take_over(t)
    assert t.runs_on == "backup"

    # Phase 2: the backup runs it, unprotected until the primary is back;
    # its writes since the takeover are what the resync must send.
    wait_acks([load1], resumed1, PER_PHASE, "on the backup before the failback")
    repair_dead(t)
    seconds, p = failback.protect_back(NAME, "backup")
    copy = p.get("disk_copy") or {}
    print(f"failback: {seconds:.1f} s, disk_copy {copy}; the first full copy sent "
          f"{t.full_copy_bytes} bytes")
    assert copy.get("mode") == "resync", copy
    # well under what a full copy of this disk's data sends (holes are skipped either way)
    assert copy.get("bytes_sent") is not None and t.full_copy_bytes, (copy, t.full_copy_bytes)
    assert copy["bytes_sent"] < t.full_copy_bytes / 10, (copy, t.full_copy_bytes)
    assert copy.get("copy_seconds") is not None, copy
    base = (protection.replica("primary", NAME) or {}).get("disk_base") or {}
    assert base.get("mode") == "resync", base
    # the old primary's stopped definition went into the replica
    assert vm.held_definition("primary", NAME) is None

    protected_at = time.time()
    compare = failback.disk_compare(NAME, "backup")
    assert compare["equal"], compare
    # commits acknowledged under the resynced replica's protection
    wait_acks([load1], protected_at, PER_PHASE, "on the backup protected by the resync")

    # Phase 3: the backup loses power; the primary takes it over again.
    cut2, resumed2 = cut_and_take_over(t)
    assert t.runs_on == "primary"
    # The load goes on after each takeover until its phase has its commits.
    wait_acks([load1], resumed2, PER_PHASE, "on the primary after the second takeover")
    load1.stop()

    acked = workload.ledger_acked_ids(load1.ledger_file)
    present = ledger_ids_in_db(IP)
    assert present is not None, "the database does not answer after the second takeover"
    lost = sorted(set(acked) - present)
    phases = {"primary": acks_between([load1], 0, cut1),
              "backup before the failback": acks_between([load1], cut1, protected_at),
              "backup protected by the resync": acks_between([load1], protected_at, cut2),
              "primary again": acks_between([load1], cut2, time.time() + 1)}
    print(f"acknowledged {len(acked)} commits, per phase {phases}; lost {len(lost)}: {lost[:20]}")
    assert not lost
    assert all(n >= PER_PHASE for n in phases.values()), phases
    ok, text = amcheck(IP)
    assert ok, text


def test_negative_control_one_omitted_extent_is_caught(trip):
    t = trip
    if not (t.runs_on and t.dead is not None and vm.running_pid(vm.vm_files(t.runs_on, NAME))):
        # Run alone (or after a failed round trip): make the state here.
        for load in t.loads:
            load.stop()
        if t.dead is not None:
            t.dead.evidence()
            t.dead.undo()
            t.dead = None
        stop_vm_everywhere(NAME)
        forget_ownership(NAME)
        failback.forget_replica_files(NAME)
        boot_and_protect(t)
        load = start_load(t, 600, "load-neg")
        wait_acks([load], time.time() - 1, 20, "before the power cut")
        cut_and_take_over(t)
        load.stop()
    repair_dead(t)
    runs_on, target = t.runs_on, failback.other(t.runs_on)
    load = start_load(t, 600, "load-neg2")
    _, p = failback.protect_back(NAME, runs_on, options={"debug_resync_omit_extent": True})
    copy = p.get("disk_copy") or {}
    print(f"failback to {target} with one extent omitted: {copy}")
    assert copy.get("mode") == "resync", copy
    compare = failback.disk_compare(NAME, runs_on)
    load.stop()
    assert not compare["equal"], ("the disk compare missed the omitted extent", compare)
    # exactly the extent the daemon says it left out, and nothing else
    assert compare["differing_extents"] == [omitted_extent(runs_on)], compare


def omitted_extent(host):
    """The extent remusdbd on host logged as left out (the last such line)."""
    log = (paths.host_run_dir(host) / "remusdbd.log").read_text(errors="replace")
    found = re.findall(rf"vm {NAME}: DEBUG NEGATIVE CONTROL: extent (\d+) left out", log)
    assert found, f"remusdbd on {host} logged no omitted extent"
    return int(found[-1])


def test_compare_files_names_the_one_differing_extent(tmp_path):
    """The comparison itself (no VM): equal files, then one byte changed in
    extent 3 of 6, then a shorter file."""
    a, b = tmp_path / "a", tmp_path / "b"
    data = bytearray(6 * failback.EXTENT)
    data[::4097] = b"x" * len(data[::4097])
    a.write_bytes(data)
    b.write_bytes(data)
    assert failback.compare_files(a, b)["equal"]
    data[3 * failback.EXTENT + 17] ^= 1
    b.write_bytes(data)
    r = failback.compare_files(a, b)
    assert not r["equal"] and r["differing_extents"] == [3], r
    b.write_bytes(data[:5 * failback.EXTENT])
    r = failback.compare_files(a, b)
    assert not r["equal"] and r["differing_extents"] == [3, 5], r
