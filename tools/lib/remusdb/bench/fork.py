"""remusdb-bench fork: read replicas by VM fork against the ordinary way
(issue 11; FlurryDB's Figure 8 and its 5.5-7.4 s per MySQL replica).

One parent VM runs a pgbench write load from the client host for the whole
run (`-P 1 --progress-timestamp`, so its TPS is known second by second).
The parent is forked into N = 1, 2 and 4 replicas in turn (clones on the
primary and backup hosts alternately), each fork measured:
  (a) fork -> first read query answered on each clone (from the client host);
  (b) fork -> each replica caught up: its replay LSN reached the parent's
      LSN of one second earlier (replay lag under 1 s);
  (c) bytes fetched by then: memory from the page source (per clone),
      disk read through the frozen snapshot (all clones), against the VM's
      RAM and disk size;
  (d) the parent's TPS dip: the 10 s after the fork against the 10 s
      before, and the lowest 1-s TPS in that window;
then the clones are stopped and the fork released. Last, (e) the same
replica made the ordinary way: a fresh VM booted from the image, its
cluster replaced by pg_basebackup from the parent, started as a standby,
timed the same way (a)-(c).
"""
import json
import re
import subprocess
import threading
import time
from functools import partial

from .. import fork, guest_agent, output, paths
from ..lab import cluster_file, netns, vm, workload
from .harness import result_head
from .plot import pyplot

PARENT = "bfk"
PARENT_IP = f"{netns.SUBNET_PREFIX}.13"
BASE_VM = "bfkbase"
BASE_IP = f"{netns.SUBNET_PREFIX}.39"
MEM_MB = 1024
say = partial(output.say, "bench fork")


def add_parser(sub):
    b = sub.add_parser("fork", help="replicas by VM fork (N=1,2,4) vs. pg_basebackup + fresh VM")
    b.add_argument("--counts", default="1,2,4", help="clone counts, in order (default 1,2,4)")
    b.add_argument("--clients", type=int, default=4, help="pgbench clients on the parent")
    b.add_argument("--settle", type=int, default=20,
                   help="seconds of load before each fork and after its replicas caught up")
    b.add_argument("--out", default=None, help="output stem (default docs/bench/fork)")
    return b


