"""How drill results are told: one drill in a few lines, and a series of
drills as the figures it is judged by (pure functions over result dicts,
so that saved JSON can be summarized again)."""


def fmt(value, spec=".1f", unit=""):
    return "n/a" if value is None else f"{value:{spec}}{unit}"


def amcheck_words(r):
    if r.get("amcheck_clean") is None:
        return "not run (the database does not answer)"
    return "clean" if r["amcheck_clean"] else f"NOT clean: {r.get('amcheck_output')}"


def control_words(r):
    if r.get("unsafe_release_early"):
        return "on, but output released one epoch EARLY (negative control)"
    return "on" if r.get("output_commit") else "OFF (negative control)"


def survival_words(r):
    if r.get("connections_before") is None:
        return "connections survived: not measured (no pg_stat_activity snapshot)"
    return (f"connections survived: pgbench {r['pgbench_survived']} of {r['pgbench_before']}, "
            f"ledger {r['ledger_survived']} of {r['ledger_before']} (pgbench clients that "
            f"printed an abort: {r.get('pgbench_aborted_clients') or 'none'}, ledger "
            f"reconnects: {r.get('ledger_reconnects')})")


def summary(r):
    head = (f"== {r.get('drill', 'failover')} drill: {r['mode']}"
            + (f", interval {r['interval_ms']} ms, output commit {control_words(r)}"
               if r["protected"] else "") + f", {r.get('accel') or 'accel n/a'} ==")
    lines = [head, f"work directory: {r.get('workdir')}"]
    if r.get("failed_reason"):
        lines.append(r["verdict"])
        return "\n".join(lines)
    if r["protected"]:
        lines.append(f"protected in {fmt(r['protect_s'], '.1f', ' s')}; failure at "
                     f"{fmt(r['failure_at_s'], '.1f', ' s')} into the load")
        asked = r.get("drill") == "switchover"  # nothing to detect: the backup was asked
        lines.append(f"takeover: {'yes' if r['takeover'] else 'NO'}"
                     + (f", {fmt(r['takeover_ms'], '.0f', ' ms')} from epoch "
                        f"{r['replica_committed_epoch']}, asked by the switchover"
                        if r["takeover"] and asked else
                        f", {fmt(r['takeover_ms'], '.0f', ' ms')} from epoch "
                        f"{r['replica_committed_epoch']}; detected "
                        f"{fmt(r['detection_ms'], '.0f', ' ms')} after the primary was last "
                        f"heard (peer timeout {fmt(r['peer_timeout_ms'], 'd', ' ms')})"
                        if r["takeover"] else f" ({r['takeover_error']})"))
    lines += switchover_lines(r)
    downtime = fmt(r["downtime_ms"], ".0f", " ms") + (
        "" if r["clients_recovered"] else " (clients NEVER recovered: until the load ended)")
    lines.append(f"acknowledged commits {r['acked_commits']}, lost "
                 f"{fmt(r['lost_acked_commits'], 'd')}; client-visible downtime {downtime}")
    lines.append(survival_words(r))
    lines.append(f"TPS before {fmt(r['tps_before'])}, after {fmt(r['tps_after'])}")
    if r["protected"]:
        lines.append(f"before the failure: {fmt(r['epochs'], 'd')} epochs, pause p50/p99 "
                     f"{fmt(r['pause_ms_p50'])}/{fmt(r['pause_ms_p99'], '.1f', ' ms')}, "
                     f"{fmt((r['bytes_per_epoch_mean'] or 0) / 1024, '.1f', ' KiB')}/epoch")
    cut = r.get("power_cut")
    if cut:
        lines.append(f"power cut: {cut['lan_frames_from_primary_after_cut']} frames reached "
                     f"the LAN from the primary after the cut; dropped at its edge: "
                     f"{sum(cut['frames_dropped'].values())} frames")
    if r["guest_kernel_errors"]:
        lines.append(f"guest kernel errors on the console: {len(r['guest_kernel_errors'])}, "
                     f"first: {r['guest_kernel_errors'][0]}")
    lines.append(f"pg_amcheck: {amcheck_words(r)}")
    lines.append(r["verdict"])
    return "\n".join(lines)


def switchover_lines(r):
    """What a switchover drill adds: its steps' times, where the VM stopped
    and resumed, and the protection the other way round."""
    so = r.get("switchover")
    if not so:
        return []
    lines = [f"switchover {so['from']} -> {so['to']}: stopped at checkpoint {so['held_epoch']}, "
             f"resumed from epoch {r.get('replica_committed_epoch')}; VM paused "
             f"{fmt(so.get('vm_paused_ms'), '.0f', ' ms')}, request to resume "
             f"{fmt(so.get('request_to_resume_ms'), '.0f', ' ms')}"]
    lines += [f"  +{s['at_s']:.3f} s {s['text']}" for s in so.get("steps") or []]
    rev = r.get("reverse_protection")
    if rev and rev.get("state") is None:
        lines.append(f"afterwards: not protected back ({rev.get('error') or 'not attempted'}), "
                     f"its old QEMU {'STILL RUNS' if rev.get('old_primary_qemu_running') else 'gone'}")
    elif rev:
        copy = rev.get("disk_copy") or {}
        lines.append(f"afterwards: {rev['runs_on']} {rev.get('state')} to {rev.get('peer')} "
                     f"(protected back in {fmt(rev.get('protect_s'), '.1f', ' s')}, disk "
                     f"{copy.get('mode')} copy of {fmt((copy.get('bytes_sent') or 0) / 2**20)} "
                     f"MiB), {rev['backup']}'s replica {rev.get('replica_state')}, its old "
                     f"QEMU {'STILL RUNS' if rev.get('old_primary_qemu_running') else 'gone'}")
    return lines


