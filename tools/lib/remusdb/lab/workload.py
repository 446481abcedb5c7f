"""Database workloads run from the lab's client host (rdb-client)."""
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path


CLIENT_NS = "rdb-client"
DB_USER = DB_PASSWORD = DB_NAME = "bench"
# Debian installs pg_amcheck without a /usr/bin wrapper.
PG_AMCHECK = "/usr/lib/postgresql/15/bin/pg_amcheck"
PG_ENV = dict(os.environ, PGPASSWORD=DB_PASSWORD, PGCONNECT_TIMEOUT="10")


def pgbench(ip, seconds=30, clients=4, threads=2, progress=5, extra=(), transactions=None):
    """Runs pgbench in rdb-client against the guest, for `seconds` or, when
    given, for `transactions` per client; returns its numbers."""
    length = ["-t", str(transactions)] if transactions else ["-T", str(seconds)]
    cmd = ["ip", "netns", "exec", CLIENT_NS, "pgbench", "-h", ip, "-U", DB_USER,
           "-c", str(clients), "-j", str(threads), *length,
           "-P", str(progress), *extra, DB_NAME]
    started = time.time()
    r = subprocess.run(cmd, env=PG_ENV, capture_output=True, text=True)
    out = r.stdout + r.stderr
    result = {"exit_code": r.returncode, "seconds": seconds, "clients": clients,
              "started": started, "output": out}
    patterns = {
        "tps": r"tps = ([\d.]+) \(without initial connection time\)",
        "latency_ms": r"latency average = ([\d.]+) ms",
        "transactions": r"number of transactions actually processed: (\d+)",
        "failed": r"number of failed transactions: (\d+)",
    }
    for key, pattern in patterns.items():
        m = re.search(pattern, out)
        result[key] = float(m.group(1)) if m else None
    result["progress_tps"] = [float(x) for x in re.findall(r"progress: [\d.]+ s, ([\d.]+) tps", out)]
    return result


def psql(ip, sql, check=True, port=5432):
    r = subprocess.run(["ip", "netns", "exec", CLIENT_NS, "psql", "-h", ip, "-p", str(port),
                        "-U", DB_USER,
                        "-d", DB_NAME, "-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-c", sql],
                       env=PG_ENV, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"psql failed: {r.stderr.strip()}")
    return r.stdout.strip()


def amcheck(ip):
    """pg_amcheck over every relation of the bench database (heap + btree)."""
    r = subprocess.run(["ip", "netns", "exec", CLIENT_NS, PG_AMCHECK, "-h", ip,
                        "-U", DB_USER, "--heapallindexed", DB_NAME],
                       env=PG_ENV, capture_output=True, text=True)
    return r.returncode, (r.stdout + r.stderr).strip()


LEDGER_SCRIPT = Path(__file__).resolve().parent / "ledger.py"


def start_ledger(ip, out_file, seconds, connections=1, think_ms=0):
    """Starts the commit ledger in rdb-client; it records every commit
    acknowledged to it, one id per line, in out_file (ledger.py explains
    connections and think_ms)."""
    cmd = ["ip", "netns", "exec", CLIENT_NS, sys.executable, str(LEDGER_SCRIPT),
           "--host", ip, "--out", str(out_file), "--seconds", str(seconds),
           "--connections", str(connections), "--think-ms", str(think_ms)]
    return subprocess.Popen(cmd, env=PG_ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def ledger_acked_ids(out_file):
    """The ids whose COMMIT the ledger saw acknowledged, in order."""
    acked = [int(x) for x in Path(out_file).read_text().split()] if Path(out_file).exists() else []
    return acked


def missing_acked(ip, acked):
    """Acknowledged ledger ids that the database does not have."""
    if not acked:
        return []
    present = set(int(x) for x in psql(ip, "SELECT id FROM ledger").split())
    return sorted(set(acked) - present)


def save_json(path, data):
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(data, indent=2) + "\n")