class Load:
    """pgbench on the parent for as long as the benchmark runs."""

    def __init__(self, clients):
        cmd = ["ip", "netns", "exec", workload.CLIENT_NS, "pgbench", "-h", PARENT_IP,
               "-U", workload.DB_USER, "-c", str(clients), "-j", "2", "-T", "36000",
               "-P", "1", "--progress-timestamp", workload.DB_NAME]
        self.proc = subprocess.Popen(cmd, env=workload.PG_ENV, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        self.samples = []  # (unix time, tps)
        self.lines = []
        self.thread = threading.Thread(target=self.read, daemon=True)
        self.thread.start()

    def read(self):
        for line in self.proc.stdout:
            self.lines.append(line)
            m = re.search(r"progress: ([\d.]+) s, ([\d.]+) tps", line)
            if m:
                self.samples.append((float(m.group(1)), float(m.group(2))))

    def stop(self):
        self.proc.terminate()
        self.proc.wait(30)
        self.thread.join(10)

    def window(self, t0, t1):
        return [tps for t, tps in self.samples if t0 <= t < t1]


def lsn(ip):
    return workload.psql(ip, "SELECT pg_current_wal_lsn()")


def wait_caught_up(ips, started, timeout=600):
    """Seconds from `started` (unix time) until each standby's replay LSN
    reached the parent's LSN sampled at least one second earlier."""
    history, done = [], {}
    deadline = time.time() + timeout
    while len(done) < len(ips):
        now = time.time()
        history.append((now, lsn(PARENT_IP)))
        old = [l for t, l in history if t <= now - 1.0]
        if old:
            for ip in ips:
                if ip in done:
                    continue
                ok = workload.psql(ip, f"SELECT pg_last_wal_replay_lsn() >= '{old[-1]}'::pg_lsn",
                                   check=False)
                if ok == "t":
                    done[ip] = round(time.time() - started, 3)
        if time.time() > deadline:
            raise SystemExit(f"replicas not caught up within {timeout} s: {sorted(set(ips) - set(done))}")
        time.sleep(0.2)
    return done


def tps_dip(load, t_fork):
    before = load.window(t_fork - 10, t_fork)
    after = load.window(t_fork, t_fork + 10)
    mean = lambda xs: sum(xs) / len(xs) if xs else None  # noqa: E731
    return {"tps_before": mean(before), "tps_after": mean(after),
            "tps_min_after": min(after) if after else None,
            "ratio": (mean(after) / mean(before)) if before and after and mean(before) else None}


def fork_phase(load, n, settle):
    time.sleep(settle)
    hosts = ["primary", "backup"]
    t_fork = time.time()
    report = fork.fork(PARENT, n, hosts=hosts, role="replica",
                       connect_via=netns.client_call)
    clones = report["clones"]
    try:
        caught = wait_caught_up([c["ip"] for c in clones], t_fork)
        st = fork.daemon_status(report["parent_host"], PARENT)["fork"]
        disk_read = st.get("disk", {}).get("bytes_read")
        out = {"n": n, "t_fork": t_fork, "parent_pause_ms": st.get("parent_pause_ms"),
               "qemu_downtime_ms": st.get("qemu_downtime_ms"),
               "snapshot_ms": st.get("snapshot_ms"), "capture": st.get("capture"),
               "marks": report["marks"], "disk_bytes_read_caught_up": disk_read,
               "disk_blocks_preserved": st.get("disk", {}).get("blocks_preserved"),
               "clones": []}
        for c in clones:
            served = st.get("clones", {}).get(c["name"], {})
            out["clones"].append({
                "name": c["name"], "host": c["host"], "ip": c["ip"],
                "running_s": c["running_s"], "first_query_s": c["first_query_s"],
                "caught_up_s": caught[c["ip"]],
                "memory_bytes_first_query": c["pages_at_first_query"].get("bytes_sent"),
                "pages_requested_first_query": c["pages_at_first_query"].get("pages_requested"),
                "memory_bytes_total": served.get("bytes_sent"),
                "pages_requested": served.get("pages_requested"),
                "fault_latency_p50_us": served.get("latency_p50_us"),
                "fault_latency_p99_us": served.get("latency_p99_us"),
                "push_elapsed_ms": served.get("elapsed_ms")})
        time.sleep(settle)
        out["dip"] = tps_dip(load, t_fork)
        say(f"N={n}: pause {out['parent_pause_ms']:.0f} ms; first query "
            f"{[c['first_query_s'] for c in out['clones']]} s; caught up "
            f"{[c['caught_up_s'] for c in out['clones']]} s; TPS {out['dip']['tps_before']:.1f}"
            f" -> {out['dip']['tps_after']:.1f}")
        return out
    finally:
        fork.stop_clones(clones)
        fork.release(PARENT)


def guest_root(name, host, script, timeout=600):
    r = guest_agent.run(vm.vm_files(host, name)["qga"], ["/bin/sh", "-c", script], timeout)
    if r["exitcode"] != 0:
        raise SystemExit(f"{name}: `{script}` failed: {r['err'] or r['out']}")
    return r["out"]


def ordinary_phase(load, settle):
    """A replica the ordinary way: a fresh VM, then pg_basebackup."""
    time.sleep(settle)
    vm.stop(BASE_VM, "backup")
    t0 = time.time()
    vm.start(BASE_VM, "backup", ip=BASE_IP, fresh=True, wait_timeout=600)
    booted = round(time.time() - t0, 3)
    data = "/var/lib/postgresql/15/main"
    pw = cluster_file.DB_PASSWORD
    guest_root(BASE_VM, "backup",
               f"pg_ctlcluster 15 main stop -m fast && rm -rf {data} && "
               f"su postgres -c 'PGPASSWORD={pw} pg_basebackup -h {PARENT_IP} "
               f"-U {cluster_file.DB_USER} -D {data} -X stream -R -c fast' && "
               f"pg_ctlcluster 15 main start")
    restored = round(time.time() - t0, 3)
    fork.first_query(BASE_IP, connect_via=netns.client_call)
    first_query = round(time.time() - t0, 3)
    caught = wait_caught_up([BASE_IP], t0)[BASE_IP]
    backup_bytes = int(guest_root(BASE_VM, "backup", f"du -sb {data} | cut -f1").strip())
    image_bytes = int(subprocess.run(["du", "-sb", str(paths.vm_disk(BASE_VM))],
                                     capture_output=True, text=True).stdout.split()[0])
    time.sleep(settle)
    out = {"t_start": t0, "boot_s": booted, "basebackup_done_s": restored,
           "first_query_s": first_query, "caught_up_s": caught,
           "base_backup_bytes": backup_bytes, "image_copy_bytes": image_bytes,
           "dip": tps_dip(load, t0)}
    vm.stop(BASE_VM, "backup")
    paths.vm_disk(BASE_VM).unlink(missing_ok=True)
    say(f"ordinary: booted {booted} s, first query {first_query} s, caught up {caught} s")
    return out


def run(args, out_dir):
    netns.up()
    from ..lab import witness
    witness.start(members=1)
    for host in netns.VM_HOSTS:
        vm.ensure_daemon(host)
    vm.stop(PARENT, "primary")
    vm.start(PARENT, "primary", ip=PARENT_IP, mem_mb=MEM_MB, fresh=True, wait_timeout=600)
    accel = json.loads(vm.vm_files("primary", PARENT)["meta"].read_text())["accel"]
    counts = [int(x) for x in args.counts.split(",")]
    load = Load(args.clients)
    phases, ordinary = [], None
    try:
        for n in counts:
            phases.append(fork_phase(load, n, args.settle))
        ordinary = ordinary_phase(load, args.settle)
    finally:
        load.stop()
        vm.stop(PARENT, "primary")
    if not load.samples or sum(t for _, t in load.samples) == 0:
        raise SystemExit("the parent's load never ran: no verdict")
    disk_size = 2 << 30
    result = {**result_head("fork", accel),
              "vm": {"mem_bytes": MEM_MB << 20, "disk_bytes": disk_size},
              "pgbench_clients": args.clients, "phases": phases, "ordinary": ordinary,
              "tps": load.samples, "flurrydb_seconds_per_replica": [5.5, 7.4]}
    stem = args.out or str(out_dir / "fork")
    workload.save_json(stem + ".json", result)
    plot(result, stem + ".png")
    say(f"wrote {stem}.json and {stem}.png")
    return result


def plot(result, path):
    plt = pyplot()
    t0 = result["tps"][0][0]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(14, 4.5),
                                   gridspec_kw={"width_ratios": [2.2, 1]})
    ax1.plot([t - t0 for t, _ in result["tps"]], [v for _, v in result["tps"]],
             color="#1f77b4", lw=0.8, label="parent pgbench TPS (1 s)")
    for p in result["phases"]:
        x = p["t_fork"] - t0
        ax1.axvline(x, color="#d62728", lw=0.8)
        ax1.text(x, ax1.get_ylim()[1] * 0.95, f" fork N={p['n']}", color="#d62728", fontsize=8)
    o = result.get("ordinary")
    if o:
        ax1.axvline(o["t_start"] - t0, color="#2ca02c", lw=0.8)
        ax1.text(o["t_start"] - t0, ax1.get_ylim()[1] * 0.85, " basebackup VM",
                 color="#2ca02c", fontsize=8)
    ax1.set_xlabel("seconds")
    ax1.set_ylabel("TPS")
    ax1.legend(fontsize=8, loc="lower right")
    labels, first, caught = [], [], []
    for p in result["phases"]:
        for c in p["clones"]:
            labels.append(f"N={p['n']} {c['name'][-2:]}")
            first.append(c["first_query_s"])
            caught.append(c["caught_up_s"])
    if o:
        labels.append("basebackup")
        first.append(o["first_query_s"])
        caught.append(o["caught_up_s"])
    xs = range(len(labels))
    ax2.bar([x - 0.2 for x in xs], first, 0.4, label="first read query", color="#1f77b4")
    ax2.bar([x + 0.2 for x in xs], caught, 0.4, label="caught up (lag < 1 s)", color="#ff7f0e")
    ax2.axhspan(5.5, 7.4, color="#999999", alpha=0.3, label="FlurryDB 5.5-7.4 s")
    ax2.set_xticks(list(xs))
    ax2.set_xticklabels(labels, rotation=60, fontsize=7)
    ax2.set_ylabel("seconds from the fork")
    ax2.legend(fontsize=7)
    fig.suptitle("VM fork into read replicas under pgbench on the parent (TCG guests, 1 GiB)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
