"""Explicit multi-statement transactions for the commit-protection drills
(issue 10, RemusDB's Lemma 3.5.2), against PostgreSQL or MariaDB.

Each of --connections workers runs, on its own connection:
    BEGIN; INSERT (tx, 1); ... INSERT (tx, --steps); COMMIT
with a random think time of 0..--think-ms before each statement, so that
a failover finds transactions at every point: some with results seen
and no COMMIT sent, some with a COMMIT sent and not acknowledged, some
acknowledged. Under commit protection only the COMMIT's acknowledgement
waits for a checkpoint; the INSERTs' results leave at once, speculatively.

Every event goes to --out as one JSON line, written and flushed when the
client has seen it: begin, step (the statement's result arrived), sent
(COMMIT went out), ack (COMMIT acknowledged), error (with the phase it
broke in). A worker that loses its connection reconnects and goes on
with a new transaction id; worker w uses ids with id % N == w.

Afterwards `judge` compares the log with the rows the database holds:
- every acknowledged transaction has all its rows (Lemma 3.5.1: nothing
  acknowledged is lost);
- a transaction that broke before its COMMIT was sent has no row (Lemma
  3.5.2: results seen speculatively never end up silently committed);
- no transaction has some of its rows and not others (atomicity);
- a COMMIT sent and not acknowledged is in doubt: either way is right.
"""
import argparse
import json
import os
import random
import sys
import threading
import time

TABLE = "cp_spec"


def connect(dbms, host):
    if dbms == "postgres":
        import psycopg2
        conn = psycopg2.connect(host=host, user="bench", dbname="bench",
                                password=os.environ.get("PGPASSWORD", "bench"),
                                connect_timeout=5, keepalives=1, keepalives_idle=5,
                                application_name="remusdb-txclient")
        conn.autocommit = False
        return conn
    import pymysql
    return pymysql.connect(host=host, user="bench", password="bench", database="bench",
                           connect_timeout=5, read_timeout=60, write_timeout=60,
                           autocommit=False)


def db_errors(dbms):
    if dbms == "postgres":
        import psycopg2
        return (psycopg2.Error, OSError)
    import pymysql
    return (pymysql.Error, OSError)


def create_table(dbms, conn):
    with conn.cursor() as cur:
        engine = "" if dbms == "postgres" else " ENGINE=InnoDB"
        cur.execute(f"CREATE TABLE IF NOT EXISTS {TABLE} (tx bigint NOT NULL, "
                    f"step int NOT NULL, PRIMARY KEY (tx, step)){engine}")
        cur.execute(f"SELECT coalesce(max(tx), 0) FROM {TABLE}")
        top = cur.fetchone()[0]
    conn.commit()
    return int(top)


class Client:
    def __init__(self, args):
        self.args = args
        self.out = open(args.out, "a", buffering=1)
        self.lock = threading.Lock()
        self.deadline = time.monotonic() + args.seconds
        self.errors = db_errors(args.dbms)

    def log(self, **event):
        event["t"] = time.time()
        with self.lock:
            self.out.write(json.dumps(event) + "\n")
            self.out.flush()

    def think(self):
        if self.args.think_ms:
            time.sleep(random.uniform(0, self.args.think_ms) / 1000.0)

    def transaction(self, conn, tx, worker):
        phase = "begin"
        try:
            self.log(ev="begin", tx=tx, w=worker)
            with conn.cursor() as cur:
                for step in range(1, self.args.steps + 1):
                    self.think()
                    phase = f"step {step}"
                    cur.execute(f"INSERT INTO {TABLE} (tx, step) VALUES (%s, %s)", (tx, step))
                    self.log(ev="step", tx=tx, step=step)
            self.think()
            phase = "commit"
            self.log(ev="sent", tx=tx)
            conn.commit()
            self.log(ev="ack", tx=tx)
            return True
        except self.errors as e:
            self.log(ev="error", tx=tx, w=worker, phase=phase,
                     error=f"{type(e).__name__}: {str(e).strip()[:200]}")
            return False

    def work(self, worker, first_round):
        n, k, conn = self.args.connections, first_round, None
        while time.monotonic() < self.deadline:
            if conn is None:
                try:
                    conn = connect(self.args.dbms, self.args.host)
                except self.errors as e:
                    self.log(ev="connect_error", w=worker, error=f"{type(e).__name__}")
                    time.sleep(0.2)
                    continue
            tx = k * n + worker
            k += 1
            if not self.transaction(conn, tx, worker):
                try:
                    conn.close()
                except Exception:
                    pass
                conn = None
        if conn is not None:
            conn.close()

    def run(self):
        while True:
            try:
                conn = connect(self.args.dbms, self.args.host)
                top = create_table(self.args.dbms, conn)
                conn.close()
                break
            except self.errors as e:
                if time.monotonic() > self.deadline:
                    sys.exit(f"txclient: cannot set up: {e}")
                time.sleep(0.5)
        first_round = top // self.args.connections + 1
        threads = [threading.Thread(target=self.work, args=(w, first_round))
                   for w in range(self.args.connections)]
        for t in threads:
            t.start()
        print("txclient: running", flush=True)
        for t in threads:
            t.join()


