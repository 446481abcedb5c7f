"""The chaos soak (`remusdb-drill --soak MINUTES`): active/active hosts
under load for a long time, faults at random moments, one at a time,
each repaired before the next, nothing acknowledged lost.

Two VMs run, one on each lab host, each protected to the other host,
both under pgbench and the commit ledger from the client host. Then, for
MINUTES, the soak waits a random quiet time, injects one fault of a kind
drawn from a shuffled deck (drill/soak_faults.py: every kind comes once
before any comes again), repairs the host, and brings every VM back to
protected (converge): a VM that lost its backup is protected again by
its own daemon (automatic re-protection, a changed-block resync); a VM
that was taken over is protected back to the host it left (a failback
resync), or, where its daemon gave up, by `protect` again.

Every fault is recorded from the far side:
  - lost acknowledged commits: every ledger id acknowledged before the
    fault is looked up in the database that serves after it (must be 0);
  - two primaries: the LAN bridge counts each VM's frames per host port
    (drill/mac_watch.py); an interval with frames from both ports is two
    copies serving at once (must be 0);
  - each VM's client-visible downtime: the longest wait between two
    acknowledged commits across the fault (failover.outage);
  - detection and takeover as the surviving daemon timed them;
  - the resync that re-protected each VM (its disk_copy: mode, bytes)
    and the time from the fault until every VM was protected again;
  - the load went on: commits were acknowledged after the repair.

A fault whose effect never comes, or a VM that is not protected again in
time, ends the soak as failed (the record says which). The run's JSON
holds every fault; the PNG draws the ledgers' commits per second with
each fault marked.
"""
import os
import random
import time
from pathlib import Path

from .. import failback, guest_agent, protection, switchover
from ..lab import netns, vm, witness, workload
from ..protection import ProtectionError
from ..vm_layout import mac_for
from . import soak_faults
from .failover import Load, make_workdir, outage
from .inject import remove_leftover_cut
from .lab import forget_ownership, lab_up, say, stop_vm_everywhere
from .mac_watch import MacWatch
from .soak_faults import KINDS, SoakError

# name: (the host it starts on, its address)
VMS = {"soak1": ("primary", f"{netns.SUBNET_PREFIX}.31"),
       "soak2": ("backup", f"{netns.SUBNET_PREFIX}.32")}
INTERVAL_MS = 100
QUIET_S = (5.0, 15.0)           # the random wait before each fault
LAST_FAULT_ROOM_S = 45          # no fault starts this close to the end
REPROTECT_WAIT_S = 60           # for a daemon's own re-protection before `protect`
PROTECT_TIMEOUT_S = 600
AFTER_REPAIR_ACKS = 5           # commits each VM must acknowledge after a repair
ACKS_TIMEOUT_S = 90
LOAD_SLACK_S = 600              # the load is planned past the soak; it is ended at its end
PGBENCH_CLIENTS = 2
LEDGER_END_S = 20
LEDGER_CONNECTIONS = 2


