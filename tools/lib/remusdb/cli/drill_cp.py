"""remusdb-drill-cp: RemusDB's two commit-protection lemmas under a power
cut of the primary host, in the lab
(tools/lib/remusdb/drill/commit_protection.py says what one drill does
and checks).

  remusdb-drill-cp [--dbms postgres|mariadb] [--interval MS] [--repeat N]
                   [--cut after-result|after-ack|mid-epoch] [--from-saved]
                   [--no-dbms-cp] [--json FILE] [--png FILE]

Each drill boots a fresh guest, protects it with --commit-protection,
runs explicit multi-statement transactions (and, on PostgreSQL, the
autocommit ledger) from the client host, cuts the primary's power right
after a client saw a statement's result that followed a commit
acknowledgement (commit_protection.py says why there), and checks after
the takeover:
  Lemma 3.5.1  every acknowledged commit is in the database;
  Lemma 3.5.2  no transaction broken before its COMMIT was sent is
               committed, although its client saw its results; none is
               committed in part.
It also reports how many connections broke (reset by the backup) and how
many went through the failover, and when the first client saw an error.

--no-dbms-cp is the negative control: the DBMS patch is switched off
while the relay stays in commit-protection mode, so commit
acknowledgements leave speculatively and a drill can lose one.

Exit status: 0 when every drill was exercised (commits acknowledged on
both sides of the failure, a transaction interrupted after its client saw
results) and passed; 1 otherwise (a drill that broke off is recorded as
failed, and the series goes on); 2: bad command line.
"""
import argparse
import json
import sys
import time
import traceback
from pathlib import Path

from ..bench.plot import pyplot
from ..drill import commit_protection
from ..lab import netns, witness
from .runner import run


def plot(runs, path):
    plt = pyplot()
    ok = [r for r in runs if "connections" in r]
    xs = range(1, len(ok) + 1)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.6))
    ax1.bar(xs, [r["connections_broken"] for r in ok], label="broken (reset)", color="#d62728")
    ax1.bar(xs, [r["connections_through"] for r in ok],
            bottom=[r["connections_broken"] for r in ok], label="through the failover",
            color="#2ca02c")
    ax1.set_xlabel("drill")
    ax1.set_ylabel("txclient connections")
    ax1.legend(fontsize=8)
    ax2.plot(xs, [r["first_error_after_failure_s"] for r in ok], "o", label="first client error")
    ax2.plot(xs, [r["resumed_after_failure_s"] for r in ok], "s", label="VM resumed on backup")
    ax2.set_xlabel("drill")
    ax2.set_ylabel("seconds after the power cut")
    ax2.legend(fontsize=8)
    lost = sum(r.get("lost_acknowledged", 0) + r.get("ledger_lost", 0) for r in ok)
    fig.suptitle(f"commit protection drills: {len(ok)} run(s), lost acknowledged commits {lost}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(prog="remusdb-drill-cp", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dbms", choices=("postgres", "mariadb"), default="postgres")
    ap.add_argument("--interval", type=int, default=50, metavar="MS")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--cut", choices=commit_protection.CUTS, default="after-result",
                    help="where in the epoch the power goes (default after-result; "
                         "drill/commit_protection.py says what each one is for)")
    ap.add_argument("--from-saved", action="store_true",
                    help="restore each drill's VM from its saved guest, as the test suite "
                         "does, instead of booting it")
    ap.add_argument("--no-dbms-cp", action="store_true",
                    help="negative control: the DBMS patch off, the relay in CP mode")
    ap.add_argument("--workdir", default="/var/lib/remusdb-drills")
    ap.add_argument("--json")
    ap.add_argument("--png")
    args = ap.parse_args()
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    netns.up()
    witness.start(members=1)
    runs = []
    for i in range(args.repeat):
        workdir = Path(args.workdir) / f"{time.strftime('%Y%m%d-%H%M%S')}-cp-{args.dbms}-{i}"
        try:
            r = commit_protection.run(workdir, dbms=args.dbms, interval_ms=args.interval,
                                      dbms_cp=not args.no_dbms_cp, cut=args.cut,
                                      from_saved=args.from_saved)
        except Exception as e:  # a broken-off drill is a failed drill, never dropped
            traceback.print_exc()
            r = {"passed": False, "exercised": False, "error": f"{type(e).__name__}: {e}",
                 "workdir": str(workdir)}
        runs.append(r)
        print(json.dumps({k: r.get(k) for k in (
            "passed", "exercised", "acknowledged", "lost_acknowledged", "ledger_lost",
            "broken_with_results_seen", "committed_despite_break", "connections_broken",
            "connections_through", "first_error_after_failure_s", "error")}), flush=True)
        for w in r.get("wrong", [])[:10]:
            print(f"  WRONG: {w}", flush=True)
    summary = {"drills": len(runs), "dbms": args.dbms, "cut": args.cut,
               "interval_ms": args.interval, "passed": sum(1 for r in runs if r.get("passed")),
               "exercised": sum(1 for r in runs if r.get("exercised")),
               "lost_acknowledged": sum(r.get("lost_acknowledged", 0) + r.get("ledger_lost", 0)
                                        for r in runs),
               "committed_despite_break": sum(r.get("committed_despite_break", 0) for r in runs),
               "connections": sum(r.get("connections", 0) for r in runs),
               "connections_broken": sum(r.get("connections_broken", 0) for r in runs)}
    print(json.dumps(summary))
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": summary, "runs": runs}, indent=1) + "\n")
    if args.png:
        plot(runs, args.png)
    sys.exit(0 if summary["passed"] == len(runs) else 1)


def entry():
    """The `remusdb-drill-cp` command."""
    run(main, "remusdb-drill-cp")


if __name__ == "__main__":
    entry()