def read_events(path):
    events = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                events.append(json.loads(line))
    return events


def judge(events, rows, steps, failure_at):
    """rows: {tx: set of steps present}. Returns the verdict's numbers and
    the list of what is wrong (empty: both lemmas hold)."""
    txs = {}
    for e in events:
        if "tx" in e:
            txs.setdefault(e["tx"], {})[e["ev"]] = e
    wrong = []
    acked = [t for t, ev in txs.items() if "ack" in ev]
    lost = sorted(t for t in acked if rows.get(t, set()) != set(range(1, steps + 1)))
    for t in lost:
        wrong.append(f"tx {t}: COMMIT acknowledged, rows present {sorted(rows.get(t, ()))}")
    broken = {t: ev for t, ev in txs.items() if "error" in ev}
    before_commit = {t for t, ev in broken.items() if "sent" not in ev}
    in_doubt = {t for t, ev in broken.items() if "sent" in ev}
    speculative = {t for t in before_commit if "step" in txs[t]}
    for t in sorted(before_commit):
        if rows.get(t):
            wrong.append(f"tx {t}: broke in {broken[t]['error']['phase']} before its COMMIT "
                         f"was sent, yet rows {sorted(rows[t])} are committed")
    partial = sorted(t for t, s in rows.items() if s and s != set(range(1, steps + 1)))
    for t in partial:
        wrong.append(f"tx {t}: only rows {sorted(rows[t])} of {steps}")
    unknown = sorted(set(rows) - set(txs))
    for t in unknown:
        wrong.append(f"tx {t}: rows present for a transaction the client never began")
    error_times = sorted(ev["error"]["t"] for ev in broken.values())
    after = [t for t in error_times if failure_at and t >= failure_at]
    # Per connection (worker): did the failover break it, or did it go on?
    workers = {e["w"] for e in events if "w" in e}
    broken_workers = {ev["error"]["w"] for ev in broken.values()
                      if failure_at and ev["error"]["t"] >= failure_at}
    continued = {txs[t]["begin"]["w"] for t in acked
                 if failure_at and txs[t]["begin"]["t"] < failure_at < txs[t]["ack"]["t"]}
    return {
        "transactions": len(txs),
        "acknowledged": len(acked),
        "acknowledged_after_failure": sum(1 for t in acked
                                          if failure_at and txs[t]["ack"]["t"] > failure_at),
        "lost_acknowledged": len(lost),
        "broken": len(broken),
        "broken_before_commit": len(before_commit),
        "broken_with_results_seen": len(speculative),
        "committed_despite_break": sum(1 for t in before_commit if rows.get(t)),
        "in_doubt": len(in_doubt),
        "in_doubt_committed": sum(1 for t in in_doubt if rows.get(t)),
        "partial": len(partial),
        "connections": len(workers),
        "connections_broken": len(broken_workers),
        "connections_through": len(continued - broken_workers),
        "first_error_after_failure_s": round(after[0] - failure_at, 3) if after else None,
        "last_error_after_failure_s": round(after[-1] - failure_at, 3) if after else None,
    }, wrong


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dbms", choices=("postgres", "mariadb"), default="postgres")
    ap.add_argument("--host", required=True)
    ap.add_argument("--connections", type=int, default=4)
    ap.add_argument("--seconds", type=float, required=True)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--think-ms", type=float, default=0)
    ap.add_argument("--out", required=True)
    Client(ap.parse_args()).run()


if __name__ == "__main__":
    main()