class Soak:
    def __init__(self, minutes, workdir, seed, kinds=KINDS):
        self.minutes = minutes
        self.workdir = Path(workdir)
        self.seed = seed
        self.rng = random.Random(seed)
        self.kinds = tuple(kinds)
        self.home = {name: host for name, (host, _) in VMS.items()}
        self.where = dict(self.home)
        self.ip = {name: ip for name, (_, ip) in VMS.items()}
        self.loads = {}
        self.macs = None
        self.faults = []
        self.deck = []
        self.fills = 0
        self.started = None

    # ------------------------------------------------------------ setup

    def prepare(self):
        lab_up(need_witness=False)
        for host in soak_faults.HOSTS:
            remove_leftover_cut(host=host)
        for name in VMS:
            stop_vm_everywhere(name)
        # Three members, so that one can be lost; the daemons restarted to
        # know all three (each takes the running members at its start).
        witness.start(members=3)
        for host in soak_faults.HOSTS:
            vm.stop_daemon(host)
        # Before the daemons start: each runs in a mount namespace of its
        # own (ip netns exec), copied when it starts, and this machine's
        # root mount does not propagate later mounts into it.
        soak_faults.unmount_replica_dirs()  # a killed soak's, with what it held
        soak_faults.mount_replica_dirs()
        for name in VMS:
            stop_vm_everywhere(name)
            forget_ownership(name)
            failback.forget_replica_files(name)
        for host in soak_faults.HOSTS:
            vm.ensure_daemon(host)
        for name, (host, ip) in VMS.items():
            vm.start(name, host, ip=ip, from_saved=True, wait_timeout=400)
        for name, host in self.where.items():
            protection.protect(name, failback.address(failback.other(host)), INTERVAL_MS,
                               host=host)
        for name, host in self.where.items():
            protection.wait_protected(name, host, PROTECT_TIMEOUT_S)
            say(f"soak: {name} runs on {host}, protected to {failback.other(host)}")
        seconds = int(self.minutes * 60) + LOAD_SLACK_S
        for name, ip in self.ip.items():
            d = self.workdir / name
            d.mkdir(parents=True, exist_ok=True)
            self.loads[name] = Load(ip, PGBENCH_CLIENTS, seconds, d,
                                    ledger_connections=LEDGER_CONNECTIONS, think_ms=INTERVAL_MS)
        self.macs = MacWatch({name: mac_for(name) for name in VMS})
        self.macs.start()
        for name in VMS:
            self.wait_acks(name, self.acked(name) + AFTER_REPAIR_ACKS, "before the first fault")

    # ------------------------------------------------------------ the load

    def acked(self, name):
        return len(self.loads[name].acks.acks)

    def wait_acks(self, name, n, when):
        deadline = time.monotonic() + ACKS_TIMEOUT_S
        while self.acked(name) < n:
            if time.monotonic() > deadline:
                raise SoakError(f"{name} acknowledged no commit for {ACKS_TIMEOUT_S} s "
                                f"{when}: the load collapsed")
            time.sleep(0.1)

    def write_fresh_blocks(self, name):
        """The guest writes a new file of random bytes and fsyncs it: blocks
        its disk never held, which the backup must store."""
        self.fills += 1
        qga = vm.vm_files(self.where[name], name)["qga"]
        r = guest_agent.run(qga, ["/bin/sh", "-c",
                                  f"dd if=/dev/urandom of=/var/tmp/soak-fill-{self.fills} "
                                  "bs=1M count=32 conv=fsync status=none"], timeout=120)
        if r.get("exitcode") != 0:
            raise SoakError(f"{name}: the guest could not write fresh blocks: "
                            f"{r.get('err') or r.get('out')}")

    def drop_fresh_blocks(self, name):
        """The fill files go and their blocks are trimmed (NBD trim, which
        the replica punches out of its file), so that a long soak neither
        fills the guest's disk nor leaves the next full file system
        nothing new to refuse."""
        qga = vm.vm_files(self.where[name], name)["qga"]
        try:
            r = guest_agent.run(qga, ["/bin/sh", "-c", "rm -f /var/tmp/soak-fill-*; fstrim /"],
                                timeout=120)
        except (Exception, SystemExit) as e:  # noqa: BLE001 -- recorded, not fatal
            return f"{type(e).__name__}: {e}"
        return r.get("exitcode") == 0 or (r.get("err") or r.get("out") or "failed").strip()

    # ------------------------------------------------------------ faults

    def next_kind(self):
        if not self.deck:
            self.deck = list(self.kinds)
            self.rng.shuffle(self.deck)
        return self.deck.pop()

    def converge(self, record):
        """Every VM protected again; returns {vm: its protection's disk_copy
        and how it got there}."""
        out = {}
        for name, host in self.where.items():
            target = failback.other(host)
            p = soak_faults.state_of(name, host)
            how = "already"
            if p != "protected":
                how = self.reprotect(name, host)
            prot = protection.primary_protection(host, name) or {}
            copy = prot.get("disk_copy") or {}
            out[name] = {"on": host, "to": target, "how": how, "disk_copy": copy}
        record["protected_again_s"] = round(time.time() - record["at"], 1)
        for name, host in list(self.where.items()):
            if host != self.home[name]:
                out[name]["home_again"] = self.switch_home(name, host)
        record["home_again_s"] = round(time.time() - record["at"], 1)
        return out

    def switch_home(self, name, host):
        """The operator's failback completed: a planned switchover moves the
        VM back to its home host, protected to the other one again. Each
        host then holds what it held at the start (the home host runs the
        VM from its own disk, the other keeps the replica in its replica
        directory), so that every kind of fault meets the same layout."""
        started = time.time()
        moved = switchover.handover(name, host)
        self.where[name] = moved["to"]
        _, p = switchover.protect_back(name, moved)
        copy = p.get("disk_copy") or {}
        return {"seconds": round(time.time() - started, 1),
                "paused_ms": round((moved["resumed_at_unix"] - moved["stopped_at_unix"]) * 1000, 1)
                if moved.get("resumed_at_unix") and moved.get("stopped_at_unix") else None,
                "resync": {"mode": copy.get("mode"), "bytes_sent": copy.get("bytes_sent")}}

    def reprotect(self, name, host):
        """Waits for the daemon's own re-protection where one runs, else
        protects the VM to the other host (a failback when it ran there)."""
        deadline = time.monotonic() + REPROTECT_WAIT_S
        while time.monotonic() < deadline:
            p = protection.primary_protection(host, name) or {}
            state, tries = p.get("state"), (p.get("reprotect") or {})
            if state == "protected":
                return "by itself"
            if not p or state in ("failed", "fenced") or tries.get("state") in ("stopped", None) \
                    or not tries.get("enabled"):
                break
            time.sleep(0.25)
        say(f"soak: protecting {name} on {host} to {failback.other(host)} again")
        try:
            protection.unprotect(name, host)
        except ProtectionError:
            pass  # nothing to end
        failback.protect_back(name, host, interval_ms=INTERVAL_MS, timeout=PROTECT_TIMEOUT_S)
        return "protect"

    def one_fault(self):
        kind = self.next_kind()
        acked_before = {n: list(self.loads[n].acks.acks) for n in VMS}
        record = {"kind": kind}
        try:
            record.update(soak_faults.inject(kind, self.where, self.rng,
                                             self.write_fresh_blocks))
            record["vms"] = self.converge(record)
            if kind == "replica-full":
                record["fill_trimmed"] = self.drop_fresh_blocks(record["vm"])
            for name in VMS:
                self.wait_acks(name, self.acked(name) + AFTER_REPAIR_ACKS, f"after the {kind}")
        except (Exception, SystemExit) as e:  # noqa: BLE001 -- a failed fault is a result
            record.setdefault("at", time.time())
            record["failed"] = f"{type(e).__name__}: {e}"
        self.measure(record, acked_before)
        self.faults.append(record)
        say(f"soak: fault {len(self.faults)} {kind}: {describe(record)}")
        return "failed" not in record

    def measure(self, record, acked_before):
        at, now = record["at"], time.time()
        record["at_s"] = round(at - self.started, 1)
        record["two_primaries"] = self.macs.window(at - 1, now)
        for name in VMS:
            v = record.setdefault("vms", {}).setdefault(name, {})
            acks = self.loads[name].acks.acks
            start, end, recovered = outage([t for t, _ in acks], at, now)
            v["downtime_ms"] = round((end - start) * 1000, 1) if recovered else None
            ids = [i for _, i in acked_before[name]]
            try:
                missing = workload.missing_acked(self.ip[name], ids)
                v["acked_before"], v["lost"] = len(ids), len(missing)
                v["lost_ids"] = missing[:20]
            except RuntimeError as e:
                v["lost"], v["lost_check_error"] = None, str(e)
            v["two_primary_intervals"] = record["two_primaries"][name]["both_ports_intervals"]

    def run_faults(self):
        end = self.started + self.minutes * 60
        while True:
            quiet = self.rng.uniform(*QUIET_S)
            if time.time() + quiet > end - LAST_FAULT_ROOM_S:
                break
            time.sleep(quiet)
            if not self.one_fault():
                return False
        if time.time() < end:
            time.sleep(end - time.time())
        return True

    # ------------------------------------------------------------ the run

    def finish(self):
        final = {}
        for load in self.loads.values():
            load.end_ledger()  # its planned end, now: its workers finish their commit
        deadline = time.monotonic() + LEDGER_END_S
        while time.monotonic() < deadline and any(
                load.ledger.poll() is None for load in self.loads.values()):
            time.sleep(0.1)
        for name, load in self.loads.items():
            load.stop()  # pgbench, planned to run past the soak
            acked = workload.ledger_acked_ids(load.ledger_file)
            try:
                missing = workload.missing_acked(self.ip[name], acked)
                rc, out = workload.amcheck(self.ip[name])
            except RuntimeError as e:
                final[name] = {"error": str(e)}
                continue
            final[name] = {"acked": len(acked), "lost": len(missing), "lost_ids": missing[:20],
                           "amcheck_rc": rc, "amcheck": out[-500:],
                           "runs_on": self.where[name],
                           "state": soak_faults.state_of(name, self.where[name])}
        return final


