"""remusdb-bench silence: how quiet a live peer gets, which sizes the
failure-detection timeout (docs/protocol.md, section 5).

One VM is protected under the drill's load (pgbench plus the commit
ledger) for a long stretch with nothing failing. Both daemons report, per
replication link, the gaps between the peer's heartbeat datagrams (sent
and checked by their real-time heartbeat thread) as a histogram, and the
longest silence of the TCP stream as their event loop saw it: the measure
liveness used before the heartbeat thread, side by side in the same run.
Every few seconds the bench also checks that neither side declared the
other lost: any such state change is a false failover and fails the run.
"""
import threading
import time
from functools import partial

from .. import output, paths, protection
from ..lab import vm, workload
from ..drill.lab import fresh_vm_for_protection, stop_vm_everywhere
from . import harness
from .plot import pyplot

VM_NAME = "silence"
SAMPLE_EVERY_S = 2.0
say = partial(output.say, "bench silence")


def add_parser(sub):
    b = sub.add_parser("silence", help="heartbeat vs. stream silences of a live peer, "
                       "and false failovers, under load")
    b.add_argument("--interval", type=int, default=50, metavar="MS",
                   help="checkpoint interval (default 50)")
    b.add_argument("--seconds", type=int, default=300, help="protected load (default 300)")
    b.add_argument("--clients", type=int, default=4, help="pgbench clients (default 4)")
    b.add_argument("--out", default=None, help="output stem (default docs/bench/silence)")
    return b


def side(status, heartbeat_key="heartbeat"):
    """The liveness figures one side reports for its link."""
    hb = status.get(heartbeat_key) or {}
    return {
        "heartbeat": {k: hb.get(k) for k in (
            "sent", "received", "rejected", "silences_counted", "silence_p50_ms",
            "silence_p99_ms", "silence_p999_ms", "max_silence_ms", "timeout_ms")},
        "silence_histogram_ms": hb.get("silence_histogram_ms") or [],
        "stream_max_silence_ms": status.get("stream_max_silence_ms"),
    }


def run_load(args, box):
    box["pgbench"] = workload.pgbench(vm.DEFAULT_IP, seconds=args.seconds,
                                      clients=args.clients, progress=10)


def run(args, out_dir):
    accel = fresh_vm_for_protection(VM_NAME)
    states, problems = [], []
    try:
        # No reset-stats: the silences counted cover the whole protection.
        # No unprotect either: after a false failover the primary may no
        # longer know the VM, and that must end in a result, not an error;
        # stop_vm_everywhere takes the protection down on both hosts.
        harness.protect(VM_NAME, args.interval,
                        progress=lambda p: say(protection.describe_progress(p)))
        ledger_file = paths.RUN / "silence-ledger.ids"
        ledger_file.unlink(missing_ok=True)
        ledger = workload.start_ledger(vm.DEFAULT_IP, ledger_file, args.seconds)
        box = {}
        load = threading.Thread(target=run_load, args=(args, box))
        load.start()
        say(f"protected at {args.interval} ms; load: pgbench ({args.clients} clients) + "
            f"ledger for {args.seconds} s")
        while load.is_alive():
            p = protection.primary_protection("primary", VM_NAME) or {}
            r = protection.replica("backup", VM_NAME) or {}
            seen = (p.get("state"), r.get("state"))
            if not states or states[-1][1:] != list(seen):
                states.append([round(time.time(), 1), *seen])
            if seen != ("protected", "ready"):
                problems.append(f"primary {seen[0]}, backup {seen[1]}: "
                                f"{p.get('error') or r.get('error')}")
                break
            time.sleep(SAMPLE_EVERY_S)
        load.join()
        ledger.wait(timeout=30)
        primary = protection.primary_protection("primary", VM_NAME) or {}
        backup = protection.replica("backup", VM_NAME) or {}
    finally:
        stop_vm_everywhere(VM_NAME)
    acked = workload.ledger_acked_ids(ledger_file)
    pg = box.get("pgbench") or {}
    if not acked or not pg.get("transactions"):
        problems.append(f"the load collapsed: {len(acked)} ledger commits, "
                        f"{pg.get('transactions')} pgbench transactions")
    result = {
        "benchmark": "silence",
        "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "accel": accel,
        "interval_ms": args.interval,
        "seconds": args.seconds,
        "load": {"pgbench_clients": args.clients, "pgbench_tps": pg.get("tps"),
                 "pgbench_transactions": pg.get("transactions"),
                 "ledger_commits": len(acked)},
        "peer_timeout_ms": primary.get("peer_timeout_ms"),
        "primary_sees_backup": side(primary),
        "backup_sees_primary": side(backup),
        "states": states,
        "false_failovers": len(problems) if states else None,
        "problems": problems,
        "passed": not problems,
    }
    stem = args.out or str(out_dir / "silence")
    workload.save_json(stem + ".json", result)
    plot(result, stem + ".png")
    for who in ("primary_sees_backup", "backup_sees_primary"):
        s = result[who]
        say(f"{who}: heartbeat silence p50/p99/p999/max "
            f"{s['heartbeat']['silence_p50_ms']}/{s['heartbeat']['silence_p99_ms']}/"
            f"{s['heartbeat']['silence_p999_ms']}/{s['heartbeat']['max_silence_ms']} ms over "
            f"{s['heartbeat']['silences_counted']} gaps; TCP stream max "
            f"{s['stream_max_silence_ms']} ms")
    say(("PASS" if result["passed"] else "FAIL: " + "; ".join(problems))
        + f"; wrote {stem}.json and {stem}.png")
    return result


def plot(result, path):
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4), sharey=True)
    timeout = result["peer_timeout_ms"]
    for ax, who, title in ((axes[0], "primary_sees_backup", "primary hears the backup"),
                           (axes[1], "backup_sees_primary", "backup hears the primary")):
        s = result[who]
        hist = s["silence_histogram_ms"]
        if hist:
            ax.bar([ms for ms, _ in hist], [n for _, n in hist], width=1.0, color="#1f77b4",
                   label=f"heartbeat gaps (max {s['heartbeat']['max_silence_ms']} ms)")
        if timeout:
            ax.axvline(timeout, color="#d62728", linestyle="--",
                       label=f"peer timeout {timeout} ms")
        stream = s["stream_max_silence_ms"]
        if stream is not None:
            ax.axvline(stream, color="#ff7f0e", linestyle=":",
                       label=f"TCP stream, longest silence {stream} ms")
        ax.set_yscale("log")
        ax.set_xlabel("silence between the peer's heartbeats (ms)")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("gaps")
    fig.suptitle(f"Live-peer silences over {result['seconds']} s of protected load at "
                 f"{result['interval_ms']} ms epochs ({result['accel']}); false failovers: "
                 f"{result['false_failovers']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)

