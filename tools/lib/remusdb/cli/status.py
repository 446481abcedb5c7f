"""`remusdb status`: what each host's remusdbd reports (VMs, disks, NICs,
protection, replicas and forks), as lines for people or as JSON. Without
--host, every host of the cluster file, each asked through its own
control access (its local socket, or ssh), all at once: one host that
does not answer costs its own line and its timeout, not the others'."""
import json
from concurrent.futures import ThreadPoolExecutor

from .. import cluster, control, protection
from .arguments import add_host


def human_protection(p):
    age = p.get("last_ack_age_ms")
    line = (f"    protection: {p.get('role', 'primary')} -> {p.get('peer', '?')} "
            f"{p.get('state', '?').upper()} epoch={p.get('epoch', 0)} "
            f"acked={p.get('acked_epoch', 0)} in-flight={p.get('in_flight', 0)} "
            f"last-ack={'never' if age is None else f'{age} ms ago'} "
            f"interval={p.get('interval_ms', '?')} ms")
    lines = [line,
             f"      pause p50/p99={p.get('pause_ms_p50', 0):.1f}/"
             f"{p.get('pause_ms_p99', 0):.1f} ms "
             f"bytes/epoch={p.get('bytes_per_epoch_mean', 0) / 1024:.1f} KiB "
             f"epochs={p.get('epochs', 0)} held-frames={p.get('held_frames', 0)} "
             f"backpressure={p.get('backpressure_events', 0)} "
             f"generation={p.get('generation', 0)}"
             + ("" if p.get("output_commit", True) else " OUTPUT-COMMIT-OFF (unsafe)")]
    if p.get("state") == "syncing":
        lines.append(f"      {protection.describe_progress(p)}")
    copy = p.get("disk_copy")
    if copy:
        lines.append(f"      disk: {copy.get('mode')} copy, {copy.get('bytes_sent', 0) / 2**20:.1f} "
                     f"MiB of {copy.get('extents', 0)} extents ({copy.get('reason', '')})")
    if p.get("error"):
        lines.append(f"      error: {p['error']}")
    lines += human_reprotect(p.get("reprotect"))
    return lines


def human_reprotect(r):
    """The gap after a lost backup and the tries to close it (automatic
    re-protection); nothing while no gap is open and none was closed."""
    if not r:
        return []
    lines = []
    if r.get("unprotected_since") is not None:
        nxt = r.get("next_attempt_in_ms")
        lines.append(f"      UNPROTECTED for {r.get('unprotected_seconds', 0):.0f} s: "
                     f"{r.get('attempts', 0)} tries of the backup"
                     + (f", next in {nxt / 1000:.1f} s" if nxt is not None else "")
                     + (f" (last: {r['last_error']})" if r.get("last_error") else ""))
    if r.get("verdict") and (r.get("unprotected_since") is not None or r.get("attempts")):
        lines.append(f"      not re-protected: {r['verdict']}")
    if r.get("reprotections"):
        lines.append(f"      re-protected {r['reprotections']} time(s) by itself; the last gap "
                     f"lasted {r.get('last_gap_seconds') or 0:.1f} s")
    return lines


def human_replica(r):
    lines = [f"  replica {r.get('vm', '?')}: backup of {r.get('peer', '?')} "
             f"{r.get('state', '?').upper()} committed-epoch={r.get('committed_epoch', 0)} "
             f"last-heard={r.get('last_heard_ms', '?')} ms ago"]
    f = r.get("failover")
    if f:
        def ms(key):
            return "-" if f.get(key) is None else f"{f[key]:.0f} ms"
        lines.append(f"    failover: detected {ms('detected_ms_after_last_heard')} after last "
                     f"heard, restore {ms('restore_ms')}, total {ms('total_ms')}")
    base = r.get("disk_base")
    if base:
        lines.append(f"    disk {base.get('path')}: {base.get('mode')} copy ({base.get('reason')})")
    if r.get("error"):
        lines.append(f"    error: {r['error']}")
    if r.get("retire"):
        lines.append(f"    idle {r['retire']['idle_s']} s: retired in "
                     f"{r['retire']['retired_in_s']} s (or now: remusdb forget "
                     f"{r.get('vm', 'VM')})")
    if r.get("fork"):
        lines += human_fork(r["fork"])
    return lines


