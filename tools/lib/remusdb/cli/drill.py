"""remusdb-drill: a failover drill in the lab.

Boots a fresh PostgreSQL VM on the primary host, protects it to the backup
host, runs pgbench plus a commit ledger from the client host, fails the
primary in the middle of the load and measures what the clients saw:
acknowledged commits lost (must be 0), client-visible downtime, connections
that survived, TPS before and after, and pg_amcheck on the database the
backup now runs.

Failure modes:
  power     (default) the primary host loses power: nftables drops every
            frame into and out of its namespace, then its QEMU and remusdbd
            get SIGKILL, so no FIN or RST reaches anyone and the backup
            learns of it only from missing heartbeats
  kill      SIGKILL the primary's QEMU and its remusdbd at the same instant
            (their kernel closes the connections: a loud failure)
  cut-link  take the primary's LAN port down: it reaches neither the
            backup, nor the etcd witness, nor the clients
  switchover no failure: the planned role swap of `remusdb switchover`
            (the VM stops at a checkpoint the backup acknowledged, the
            backup resumes it, the old primary stays stopped) measured the
            same way, and then the VM must end protected the other way
            round (the backup host its primary, a changed-block resync)

Exit status: 0 when every drill passed: commits were acknowledged and none
was lost, every connection of the load survived, pg_amcheck is clean, the
backup took over, the load did not collapse (and for power: no frame left
the primary after the cut); 1
otherwise, also when a drill broke off (it is recorded as failed, with its
reason, and a series goes on); 2: bad command line.  The negative
controls, --unsafe-no-output-commit (output released before the backup has
its checkpoint) and --unsafe-release-early (each epoch's output released
one epoch early), are expected to catch lost commits and then exit 1.
With --mode switchover, --unsafe-release-early is the switchover's own
bug instead: its last checkpoint never leaves the primary while that
epoch's output does, so the backup resumes the epoch before it (a
correct switchover loses nothing even when the protection releases
early: nothing runs after its last checkpoint).

Every drill keeps what it saw (pgbench's output and per-transaction logs,
the ledger's output, pg_stat_activity snapshots, its result) in a work
directory, DIR/<date>-<vm>-<n> (--workdir, default /var/lib/remusdb-drills),
which the JSON names.

Development aid: --no-protect skips protection and the failure and only
runs the load, the ledger check, pg_amcheck and the JSON/PNG output; the
failure time is still marked, as a would-be failure.

The lab stays up afterwards; the VM is stopped on both hosts unless --keep.
"""
import argparse
import ipaddress
import json
import signal
import sys
from pathlib import Path

from ..drill import failover, plot, report, soak, soak_faults, soak_plot, soak_table
from ..lab import netns, vm, workload
from .runner import run

LAB_NET = ipaddress.IPv4Network(f"{netns.SUBNET_PREFIX}.0/{netns.PREFIX_LEN}")
HOST_ADDRESSES = {address for _, address, _ in netns.HOSTS.values()}


def bounded(kind, lo, hi=None):
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number")
        if value < lo or (hi is not None and value > hi):
            raise argparse.ArgumentTypeError(
                f"{value} is out of range: use {lo}..{hi}" if hi is not None
                else f"{value} is too small: use at least {lo}")
        return value
    return parse


def vm_name(text):
    try:
        vm.check_name(text)
    except SystemExit as e:
        raise argparse.ArgumentTypeError(str(e))
    return text


