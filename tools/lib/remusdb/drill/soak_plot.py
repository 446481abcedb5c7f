"""The soak's plot, drawn from its result JSON alone (drill/soak.py):
each VM's acknowledged commits per second over the whole run, every
fault marked where it came, named by kind, red when it failed or lost a
commit."""
from pathlib import Path

from ..bench.plot import pyplot

COLOURS = ("#1f77b4", "#2ca02c", "#9467bd", "#8c564b")


def plot_soak(result, path):
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(max(9, result["minutes"] * 0.25 + 6), 4.5))
    for (name, per_s), colour in zip(sorted(result.get("timeline", {}).items()), COLOURS):
        if per_s:
            ax.plot([x / 60 for x in range(1, len(per_s) + 1)], per_s, drawstyle="steps-pre",
                    color=colour, linewidth=0.8, label=f"{name}: ledger commits/s")
    top = max((max(v) for v in result.get("timeline", {}).values() if v), default=1)
    for f in result["faults"]:
        if "at_s" not in f:
            continue
        bad = "failed" in f or any(v.get("lost") for v in f.get("vms", {}).values())
        x = f["at_s"] / 60
        ax.axvline(x, color="#d62728" if bad else "#7f7f7f", linestyle="--", linewidth=0.7)
        ax.annotate(f["kind"] + (f" {f['host']}" if f.get("host") else ""), (x, top),
                    rotation=90, fontsize=6, va="top", ha="right")
    s = result["summary"]
    ax.set_title(f"soak of {result['minutes']} min ({'PASS' if result['passed'] else 'FAIL'}): "
                 f"{s['faults']} faults, {s['lost']} acknowledged commits lost, "
                 f"{s['two_primary_intervals']} intervals with two primaries\ndowntime median "
                 f"{s['downtime_ms_median']} ms, max {s['downtime_ms_max']} ms; protected "
                 f"again median {s['protected_again_s_median']} s", fontsize=8)
    ax.set_xlabel("minutes since the first fault could come")
    ax.set_ylabel("commits / s")
    ax.set_ylim(bottom=0)
    ax.legend(loc="lower left", fontsize=8)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