def describe(record):
    if "failed" in record:
        return f"FAILED: {record['failed']}"
    parts = []
    for name, v in sorted(record.get("vms", {}).items()):
        parts.append(f"{name} down {v.get('downtime_ms')} ms, lost {v.get('lost')}, "
                     f"{v.get('how')} ({(v.get('disk_copy') or {}).get('mode')})")
    return f"protected again after {record.get('protected_again_s')} s; " + "; ".join(parts)


def verdict(result):
    problems = []
    if not result["faults"]:
        problems.append("no fault was injected")
    for i, f in enumerate(result["faults"], 1):
        where = f"fault {i} ({f['kind']})"
        if "failed" in f:
            problems.append(f"{where}: {f['failed']}")
        for name, v in f.get("vms", {}).items():
            if v.get("lost") != 0:
                problems.append(f"{where}: {name} lost {v.get('lost')} acknowledged commits")
            if v.get("two_primary_intervals"):
                problems.append(f"{where}: {name} served from both hosts in "
                                f"{v['two_primary_intervals']} intervals")
            if v.get("downtime_ms") is None:
                problems.append(f"{where}: {name}'s clients never recovered")
    for name, v in result.get("final", {}).items():
        if v.get("error"):
            problems.append(f"at the end, {name}: {v['error']}")
            continue
        if v.get("lost") != 0:
            problems.append(f"at the end, {name} lost {v.get('lost')} acknowledged commits")
        if not v.get("acked"):
            problems.append(f"{name} acknowledged no commit: no load")
        if v.get("amcheck_rc") != 0:
            problems.append(f"{name}: pg_amcheck failed: {v.get('amcheck')}")
    if result.get("broke_off"):
        problems.append(f"the soak broke off: {result['broke_off']}")
    return not problems, problems


