"""The demo: one power-loss failover drill, told in a few lines.

A fresh PostgreSQL VM boots on the primary host and is protected to the
backup host; pgbench and a commit ledger run from the client host; in the
middle of it the primary host loses power (its network goes silent at one
instant, then its QEMU and remusdbd are killed); the backup notices the
missing heartbeats and resumes the VM.  The report says whether every acknowledged
commit survived, how long the clients stalled, and whether their
connections lived through it.  remusdb-drill runs the same drill with
every knob (modes, intervals, JSON and plots)."""
import argparse
import sys

from ..drill import failover
from ..drill.report import amcheck_words, fmt, survival_words
from .runner import run


def report(r):
    if r.get("failed_reason"):
        return f"\nRemusDB-KVM demo: {r['verdict']}\n  (work directory {r['workdir']})"
    lost = r["lost_acked_commits"]
    takeover = (f"the backup noticed the silence {fmt(r['detection_ms'], '.0f')} ms "
                f"after it last heard the primary (peer timeout {r['peer_timeout_ms']} ms) and "
                f"resumed the VM {r['takeover_ms']:.0f} ms later, from checkpoint "
                f"{r['replica_committed_epoch']}" if r["takeover"]
                else f"the backup did NOT take over ({r['takeover_error']})")
    downtime = (f"{r['downtime_ms'] / 1000:.1f} s" if r["clients_recovered"]
                else "for good (nothing was acknowledged after the takeover)")
    lines = [
        "",
        f"RemusDB-KVM demo ({r['accel']}, checkpoints every {r['interval_ms']} ms)",
        f"  the primary host lost power {r['failure_at_s']:.0f} s into pgbench",
        f"  {takeover}",
        f"  acknowledged commits: {r['acked_commits']}, lost: "
        + ("unknown (database unreachable)" if lost is None else str(lost)),
        f"  clients stalled {downtime}; {survival_words(r)}",
        f"  throughput: {fmt(r['tps_before'])} TPS protected before, "
        f"{fmt(r['tps_after'])} TPS on the backup after",
        f"  pg_amcheck on the database the backup runs: {amcheck_words(r)[:200]}",
        f"  verdict: {r['verdict']}",
    ]
    return "\n".join(lines)


def interval_ms(text):
    if not text.isdigit() or not 25 <= int(text) <= 500:
        raise argparse.ArgumentTypeError(f"{text!r}: use a whole number of ms in 25..500")
    return int(text)


def main():
    p = argparse.ArgumentParser(prog="remusdb-demo", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--interval", type=interval_ms, default=100, metavar="MS",
                   help="checkpoint interval, 25..500 ms (default 100)")
    p.add_argument("--keep", action="store_true", help="leave the VM running afterwards")
    args = p.parse_args()
    opts = failover.DrillOptions(mode="power", interval_ms=args.interval, keep=args.keep,
                              vm_name="demo")
    try:
        result = failover.run(opts)
    except failover.DrillError as e:
        sys.exit(f"remusdb-demo: {e}")
    print(report(result))
    sys.exit(0 if result["passed"] else 1)


def entry():
    """The `remusdb-demo` command."""
    run(main, "remusdb-demo")


if __name__ == "__main__":
    entry()
