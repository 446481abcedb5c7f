"""remusdb-bench overhead: what protection costs a database VM with and
without RemusDB's memory optimizations (thesis Figures 3.8, 3.10 and
3.13-3.15).

One VM is booted once, with the pgbench tables and a scan table several
times PostgreSQL's buffer pool. In one session, against the same VM and
data, each workload runs unprotected (first and last, bracketing the rest,
so drift in the machine's speed shows as a spread of the unprotected runs)
and protected under each configuration at each checkpoint interval:

  remus   no compression, no read tracking (the unoptimized baseline)
  asc     asynchronous XOR+RLE checkpoint compression
  rt      disk read tracking
  asc+rt  both (the daemon's default)

Workloads: OLTP is pgbench's TPC-B-like script with `--clients` (4) and
with `--loaded-clients` (32, a throughput-bound server as in the thesis),
each for `--seconds` after a warm-up; DSS is a fixed amount of work on a cold page cache
(the guest drops it before each run, so the table is read from the disk:
a database larger than memory, as in the thesis's TPC-H), every
one of `--dss-clients` running the scan script (TPC-H Q1- and Q6-like
aggregates over the scan table) `--dss-queries` times, and its throughput
is queries per second of that run (the inverse of its runtime, as the
thesis reports TPC-H). For every protected window the primary's
statistics are reset first and read after, and the backup remusdbd's CPU
time is sampled from /proc, so bytes, pauses and CPU cover that window
only. Bytes are compared per transaction (per query for DSS): a faster
configuration does more work in the same window.

Under output commit a client waits up to one interval for every reply,
and pgbench opens its connections one after another inside its -T
window, so 32 clients at 250 ms spend ~15 s connecting: the OLTP windows
are lengthened by that allowance (throughput is pgbench's "without
initial connection time", so the allowance is not counted as work).
"""
import math
import statistics
import subprocess
import tempfile
import time
from functools import partial

from .. import guest_agent, output, paths, protection
from ..lab import netns, vm, workload
from ..drill.lab import fresh_vm_for_protection, stop_vm_everywhere
from . import harness
from .plot import pyplot

VM_NAME = "benchov"
CONFIGS = {
    "remus": {"compress": False, "read_tracking": False},
    "asc": {"compress": True, "read_tracking": False},
    "rt": {"compress": False, "read_tracking": True},
    "asc+rt": {"compress": True, "read_tracking": True},
}
SCAN_TABLE = "dss_items"
ROW_BYTES = 120  # roughly, with the tuple header: sizes the scan table
# TPC-H Q1- and Q6-like queries over the scan table; each pgbench
# "transaction" runs both. Their parameters are fixed, as TPC-H's
# validation run fixes them, so that every run does the same work: random
# ranges made Q1 aggregate 4% to 100% of the table and two unprotected runs
# differed by 30%.
DSS_SCRIPT = f"""SELECT flag, status, count(*), sum(qty), sum(price), avg(discount)
  FROM {SCAN_TABLE} WHERE shipday <= 2400 GROUP BY flag, status;
SELECT sum(price * discount) FROM {SCAN_TABLE}
  WHERE shipday BETWEEN 1000 AND 1365 AND discount BETWEEN 0.02 AND 0.09 AND qty < 24;
"""

say = partial(output.say, "bench overhead")


def csv_names(valid):
    def parse(text):
        names = [x.strip() for x in text.split(",") if x.strip()]
        bad = [n for n in names if n not in valid]
        if not names or bad:
            raise ValueError(f"choose from {', '.join(valid)}: {text!r}")
        return names
    return parse


