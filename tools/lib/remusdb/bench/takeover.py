"""remusdb-bench takeover: eager against lazy restore at failover (issue
11, "lazy takeover"), in one run.

Eager, the backup writes every page of the committed image into QEMU's
`-incoming` before the VM may run, so takeover grows with guest RAM. Lazy,
the backup's QEMU gets the device state and runs at once, and the image is
served by the fork's postcopy source. Each round runs the failover drill
(power cut under pgbench and the commit ledger, detection by heartbeats)
once with each, alternating which goes first, and keeps what the drill
measured: takeover (primary last heard -> VM running on the backup), its
restore step, the client-visible downtime, lost acknowledged commits (must
be 0) and, lazy, when every page was out. A drill that broke off is kept
as a failed run.
"""
import statistics
from functools import partial

from ..drill import failover
from ..lab import workload
from .. import output
from .harness import result_head
from .plot import pyplot

VM_NAME = "tko"
say = partial(output.say, "bench takeover")


def add_parser(sub):
    b = sub.add_parser("takeover", help="failover drills with eager and lazy restore, side by side")
    b.add_argument("--rounds", type=int, default=2, help="drills per mode (default 2)")
    b.add_argument("--out", default=None, help="output stem (default docs/bench/takeover)")
    return b


def one(mode, index):
    opts = failover.DrillOptions(vm_name=VM_NAME, restore=mode, index=index)
    r = failover.run(opts)
    fo = r.get("failover") or {}
    run = {"restore": mode, "passed": r.get("passed"), "verdict": r.get("verdict"),
           "failed_reason": r.get("failed_reason"),
           "takeover_ms": r.get("takeover_ms"), "restore_ms": fo.get("restore_ms"),
           "downtime_ms": r.get("downtime_ms"),
           "acked_commits": r.get("acked_commits"),
           "lost_acked_commits": r.get("lost_acked_commits"),
           "lazy": fo.get("lazy"), "workdir": r.get("workdir")}
    say(f"{mode}: takeover {run['takeover_ms']} ms (restore {run['restore_ms']} ms), "
        f"client-visible downtime {run['downtime_ms']} ms, lost {run['lost_acked_commits']} "
        f"of {run['acked_commits']}: {run['verdict'] or run['failed_reason']}")
    return run


def summary(runs, mode):
    ok = [r for r in runs if r["restore"] == mode and r["passed"]]

    def med(key):
        vals = [r[key] for r in ok if r.get(key) is not None]
        return statistics.median(vals) if vals else None
    return {"runs": sum(r["restore"] == mode for r in runs), "passed": len(ok),
            "takeover_ms_median": med("takeover_ms"), "restore_ms_median": med("restore_ms"),
            "downtime_ms_median": med("downtime_ms")}


def run(args, out_dir):
    runs = []
    for i in range(args.rounds):
        order = ("eager", "lazy") if i % 2 == 0 else ("lazy", "eager")
        for mode in order:
            runs.append(one(mode, len(runs) + 1))
    result = {**result_head("takeover", "tcg"), "runs": runs,
              "eager": summary(runs, "eager"), "lazy": summary(runs, "lazy")}
    e, z = result["eager"], result["lazy"]
    if e["takeover_ms_median"] and z["takeover_ms_median"]:
        result["takeover_ratio_lazy_to_eager"] = z["takeover_ms_median"] / e["takeover_ms_median"]
    stem = args.out or str(out_dir / "takeover")
    workload.save_json(stem + ".json", result)
    plot(result, stem + ".png")
    say(f"eager: {e}; lazy: {z}")
    say(f"wrote {stem}.json and {stem}.png")
    return result


def plot(result, path):
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    keys = (("takeover_ms", "takeover"), ("restore_ms", "restore step"),
            ("downtime_ms", "client-visible downtime"))
    for x, mode, color in ((0, "eager", "#d62728"), (1, "lazy", "#1f77b4")):
        for k, (key, _) in enumerate(keys):
            vals = [r[key] for r in result["runs"]
                    if r["restore"] == mode and r["passed"] and r.get(key) is not None]
            xs = [k * 3 + x + 0.1 * j for j in range(len(vals))]
            ax.plot(xs, vals, "o", color=color, label=mode if k == 0 else None)
    ax.set_xticks([k * 3 + 0.5 for k in range(len(keys))])
    ax.set_xticklabels([label for _, label in keys])
    ax.set_ylabel("ms")
    ax.legend()
    ax.set_title("failover drill (power cut), eager vs lazy restore, 1 GiB TCG guest")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