def lab_address(text):
    try:
        address = ipaddress.IPv4Address(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an IPv4 address")
    if address not in LAB_NET or str(address) in HOST_ADDRESSES:
        raise argparse.ArgumentTypeError(f"{text} is not a free guest address in {LAB_NET}")
    return str(address)


def build_parser():
    p = argparse.ArgumentParser(prog="remusdb-drill", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=failover.MODES, default="power",
                   help="how the primary fails (default power)")
    p.add_argument("--interval", type=bounded(int, 25, 500), default=100, metavar="MS",
                   help="checkpoint interval, 25..500 ms (default 100)")
    when = p.add_mutually_exclusive_group()
    when.add_argument("--at", "--before", type=bounded(float, 1), dest="at", metavar="S",
                      help="fail the primary S seconds after the load started (default 20)")
    lo, hi = failover.RANDOM_FAILURE_RANGE_S
    when.add_argument("--random", action="store_true",
                      help=f"fail it at a random moment in [{lo}, {hi}] s")
    p.add_argument("--after", type=bounded(float, 1), default=20, metavar="S",
                   help="seconds of load after the takeover (default 20)")
    p.add_argument("--clients", type=bounded(int, 1, 64), default=4, metavar="N",
                   help="pgbench clients (default 4)")
    p.add_argument("--ledger-connections", type=bounded(int, 1, 32), default=4, metavar="N",
                   help="commit ledger connections (default 4), each waiting a random "
                   "0..interval ms before every commit so that commits fall anywhere in "
                   "an epoch (tools/lib/remusdb/ledger.py says why)")
    p.add_argument("--json", metavar="FILE", help="write the result as JSON")
    p.add_argument("--png", metavar="FILE", help="plot TPS over time across the failure")
    control = p.add_mutually_exclusive_group()
    control.add_argument("--unsafe-no-output-commit", action="store_true",
                         help="negative control: protect WITHOUT output commit (see above)")
    control.add_argument("--unsafe-release-early", action="store_true",
                         help="negative control: release each epoch's output one epoch "
                              "early (see above)")
    p.add_argument("--workdir", metavar="DIR", default=str(failover.DRILLS_DIR),
                   help=f"where each drill's work directory is made (default "
                        f"{failover.DRILLS_DIR})")
    p.add_argument("--keep", action="store_true", help="leave the VM running afterwards")
    p.add_argument("--vm", type=vm_name, default="drill", help="VM name (default drill)")
    p.add_argument("--ip", type=lab_address, default=vm.DEFAULT_IP,
                   help=f"the guest's LAN address (default {vm.DEFAULT_IP})")
    p.add_argument("--repeat", type=bounded(int, 1, 100), default=1, metavar="N",
                   help="run N drills one after the other (each on a fresh VM); --json then "
                        "holds every result plus a summary, --png gets one plot per drill "
                        "(FILE-1.png, ...) and FILE.png of the series; exit 0 only when all of them passed")
    p.add_argument("--restore", choices=["shared", "eager", "lazy"],
                   help="restart the backup's remusdbd with --restore shared (QEMU maps the "
                        "image's RAM), eager (every page written into QEMU before it runs) "
                        "or lazy (it runs at once, pages on demand); default: the daemon as "
                        "it runs")
    p.add_argument("--from-saved", action="store_true",
                   help="restore the VM from its saved guest (made by one fresh boot the "
                        "first time, cached under $REMUSDB_CACHE/saved-guests) instead of "
                        "booting it: the same VM at the moment PostgreSQL first accepted "
                        "connections, on a fresh copy of its disk then")
    p.add_argument("--cpus", type=bounded(int, 1, 64), default=1, metavar="N",
                   help="the guest's vCPUs (default 1; multi-threaded TCG without KVM); "
                        "with --from-saved its saved guest is another one than one vCPU's")
    p.add_argument("--soak", type=bounded(float, 1), metavar="MINUTES",
                   help="instead of one drill: the chaos soak (drill/soak.py): a VM on each "
                        "host, each protected to the other, under pgbench and the ledger for "
                        "MINUTES, with faults at random moments one at a time ("
                        + ", ".join(soak_faults.KINDS) + "), each repaired and every VM "
                        "protected again before the next; --json and --png get the run")
    p.add_argument("--soak-kinds", metavar="K,K", type=fault_kinds,
                   default=",".join(soak_faults.KINDS),
                   help="the soak's fault kinds (default all)")
    p.add_argument("--seed", type=int, help="the soak's random seed (default: a random one, "
                   "recorded in its JSON)")
    p.add_argument("--soak-table", metavar="JSON",
                   help="print a recorded soak's faults per kind as a Markdown table "
                        "(drill/soak_table.py), and nothing else")
    p.add_argument("--no-protect", action="store_true", help=argparse.SUPPRESS)
    return p


def fault_kinds(text):
    kinds = [k for k in text.split(",") if k]
    unknown = [k for k in kinds if k not in soak_faults.KINDS]
    if unknown or not kinds:
        raise argparse.ArgumentTypeError(f"unknown fault kind(s) {', '.join(unknown) or text!r}: "
                                         f"use {', '.join(soak_faults.KINDS)}")
    return ",".join(kinds)


def interrupted(signum, frame):
    raise KeyboardInterrupt


def run_soak(args):
    # A SIGTERM (a test's timeout, systemd) ends the soak as Ctrl-C does:
    # through its cleanup, which stops its VMs and unmounts what it mounted.
    signal.signal(signal.SIGTERM, interrupted)
    try:
        result = soak.run(args.soak, args.workdir, args.seed, args.soak_kinds.split(","))
    except KeyboardInterrupt:
        sys.exit("remusdb-drill: the soak was interrupted; its cleanup stopped its VMs and "
                 "put the lab back")
    s = result["summary"]
    print(f"soak {'PASSED' if result['passed'] else 'FAILED'}: {s['faults']} faults "
          f"{s['kinds']}, lost {s['lost']}, two-primary intervals {s['two_primary_intervals']}, "
          f"downtime median {s['downtime_ms_median']} ms max {s['downtime_ms_max']} ms, "
          f"protected again median {s['protected_again_s_median']} s max "
          f"{s['protected_again_s_max']} s")
    for problem in result["problems"]:
        print(f"  {problem}")
    if args.json:
        workload.save_json(args.json, result)
        print(f"wrote {args.json}")
    if args.png:
        soak_plot.plot_soak(result, args.png)
        print(f"wrote {args.png}")
    sys.exit(0 if result["passed"] else 1)


def options_from(args, index):
    at = failover.random_failure_time() if args.random else (args.at or 20.0)
    return failover.DrillOptions(mode=args.mode, interval_ms=args.interval, failure_at_s=at,
                              after_s=args.after, clients=args.clients,
                              ledger_connections=args.ledger_connections,
                              output_commit=not args.unsafe_no_output_commit,
                              release_early=args.unsafe_release_early,
                              protect=not args.no_protect, keep=args.keep, vm_name=args.vm,
                              ip=args.ip, workdir_base=args.workdir, index=index,
                              restore=args.restore or "", from_saved=args.from_saved,
                              cpus=args.cpus)


def numbered(path, i, repeat):
    """FILE.png -> FILE-i.png when drills repeat; FILE itself otherwise."""
    if repeat == 1:
        return path
    stem, dot, ext = path.rpartition(".")
    return f"{stem}-{i}.{ext}" if dot else f"{path}-{i}"


def main():
    parser = build_parser()
    args = parser.parse_args()
    if args.soak_table:
        try:
            result = json.loads(Path(args.soak_table).read_text())
        except (OSError, ValueError) as e:
            sys.exit(f"remusdb-drill: cannot read the soak {args.soak_table}: {e}")
        print("\n".join(soak_table.markdown(result)))
        sys.exit(0)
    if args.soak:
        run_soak(args)
    if args.mode == "switchover" and args.unsafe_no_output_commit:
        parser.error("--unsafe-no-output-commit shows nothing in a switchover: the VM stops "
                     "at a checkpoint and the backup resumes exactly it, so output released "
                     "at once is in it; use --unsafe-release-early")
    results = []
    for i in range(1, args.repeat + 1):
        opts = options_from(args, i)
        if args.repeat > 1:
            print(f"== drill {i} of {args.repeat}", flush=True)
        try:
            result = failover.run(opts)
        except failover.DrillError as e:  # the command line itself is wrong
            sys.exit(f"remusdb-drill: {e}")
        except KeyboardInterrupt:
            sys.exit("remusdb-drill: interrupted (VM stopped unless --keep; the lab stays up)")
        print(report.summary(result), flush=True)
        if args.png and result.get("timeline"):
            png = numbered(args.png, i, args.repeat)
            plot.plot_drill(result, png)
            print(f"wrote {png}")
        results.append(result)
        if args.json:  # after every drill: a long series keeps what it has
            workload.save_json(args.json, result if args.repeat == 1 else
                               {"summary": report.series_summary(results),
                                "results": results})
    if args.repeat > 1:
        series = {"summary": report.series_summary(results), "results": results}
        print(report.series_words(series["summary"]))
        if args.png:
            plot.plot_series(series, args.png)
            print(f"wrote {args.png} (the series)")
    if args.json:
        print(f"wrote {args.json}")
    sys.exit(0 if all(r["passed"] for r in results) else 1)


def entry():
    """The `remusdb-drill` command."""
    run(main, "remusdb-drill")


if __name__ == "__main__":
    entry()