# ---------------------------------------------------------------- a series

def spread(values):
    """{"min", "median", "max", "n"} of the values that are known."""
    v = sorted(x for x in values if x is not None)
    if not v:
        return {"min": None, "median": None, "max": None, "n": 0}
    mid = len(v) // 2
    median = v[mid] if len(v) % 2 else (v[mid - 1] + v[mid]) / 2
    return {"min": v[0], "median": median, "max": v[-1], "n": len(v)}


def total(results, key):
    return sum(r[key] for r in results if r.get(key) is not None)


def series_summary(results):
    """The facts a series of drills is judged by, over all of them; a
    drill that broke off counts as failed. For negative controls the
    catch rate is the share of drills that lost acknowledged commits,
    over the ones that ran to the end (one that broke off tested nothing),
    and the verdict rate the share whose verdict failed on any check
    (lost commits, or connections that did not survive)."""
    controls = [r for r in results if r.get("negative_control") and not r.get("failed_reason")]
    caught = [r for r in controls if r.get("lost_acked_commits")]
    failed = [r for r in controls if not r.get("passed")]
    return {
        "drills": len(results),
        "passed": sum(1 for r in results if r.get("passed")),
        "failed": sum(1 for r in results if not r.get("passed")),
        "broke_off": sum(1 for r in results if r.get("failed_reason")),
        "failed_reasons": [r.get("verdict") for r in results if not r.get("passed")],
        "modes": sorted({r.get("mode") or "?" for r in results}),
        "interval_ms": sorted({r["interval_ms"] for r in results
                               if r.get("interval_ms") is not None}),
        "peer_timeout_ms": sorted({r["peer_timeout_ms"] for r in results
                                   if r.get("peer_timeout_ms") is not None}),
        "detection_ms": spread(r.get("detection_ms") for r in results),
        "detection_after_failure_ms": spread(r.get("detection_after_failure_ms")
                                             for r in results),
        "downtime_ms": spread(r.get("downtime_ms") for r in results),
        "takeover_ms": spread(r.get("takeover_ms") for r in results),
        "clients_never_recovered": sum(1 for r in results
                                       if r.get("clients_recovered") is False),
        "acked_commits_total": total(results, "acked_commits"),
        "lost_acked_commits_total": total(results, "lost_acked_commits"),
        "unknown_lost": sum(1 for r in results if r.get("lost_acked_commits") is None),
        "pgbench_before_total": total(results, "pgbench_before"),
        "pgbench_survived_total": total(results, "pgbench_survived"),
        "ledger_before_total": total(results, "ledger_before"),
        "ledger_survived_total": total(results, "ledger_survived"),
        "survival_not_measured": sum(1 for r in results if r.get("connections_before") is None),
        "negative_controls": len(controls),
        "negative_controls_broke_off": sum(1 for r in results if r.get("negative_control")
                                           and r.get("failed_reason")),
        "negative_control_catch_rate": (len(caught) / len(controls)) if controls else None,
        "negative_control_verdict_fail_rate": (len(failed) / len(controls)) if controls
        else None,
    }


def series_words(s):
    d, t = s["detection_ms"], s["downtime_ms"]
    lines = [f"== {s['passed']} of {s['drills']} drills passed ({s['failed']} failed, "
             f"{s['broke_off']} broke off); peer timeout {s['peer_timeout_ms'] or 'n/a'} ms",
             f"acknowledged commits {s['acked_commits_total']}, lost "
             f"{s['lost_acked_commits_total']} (unknown in {s['unknown_lost']} drills)",
             f"detection min/median/max {fmt(d['min'], '.0f')}/{fmt(d['median'], '.0f')}/"
             f"{fmt(d['max'], '.0f')} ms; client-visible downtime {fmt(t['min'], '.0f')}/"
             f"{fmt(t['median'], '.0f')}/{fmt(t['max'], '.0f')} ms "
             f"({s['clients_never_recovered']} drills never recovered)",
             f"connections survived: pgbench {s['pgbench_survived_total']} of "
             f"{s['pgbench_before_total']}, ledger {s['ledger_survived_total']} of "
             f"{s['ledger_before_total']}"]
    if s["negative_controls"] or s["negative_controls_broke_off"]:
        rate = s["negative_control_catch_rate"]
        failed = s.get("negative_control_verdict_fail_rate")
        lines.append(f"negative controls run to the end: {s['negative_controls']} "
                     f"({s['negative_controls_broke_off']} broke off), caught lost commits in "
                     f"{fmt(None if rate is None else 100 * rate, '.0f', '%')}, failed the "
                     f"verdict in {fmt(None if failed is None else 100 * failed, '.0f', '%')}")
    return "\n".join(lines)