def summary(result):
    faults = result["faults"]
    kinds = {}
    for f in faults:
        kinds[f["kind"]] = kinds.get(f["kind"], 0) + 1
    downtimes = sorted(v["downtime_ms"] for f in faults for v in f.get("vms", {}).values()
                       if v.get("downtime_ms") is not None)
    back = sorted(f["protected_again_s"] for f in faults if "protected_again_s" in f)
    return {"faults": len(faults), "kinds": kinds,
            "failed_faults": sum(1 for f in faults if "failed" in f),
            "lost": sum(v.get("lost") or 0 for f in faults for v in f.get("vms", {}).values()),
            "two_primary_intervals": sum(v.get("two_primary_intervals") or 0 for f in faults
                                         for v in f.get("vms", {}).values()),
            "downtime_ms_max": downtimes[-1] if downtimes else None,
            "downtime_ms_median": downtimes[len(downtimes) // 2] if downtimes else None,
            "protected_again_s_max": back[-1] if back else None,
            "protected_again_s_median": back[len(back) // 2] if back else None}


def run(minutes, workdir_base, seed=None, kinds=KINDS):
    """The whole soak; returns its result (also written to its work
    directory). The VMs are stopped and the lab's witness is back to one
    member afterwards."""
    seed = seed if seed is not None else int.from_bytes(os.urandom(4), "little")

    class Opts:  # what make_workdir names the directory after
        vm_name, index = "soak", 1
    Opts.workdir_base = workdir_base
    workdir = make_workdir(Opts)
    say(f"soak: {minutes} min, seed {seed}, work directory {workdir}")
    soak = Soak(minutes, workdir, seed, kinds)
    result = {"kind": "soak", "minutes": minutes, "seed": seed, "workdir": str(workdir),
              "vms": {n: {"starts_on": h, "ip": ip} for n, (h, ip) in VMS.items()},
              "interval_ms": INTERVAL_MS, "kinds": list(kinds), "faults": soak.faults}
    try:
        soak.prepare()
        soak.started = time.time()
        result["started_unix"] = soak.started
        if not soak.run_faults():
            result["broke_off"] = "a fault was not repaired (its record says why)"
        result["final"] = soak.finish()
    except (Exception, SystemExit) as e:  # noqa: BLE001 -- a broken-off soak is a result
        result["broke_off"] = f"{type(e).__name__}: {e}"
        say(f"soak: broke off: {e}")
    finally:
        result["timeline"] = timeline(soak)
        cleanup(soak)
    result["summary"] = summary(result)
    result["passed"], result["problems"] = verdict(result)
    workload.save_json(workdir / "result.json", result)
    return result


def timeline(soak):
    """Each VM's acknowledged commits per second since the start."""
    if soak.started is None:
        return {}
    out = {}
    for name, load in soak.loads.items():
        bins = {}
        for t, _ in load.acks.acks:
            if t >= soak.started:
                bins[int(t - soak.started)] = bins.get(int(t - soak.started), 0) + 1
        last = max(bins, default=-1)
        out[name] = [bins.get(i, 0) for i in range(last + 1)]
    return out


def cleanup(soak):
    """Every step tried, whatever an earlier one raised: the lab must not
    stay with the soak's VMs, mounts, cut or three-member witness."""
    steps = [load.stop for load in soak.loads.values()]
    if soak.macs is not None:
        steps.append(soak.macs.stop)
    steps.append(leftovers)
    for step in steps:
        try:
            step()
        except (Exception, SystemExit) as e:  # noqa: BLE001 -- the next step still runs
            say(f"soak cleanup: {type(e).__name__}: {e}")


def leftovers():
    """What a soak leaves when it ends, or was killed before its cleanup:
    its VMs stopped and forgotten, the cuts removed, the replica tmpfs
    unmounted, the witness back to one member and daemons that know it."""
    def attempt(step, *args):
        try:
            step(*args)
        except (Exception, SystemExit) as e:  # noqa: BLE001 -- the next step still runs
            say(f"soak cleanup: {type(e).__name__}: {e}")
    from .mac_watch import remove
    attempt(remove)
    for host in soak_faults.HOSTS:
        attempt(remove_leftover_cut, None, host)
        attempt(vm.ensure_daemon, host)
    for name in VMS:
        attempt(stop_vm_everywhere, name)
        attempt(forget_ownership, name)
        attempt(failback.forget_replica_files, name)
    attempt(soak_faults.unmount_replica_dirs)
    attempt(witness.start, 1)
    for host in soak_faults.HOSTS:  # the lab as other tests expect it
        attempt(vm.stop_daemon, host)
        attempt(vm.ensure_daemon, host)