def human_fork(f):
    lines = [f"    fork {f['id']}: {f['state'].upper()}"
             + (f" parent paused {f['parent_pause_ms']:.0f} ms" if "parent_pause_ms" in f else "")
             + (f" from the committed image of epoch {f.get('epoch')} (fork() "
                f"{f.get('backup_fork_call_ms', 0):.1f} ms)" if f.get("from") == "backup" else "")
             + (f" page source pid {f['pagesrc_pid']}" if f.get("pagesrc_running") else "")]
    for name, c in sorted((f.get("clones") or {}).items()):
        lines.append(f"      clone {name}: {c.get('state')} pages requested="
                     f"{c.get('pages_requested')} pushed={c.get('pages_pushed')}/"
                     f"{c.get('pages_total')} fault p50/p99={c.get('latency_p50_us')}/"
                     f"{c.get('latency_p99_us')} us")
    if f.get("disk"):
        d = f["disk"]
        lines.append(f"      disk snapshot {d['export']} on {d['host']}:{d['port']}: "
                     f"read {d['bytes_read']} B, {d['blocks_preserved']} blocks preserved")
    if f.get("error"):
        lines.append(f"      error: {f['error']}")
    return lines


def human_status(host, reply):
    lines = [f"host {host}: remusdbd"]
    vms = reply.get("vms", [])
    if not vms:
        lines.append("  no VMs")
    for v in vms:
        run_state = v.get("run_state") or "unknown"
        lines.append(f"  VM {v['name']}: qemu {v.get('qemu_version') or '?'} "
                     f"state={run_state}"
                     + (" (QEMU IS NOT RUNNING: `tools/remusdb-vm start "
                        f"{v['name']} --host {host}` restarts it)" if run_state == "no-qemu"
                        else ""))
        if v.get("protection"):
            lines += human_protection(v["protection"])
            if run_state == "no-qemu":
                lines.append("      the VM's QEMU is gone: nothing runs or is protected here")
        for d in v.get("disks", []):
            lines.append(f"    disk {d['export']}: {d['path']} ({d['size'] >> 20} MiB) "
                         f"conns={d['connections']} reads={d['reads']} writes={d['writes']} "
                         f"read={d['bytes_read']}B written={d['bytes_written']}B "
                         f"flushes={d['flushes']} errors={d['errors']}")
        for n in v.get("nics", []):
            quarantine = n.get("quarantine", "off")
            lines.append(f"    nic {n['tap']} ({n['mac']}) on {n['bridge']}: "
                         f"{'connected' if n['connected'] else 'DISCONNECTED'} "
                         f"to-guest={n['frames_to_guest']}f/{n['bytes_to_guest']}B "
                         f"from-guest={n['frames_from_guest']}f/{n['bytes_from_guest']}B "
                         f"dropped={n['dropped']}"
                         + ("" if quarantine == "off" else
                            f" QUARANTINE={quarantine} ({n.get('quarantine_dropped', 0)} dropped)"))
        if v.get("fork"):
            lines += human_fork(v["fork"])
        if v.get("clone"):
            c = v["clone"]
            lines.append(f"    clone of {c.get('of')}: {c.get('state', '?').upper()}"
                         + (f" ({c['error']})" if c.get("error") else ""))
    for r in reply.get("replicas", []):
        lines += human_replica(r)
    return "\n".join(lines)


def ask(host):
    """host's status reply, or {"ok": False, "error": why it has none}."""
    try:
        return control.request_via(host.control, "status", timeout=5.0)
    except control.ControlError as e:
        return {"ok": False, "error": str(e)}
    except ValueError as e:  # a reply that is not JSON
        return {"ok": False, "error": f"a malformed reply: {e}"}


def cmd_status(args):
    c = cluster.current()
    hosts = [c.host(args.host)] if args.host else list(c.hosts.values())
    with ThreadPoolExecutor(max_workers=min(8, len(hosts))) as pool:
        replies = list(pool.map(ask, hosts))
    results = {h.name: r for h, r in zip(hosts, replies)}
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for h, reply in zip(hosts, replies):
            print(human_status(h.name, reply) if reply.get("ok")
                  else f"host {h.name}: unreachable ({h.control.describe()}): {reply['error']}")
    return 0 if any(r.get("ok") for r in replies) else 1


def add_parser(sub):
    p = sub.add_parser("status", description="What each host's remusdbd reports: VMs, "
                                              "disks, NICs, protection and replicas.")
    add_host(p, "only this host", "default: every host of the cluster file")
    p.add_argument("--json", action="store_true", help="print every host's reply as JSON")
    p.set_defaults(func=cmd_status)