def add_parser(sub):
    b = sub.add_parser("overhead", help="Remus vs ASC vs RT vs ASC+RT vs unprotected, "
                       "OLTP and DSS, at each interval")
    b.add_argument("--intervals", type=harness.csv_ints, default=[25, 50, 100, 250],
                   metavar="MS,...")
    b.add_argument("--configs", type=csv_names(list(CONFIGS)), default=list(CONFIGS),
                   metavar="NAME,...", help=f"of {', '.join(CONFIGS)}")
    b.add_argument("--workloads", type=csv_names(["oltp", "oltp-loaded", "dss"]),
                   default=["oltp", "oltp-loaded", "dss"], metavar="NAME,...")
    b.add_argument("--seconds", type=int, default=40, help="measured seconds per run")
    b.add_argument("--warmup", type=int, default=10, help="seconds of load before each run")
    b.add_argument("--clients", type=int, default=4)
    b.add_argument("--loaded-clients", type=int, default=32)
    b.add_argument("--dss-clients", type=int, default=2)
    b.add_argument("--dss-queries", type=int, default=1,
                   help="scan scripts each DSS client runs per measured run")
    b.add_argument("--dss-warm", action="store_true",
                   help="keep the guest's page cache between DSS runs (default: drop it, "
                        "so that every run reads the table from disk)")
    b.add_argument("--scan-mb", type=int, default=384,
                   help="scan table size (PostgreSQL's buffer pool is 128 MiB)")
    b.add_argument("--repeat", type=int, default=1, help="runs per point (spread shown)")
    b.add_argument("--repeat-at", type=harness.csv_ints, default=None, metavar="MS,...",
                   help="intervals whose points get --repeat runs (default: all); "
                        "the others get one")
    b.add_argument("--out", default=None, help="output stem (default docs/bench/overhead)")
    return b


# The scan table is written in transactions of about this size, with a
# CHECKPOINT after each and wal_keep_size 0 meanwhile, so that the guest's
# pg_wal holds about one of them at a time: one transaction for the whole
# table kept up to max_wal_size of WAL beside the table, and the image's
# wal_keep_size (512MB, for forked clones: tools/guest/overlay/etc/
# postgresql/15/main/conf.d/remusdb.conf) keeps that much after any
# checkpoint; either fills the guest's root filesystem.
SCAN_CHUNK_MB = 64


def scan_rows(first, last):
    """The scan table's rows first..last (ids), as CREATE TABLE AS and
    INSERT take them: the columns' types come from these expressions."""
    return f"""SELECT i AS id,
          (i % 3)::int AS flag, (i % 2)::int AS status,
          (random() * 50)::int AS qty, (random() * 1000)::numeric(12,2) AS price,
          (random() * 0.1)::numeric(4,2) AS discount, (i % 2500)::int AS shipday,
          md5(i::text) || md5((i * 7)::text) AS comment
        FROM generate_series({first}, {last}) AS i"""


