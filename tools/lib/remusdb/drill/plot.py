"""Plots of drill results, drawn from the result JSON alone (so a saved
result can be re-plotted).  matplotlib with the Agg backend: the lab has
no display.

The failover plot follows Figure 3.5 of the RemusDB thesis: throughput
over time across a failure, with the failure marked.  Two rates are drawn
because they answer different questions: pgbench's TPS is the load the
primary carried, the ledger's commits/s is what its clients saw
acknowledged (its gap is the downtime).  The shaded span runs from the
failure to the moment the backup's VM ran again: failure detection plus
the takeover, each named in the label as the backup timed them.
"""
from pathlib import Path

from ..bench.plot import pyplot


def plot_drill(result, path):
    plt = pyplot()
    tl = result["timeline"]
    fig, ax = plt.subplots(figsize=(9, 4.2))
    if tl["pgbench_tps"]:
        xs, ys = zip(*tl["pgbench_tps"])
        ax.plot(xs, ys, drawstyle="steps-pre", color="#1f77b4",
                label=f"pgbench TPS ({result['clients']} clients)")
    ledger = tl["ledger_commits_per_s"]
    if ledger:
        ax.plot(range(1, len(ledger) + 1), ledger, drawstyle="steps-pre", color="#2ca02c",
                label=f"ledger commits/s ({result.get('ledger_connections', 1)} "
                      "connections)")
    fail = result.get("failure_at_s")
    if fail is not None:
        ax.axvline(fail, color="#d62728", linestyle="--",
                   label=f"failure ({result['mode']})" if result["protected"]
                   else "no failure injected (dry run)")
    window = tl.get("takeover_window_s")
    if window:
        takeover, detection = result.get("takeover_ms"), result.get("detection_ms")
        parts = [f"detection {detection:.0f} ms" if detection is not None else None,
                 f"takeover {takeover:.0f} ms" if takeover is not None else None]
        named = ", ".join(x for x in parts if x)
        ax.axvspan(window[0], window[1], color="#ff7f0e", alpha=0.25,
                   label="failure to resumed" + (f" ({named})" if named else ""))
    ax.set_xlabel("seconds since the load started")
    ax.set_ylabel("transactions / s")
    ax.set_ylim(bottom=0)
    ax.set_xlim(left=0)
    ax.legend(loc="best", fontsize=8)
    ax.set_title(_title(result), fontsize=9)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_series(series, path):
    """One bar per drill of a --repeat series, as tall as its client-visible
    downtime (from the last acknowledgement before the failure to the first
    after it), split into: the failure until the backup declared the
    primary lost, the takeover, and the rest (the clients' and the guest's
    TCP retransmission, and the gap before the failure).  Lost commits and
    failed drills are named."""
    plt = pyplot()
    results = series["results"]
    fig, ax = plt.subplots(figsize=(max(6, 0.8 * len(results) + 2), 4))
    for i, r in enumerate(results, start=1):
        detect = r.get("detection_after_failure_ms") or 0
        takeover = r.get("takeover_ms") or 0
        down = r.get("downtime_ms") or 0
        rest = max(0, down - detect - takeover)
        ax.bar(i, detect, color="#d62728", label="failure to declared lost" if i == 1 else None)
        ax.bar(i, takeover, bottom=detect, color="#ff7f0e",
               label="takeover (arbitration, restore, resume)" if i == 1 else None)
        ax.bar(i, rest, bottom=detect + takeover, color="#1f77b4",
               label="rest of the client-visible downtime" if i == 1 else None)
        note = "PASS" if r.get("passed") else "FAIL"
        if r.get("lost_acked_commits"):
            note += f"\n{r['lost_acked_commits']} lost"
        ax.annotate(note, (i, max(down, detect + takeover)), ha="center", va="bottom",
                    fontsize=7)
    s = series["summary"]
    ax.set_xticks(range(1, len(results) + 1))
    ax.set_xlabel("drill")
    ax.set_ylabel("client-visible downtime (ms)")
    ax.legend(loc="lower right", fontsize=8)
    down = s.get("downtime_ms") or {}
    ax.set_title(f"{len(results)} drills ({', '.join(s.get('modes', []))}, "
                 f"{', '.join(str(x) for x in s.get('interval_ms', []))} ms epochs, peer timeout "
                 f"{', '.join(str(x) for x in s.get('peer_timeout_ms', []))} ms): "
                 f"{s['passed']} passed, lost {s['lost_acked_commits_total']} of "
                 f"{s['acked_commits_total']} acked; downtime median {down.get('median')} ms",
                 fontsize=9)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _title(r):
    def num(v, spec):
        return "n/a" if v is None else format(v, spec)
    if not r["protected"]:
        head = "load only (--no-protect)"
    else:
        head = (f"{r['mode']} drill, interval {r['interval_ms']} ms, output commit "
                f"{'on' if r['output_commit'] else 'OFF'}")
    return (f"{head}, {r['accel']}: lost acked commits {num(r['lost_acked_commits'], 'd')} "
            f"of {r['acked_commits']}, downtime {num(r['downtime_ms'], '.0f')} ms, "
            f"connections {r['connections_survived']}/{r['connections_before']}")
