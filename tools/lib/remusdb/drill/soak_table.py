"""A recorded soak's faults, per kind, as the Markdown table of
docs/bench/README.md ("The 60-minute soak"): `remusdb-drill --soak-table
FILE.json` prints it. Pure: it reads the soak's JSON (drill/soak.py), no
lab.

Per kind: the faults, the acknowledged commits lost, detection and
takeover of the VMs taken over, the client-visible downtime of the VM
that moved and of the other one, the time until every VM was protected
again and (after a takeover) switched home, and the disk resyncs of the
VMs that had to be protected again (full copies counted apart)."""
import statistics

COLUMNS = ("kind", "faults", "lost", "detection ms (median, max)", "takeover ms (median)",
           "moved VM's downtime ms (median, max)", "other VM's downtime ms (median, max)",
           "protected again s (median, max)", "home again s (median)",
           "resync MiB (median, max); full copies")


def median_and_max(values, digits=0):
    if not values:
        return "-"
    med = round(statistics.median(values), digits or None)
    return f"{med}, {round(max(values), digits or None)}"


def kind_row(kind, faults):
    takeovers = [t for f in faults for t in f.get("takeovers") or []]
    moved, other, resync, full = [], [], [], 0
    for f in faults:
        moved_vms = {t["vm"] for t in f.get("takeovers") or []}
        for name, v in (f.get("vms") or {}).items():
            if v.get("downtime_ms") is not None:
                (moved if name in moved_vms else other).append(v["downtime_ms"])
            if v.get("how") == "already":
                continue  # still protected: nothing was copied for this fault
            copy = v.get("disk_copy") or {}
            if copy.get("mode") == "full":
                full += 1
            elif copy.get("bytes_sent") is not None:
                resync.append(copy["bytes_sent"] / 2**20)
    lost = sum(v.get("lost", 0) for f in faults for v in (f.get("vms") or {}).values())
    detection = [t["detection_ms"] for t in takeovers if t.get("detection_ms") is not None]
    takeover = [t["takeover_ms"] for t in takeovers if t.get("takeover_ms") is not None]
    again = [f["protected_again_s"] for f in faults if f.get("protected_again_s") is not None]
    home = [f["home_again_s"] for f in faults
            if f.get("takeovers") and f.get("home_again_s") is not None]
    return (kind, str(len(faults)), str(lost), median_and_max(detection),
            str(round(statistics.median(takeover))) if takeover else "-",
            median_and_max(moved), median_and_max(other), median_and_max(again, 1),
            str(round(statistics.median(home), 1)) if home else "-",
            f"{median_and_max(resync, 1) if resync else '-'}; {full}")


def markdown(result):
    """The table's lines, one row per fault kind in name order."""
    kinds = {}
    for f in result.get("faults") or []:
        kinds.setdefault(f["kind"], []).append(f)
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(kind_row(k, kinds[k])) + " |" for k in sorted(kinds)]
    return lines