def scan_chunks(rows, mb):
    """(first, last) id ranges of about SCAN_CHUNK_MB each, in order,
    covering 1..rows."""
    n = max(1, math.ceil(mb / SCAN_CHUNK_MB))
    bounds = [rows * k // n for k in range(n + 1)]
    return [(lo + 1, hi) for lo, hi in zip(bounds, bounds[1:]) if hi > lo]


def guest_free_space(qga):
    """What df says of the filesystem under PostgreSQL's data in the
    guest, read through its guest agent: "N MiB free of M MiB on /"."""
    try:
        r = guest_agent.run(qga, ["/bin/sh", "-c", "df -Pk /var/lib/postgresql"], timeout=60)
        fields = r["out"].splitlines()[-1].split()
        if r["exitcode"] != 0 or len(fields) < 6:
            return f"free space unknown (df: {(r['err'] or r['out']).strip()!r})"
        return f"{int(fields[3]) // 1024} MiB free of {int(fields[1]) // 1024} MiB on {fields[5]}"
    except (guest_agent.GuestAgentError, IndexError, ValueError) as e:
        return f"free space unknown ({e})"


def guest_superuser_sql(qga, *statements):
    """Statements (no single quotes in them) run one by one by the guest's
    PostgreSQL superuser through the guest agent: the bench role may not
    CHECKPOINT or ALTER SYSTEM."""
    commands = " ".join(f"-c '{sql}'" for sql in statements)
    r = guest_agent.run(qga, ["/bin/sh", "-c", f"su postgres -c \"psql -X -q -At {commands}\""],
                        timeout=600)
    if r["exitcode"] != 0:
        raise SystemExit(f"in the guest, {'; '.join(statements)} failed: "
                         f"{(r['err'] or r['out']).strip()}")


def set_wal_keep_size(qga, value):
    """wal_keep_size of the guest's PostgreSQL: "0", or None for the
    image's own (ALTER SYSTEM RESET); returns once new sessions see it."""
    guest_superuser_sql(qga, f"ALTER SYSTEM SET wal_keep_size = {value}" if value is not None
                        else "ALTER SYSTEM RESET wal_keep_size", "SELECT pg_reload_conf()")
    deadline = time.monotonic() + 30
    while True:
        now = workload.psql(vm.DEFAULT_IP, "SHOW wal_keep_size")
        if (now == "0") == (value is not None) or time.monotonic() > deadline:
            return now
        time.sleep(0.5)


def create_scan_table(mb, vm_name):
    """The scan table of ~mb MiB in the VM vm_name on the primary, unless
    it is there; returns its rows. Created chunk by chunk (SCAN_CHUNK_MB),
    the same rows as one CREATE TABLE AS over generate_series(1, rows)."""
    rows = mb * (1 << 20) // ROW_BYTES
    have = workload.psql(vm.DEFAULT_IP, f"SELECT to_regclass('{SCAN_TABLE}') IS NOT NULL")
    if have == "t":
        return rows
    qga = vm.vm_files("primary", vm_name)["qga"]
    chunks = scan_chunks(rows, mb)
    say(f"creating {SCAN_TABLE}: {rows} rows (~{mb} MiB) in {len(chunks)} transactions; "
        f"guest: {guest_free_space(qga)}")
    kept = set_wal_keep_size(qga, "0")
    if kept != "0":
        raise SystemExit(f"the guest's wal_keep_size stays {kept} after ALTER SYSTEM SET 0")
    for first, last in chunks:
        sql = (f"CREATE TABLE {SCAN_TABLE} AS {scan_rows(first, last)}" if first == 1
               else f"INSERT INTO {SCAN_TABLE} {scan_rows(first, last)}")
        try:
            workload.psql(vm.DEFAULT_IP, sql)
        except RuntimeError as e:
            raise SystemExit(f"creating {SCAN_TABLE} failed at rows {first}..{last} of {rows} "
                             f"(guest: {guest_free_space(qga)}): {e}")
        guest_superuser_sql(qga, "CHECKPOINT")
        say(f"{SCAN_TABLE}: {last} of {rows} rows; guest: {guest_free_space(qga)}")
    # The guest measured runs with its image's configuration.
    kept = set_wal_keep_size(qga, None)
    say(f"wal_keep_size back to {kept}")
    workload.psql(vm.DEFAULT_IP, f"ANALYZE {SCAN_TABLE}")
    size = workload.psql(vm.DEFAULT_IP, f"SELECT pg_total_relation_size('{SCAN_TABLE}')")
    say(f"{SCAN_TABLE}: {int(size) / (1 << 20):.0f} MiB")
    return rows


def connect_allowance_s(clients, threads, interval_ms):
    """Seconds pgbench needs to open its connections when every reply is
    held for up to one interval: a connection is ~4 round trips, opened
    one after another per thread."""
    return math.ceil(clients / threads * 4 * interval_ms / 1000.0)


def drop_guest_caches():
    """The guest's page cache is emptied (through its guest agent, not the
    network), so the next scan reads its table from the disk: a database
    several times larger than memory, as in the thesis's TPC-H runs, where
    every page read is a page the checkpoint must carry unless read
    tracking names its disk block."""
    r = guest_agent.run(vm.vm_files("primary", VM_NAME)["qga"],
                        ["/bin/sh", "-c", "sync; echo 3 > /proc/sys/vm/drop_caches"], timeout=60)
    if r["exitcode"] != 0:
        raise SystemExit(f"cannot drop the guest's page cache: {r}")


def run_workload(args, name, seconds, script, interval_ms=0):
    if name == "dss":
        if not args.dss_warm:
            drop_guest_caches()
        return workload.pgbench(vm.DEFAULT_IP, transactions=args.dss_queries,
                                clients=args.dss_clients, threads=args.dss_clients,
                                extra=("-n", "-f", script))
    clients = args.loaded_clients if name == "oltp-loaded" else args.clients
    return workload.pgbench(vm.DEFAULT_IP, seconds=seconds + connect_allowance_s(
        clients, 2, interval_ms), clients=clients, threads=2)


def backup_daemon_cpu_s():
    """User+system CPU seconds of the backup host's remusdbd so far."""
    out = subprocess.run(["ip", "netns", "pids", netns.namespace_of("backup")],
                         capture_output=True, text=True).stdout.split()
    daemons = []
    for pid in out:
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() == "remusdbd":
                    daemons.append(pid)
        except OSError:
            continue
    return harness.cpu_seconds(daemons)


def measure(args, name, script, label):
    """A warm-up (OLTP only: DSS is primed once), then one measured window."""
    if name != "dss":
        run_workload(args, name, args.warmup, script)
    return measure_window(args, name, script, label)


def window_stats(before, after, cpu_s, seconds, transactions):
    """What the primary's status says about one window (stats were reset
    at its start), plus the backup's CPU use."""
    keys = ("epochs_since_reset", "pause_ms_p50", "pause_ms_p99", "bytes_per_epoch_mean",
            "dirty_pages_per_epoch_mean", "backpressure_events")
    s = {k: after.get(k) for k in keys if k in after}
    pipeline = after.get("pipeline") or {}
    s["pipeline"] = pipeline  # raw vs sent bytes, kinds, compression and read_tracking
    s["bytes_sent"] = after.get("bytes_sent", 0) - before.get("bytes_sent", 0)
    s["bytes_per_tx"] = s["bytes_sent"] / transactions if transactions else None
    s["device_blob_bytes_per_epoch"] = pipeline.get("device_blob_bytes_per_epoch_mean")
    s["device_bytes_sent_per_epoch"] = pipeline.get("device_bytes_sent_per_epoch_mean")
    s["backup_cpu_percent"] = 100.0 * cpu_s / seconds
    return s


def protected_runs(args, interval, config, script):
    started = time.monotonic()
    with harness.protected(VM_NAME, interval, options=CONFIGS[config]):
        say(f"{config} at {interval} ms: protected in {time.monotonic() - started:.0f} s")
        runs = []
        repeats = args.repeat if args.repeat_at is None or interval in args.repeat_at else 1
        for name in args.workloads:
            for rep in range(repeats):
                (r, before, wall, cpu), after = harness.measured_window(
                    VM_NAME, lambda: warm_up(args, name, script, interval),
                    lambda: measure_with_cpu(args, name, script,
                                             f"{config} {interval} ms {name}", interval))
                r.update({"workload": name, "config": config, "interval_ms": interval,
                          "repeat": rep, "state_after": after.get("state"),
                          "wall_s": wall,
                          **window_stats(before, after, cpu, wall, r["transactions"])})
                if after.get("state") != "protected":
                    r["ok"] = False
                    r["error"] = f"protection broke: {after.get('error')}"
                runs.append(r)
    return runs


def warm_up(args, name, script, interval_ms):
    """OLTP only: DSS is primed once."""
    if name != "dss":
        run_workload(args, name, args.warmup, script, interval_ms)


def measure_with_cpu(args, name, script, label, interval_ms):
    """One measured window (stats just reset), the primary's status at its
    start, its wall time and the backup daemon's CPU seconds in it."""
    before = protection.primary_protection("primary", VM_NAME)
    cpu0 = backup_daemon_cpu_s()
    t0 = time.monotonic()
    r = measure_window(args, name, script, label, interval_ms)
    wall = time.monotonic() - t0
    cpu = backup_daemon_cpu_s() - cpu0
    return r, before, wall, cpu


def measure_window(args, name, script, label, interval_ms=0):
    """One measured window; a failed run is recorded (ok false, tps None),
    never dropped."""
    r = run_workload(args, name, args.seconds, script, interval_ms)
    ok = r["exit_code"] == 0 and r["tps"] is not None and r["tps"] > 0
    say(f"{label:>28}: " + (f"{r['tps']:.2f} tx/s" if ok else "FAILED"))
    return {"ok": ok, "tps": r["tps"] if ok else None, "latency_ms": r["latency_ms"],
            "transactions": r["transactions"], "error": None if ok else r["output"][-1500:]}


def unprotected_runs(args, script, phase):
    runs = []
    for name in args.workloads:
        for rep in range(args.repeat):
            r = measure(args, name, script, f"unprotected {name} ({phase})")
            r.update({"workload": name, "config": "unprotected", "repeat": rep,
                      "phase": phase})
            runs.append(r)
    return runs


def summarize(runs):
    base = {}
    for r in runs:
        if r["config"] == "unprotected" and r["ok"]:
            base.setdefault(r["workload"], []).append(r["tps"])
    base_mean = {w: statistics.mean(v) for w, v in base.items()}
    points = {}
    for r in runs:
        if r["config"] == "unprotected":
            continue
        key = (r["workload"], r["config"], r["interval_ms"])
        points.setdefault(key, []).append(r)
    summary = []
    for (w, c, ms), rs in sorted(points.items()):
        good = [x["tps"] for x in rs if x["ok"]]
        ratios = [t / base_mean[w] for t in good] if w in base_mean else []
        summary.append({
            "workload": w, "config": c, "interval_ms": ms, "runs": len(rs),
            "failed_runs": len(rs) - len(good),
            "ratio_to_unprotected": statistics.mean(ratios) if ratios else None,
            "ratio_min": min(ratios) if ratios else None,
            "ratio_max": max(ratios) if ratios else None,
            "bytes_sent_mean": statistics.mean(x["bytes_sent"] for x in rs),
            "bytes_per_tx_mean": _mean_of(x.get("bytes_per_tx") for x in rs),
            "device_blob_bytes_per_epoch": _mean_of(
                x.get("device_blob_bytes_per_epoch") for x in rs),
            "device_bytes_sent_per_epoch": _mean_of(
                x.get("device_bytes_sent_per_epoch") for x in rs),
            "pause_ms_p50": statistics.mean(x.get("pause_ms_p50") or 0 for x in rs),
            "pause_ms_p99": statistics.mean(x.get("pause_ms_p99") or 0 for x in rs),
            "backup_cpu_percent": statistics.mean(x["backup_cpu_percent"] for x in rs),
        })
    return base_mean, summary


def _mean_of(values):
    v = [x for x in values if x is not None]
    return statistics.mean(v) if v else None


def bytes_vs_remus(summary):
    """Per point: bytes per transaction relative to Remus at the same
    workload and interval (1.0 = as many, 0.1 = 90% saved)."""
    remus = {(s["workload"], s["interval_ms"]): s["bytes_per_tx_mean"]
             for s in summary if s["config"] == "remus"}
    for s in summary:
        base = remus.get((s["workload"], s["interval_ms"]))
        s["bytes_per_tx_vs_remus"] = (s["bytes_per_tx_mean"] / base
                                      if base and s["bytes_per_tx_mean"] is not None else None)


def run(args, out_dir):
    accel = fresh_vm_for_protection(VM_NAME)
    runs = []
    with tempfile.NamedTemporaryFile("w", suffix=".sql", prefix="rdb-dss-") as f:
        f.write(DSS_SCRIPT)
        f.flush()
        try:
            if "dss" in args.workloads:
                create_scan_table(args.scan_mb, VM_NAME)
                # Primes the page cache and sets the tuples' hint bits, so
                # no measured run pays for the first scan after creation.
                say("priming: one DSS run")
                run_workload(args, "dss", 0, f.name)
            runs += unprotected_runs(args, f.name, "first")
            for ms in args.intervals:
                for config in args.configs:
                    runs += protected_runs(args, ms, config, f.name)
            runs += unprotected_runs(args, f.name, "last")
        finally:
            stop_vm_everywhere(VM_NAME)
    base, summary = summarize(runs)
    bytes_vs_remus(summary)
    result = {
        "benchmark": "overhead",
        "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "accel": accel,
        "guest": {"vcpus": 1, "memory_mib": 1024, "pgbench_scale": 5,
                  "scan_table_mb": args.scan_mb, "shared_buffers_mb": 128},
        "settings": {k: getattr(args, k) for k in (
            "intervals", "configs", "workloads", "seconds", "warmup", "clients",
            "loaded_clients", "dss_clients", "dss_queries", "dss_warm", "repeat",
            "repeat_at")},
        "configs": {c: CONFIGS[c] for c in args.configs},
        "qemu": str(paths.qemu_binary().resolve()),
        "unprotected_tps_mean": base,
        "summary": summary,
        "runs": runs,
    }
    stem = args.out or str(out_dir / "overhead")
    workload.save_json(stem + ".json", result)
    plot(result, stem + ".png")
    say(f"wrote {stem}.json and {stem}.png")
    return result


def plot(result, path):
    plt = pyplot()
    workloads = result["settings"]["workloads"]
    configs = result["settings"]["configs"]
    rows = [("throughput / unprotected", None),
            ("KiB replicated per transaction", "bytes_per_tx_mean"),
            ("pause p99 (ms)", "pause_ms_p99"),
            ("backup remusdbd CPU (%)", "backup_cpu_percent")]
    fig, axes = plt.subplots(len(rows), len(workloads), figsize=(5 * len(workloads), 13),
                             squeeze=False)
    for col, w in enumerate(workloads):
        for c in configs:
            pts = [s for s in result["summary"] if s["workload"] == w and s["config"] == c]
            good = [s for s in pts if s["ratio_to_unprotected"] is not None]
            axes[0][col].errorbar(
                [s["interval_ms"] for s in good], [s["ratio_to_unprotected"] for s in good],
                yerr=[[s["ratio_to_unprotected"] - s["ratio_min"] for s in good],
                      [s["ratio_max"] - s["ratio_to_unprotected"] for s in good]],
                marker="o", capsize=3, label=c)
            for row, (_, key) in enumerate(rows[1:], start=1):
                xy = [(s["interval_ms"], s[key]) for s in pts if s.get(key) is not None]
                scale = 1 / 1024 if key == "bytes_per_tx_mean" else 1
                axes[row][col].plot([x for x, _ in xy], [y * scale for _, y in xy],
                                    marker="o", label=c)
        axes[0][col].axhline(1.0, color="grey", linestyle="--", linewidth=1)
        axes[0][col].set_title(w)
        for row, (label, key) in enumerate(rows):
            ax = axes[row][col]
            ax.set_xscale("log")
            ax.set_xticks(result["settings"]["intervals"])
            ax.set_xticklabels([str(x) for x in result["settings"]["intervals"]])
            ax.set_xlabel("checkpoint interval (ms)")
            ax.set_ylabel(label)
            if key == "bytes_per_tx_mean":
                ax.set_yscale("log")
            ax.legend(fontsize=7)
    fig.suptitle(f"Protection overhead ({result['accel']}; OLTP {result['settings']['seconds']} s "
                 f"windows, DSS {result['settings']['dss_queries']} scan script(s) per client)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
