"""The commit ledger: inserts numbered rows, one transaction each, and
appends an id to --out only after PostgreSQL acknowledged its COMMIT.
Afterwards every id in --out must exist in the database; one that does not
is a lost acknowledged commit.  Errors (connection lost, server restarting)
are counted, and the client reconnects and goes on.

--connections N runs N workers, each on its own connection; worker w
writes only ids with id % N == w, so an id says which connection
acknowledged it.  --think-ms T makes each worker wait a random 0..T ms
before each commit.  Why: one closed-loop client sends its next commit
right after the previous acknowledgement arrives, which under output
commit is right after an epoch was acknowledged, so its replies are
always produced early in an epoch and a bug that releases output a little
early (--unsafe-release-early) never shows on it.  Random think time
over one checkpoint interval spreads the commits across the epoch, and
several connections make it likely that some reply falls into every
window a release bug would expose.

SIGUSR1 ends the run early, as --seconds would have: each worker finishes
the commit it is in (so its id is written or not, as at the end) and the
summary is printed; a caller that has seen enough acknowledgements need
not wait out the planned length."""
import argparse
import os
import random
import signal
import sys
import threading
import time

import psycopg2

APPLICATION_NAME = "remusdb-ledger"  # the drill tells its backends from pgbench's by this


def connect(host):
    return psycopg2.connect(host=host, user="bench", dbname="bench",
                            password=os.environ.get("PGPASSWORD", "bench"),
                            connect_timeout=5, keepalives=1, keepalives_idle=5,
                            application_name=APPLICATION_NAME)


class Ledger:
    def __init__(self, args, out):
        self.args, self.out = args, out
        self.lock = threading.Lock()
        self.acked = self.errors = self.reconnects = 0
        self.deadline = time.monotonic() + args.seconds
        self.first_round = None  # the first id round above every row already there

    def say(self, msg):
        with self.lock:
            print(f"ledger: {msg}", file=sys.stderr, flush=True)

    def end_now(self):
        """The workers stop before their next commit (SIGUSR1)."""
        self.deadline = time.monotonic()

    def prepare(self):
        """The table and the first id round, once, before the workers start:
        concurrent CREATE TABLE IF NOT EXISTS can fail in PostgreSQL."""
        while self.first_round is None and time.monotonic() < self.deadline:
            try:
                conn = connect(self.args.host)
                conn.autocommit = True
                with conn.cursor() as cur:
                    cur.execute("CREATE TABLE IF NOT EXISTS ledger "
                                "(id bigint PRIMARY KEY, at timestamptz DEFAULT now())")
                    cur.execute("SELECT coalesce(max(id), 0) FROM ledger")
                    self.first_round = cur.fetchone()[0] // self.args.connections + 1
                conn.close()
            except psycopg2.Error as e:
                self.say(f"setup: {type(e).__name__}: {str(e).strip()}")
                with self.lock:
                    self.errors += 1
                time.sleep(0.2)
        return self.first_round is not None

    def open(self):
        conn = connect(self.args.host)
        conn.autocommit = True
        return conn

    def work(self, worker):
        n = self.args.connections
        conn, k = None, self.first_round
        while time.monotonic() < self.deadline:
            try:
                if conn is None:
                    conn = self.open()
                if self.args.think_ms:
                    time.sleep(random.uniform(0, self.args.think_ms) / 1000)
                row = k * n + worker
                with conn.cursor() as cur:
                    cur.execute("INSERT INTO ledger (id) VALUES (%s)", (row,))
                # autocommit: execute() returned, so the COMMIT was acknowledged
                with self.lock:
                    self.out.write(f"{row}\n")
                    self.acked += 1
                k += 1
            except psycopg2.Error as e:
                self.say(f"worker {worker}: {type(e).__name__}: {str(e).strip()}")
                try:
                    if conn is not None:
                        conn.close()
                except psycopg2.Error:
                    pass
                conn = None
                with self.lock:
                    self.errors += 1
                    self.reconnects += 1
                # an id whose INSERT failed may or may not have committed;
                # skip it so that a later row cannot be mistaken for it
                k += 1
                time.sleep(0.2)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--host", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--seconds", type=float, required=True)
    p.add_argument("--connections", type=int, default=1)
    p.add_argument("--think-ms", type=float, default=0.0)
    args = p.parse_args()
    if args.connections < 1 or args.think_ms < 0:
        p.error("--connections must be at least 1 and --think-ms not negative")
    with open(args.out, "a", buffering=1) as out:
        ledger = Ledger(args, out)
        signal.signal(signal.SIGUSR1, lambda *_: ledger.end_now())
        workers = [] if not ledger.prepare() else [threading.Thread(target=ledger.work, args=(w,), daemon=True)
                   for w in range(args.connections)]
        for t in workers:
            t.start()
        for t in workers:
            t.join()
    print(f"ledger: acked={ledger.acked} errors={ledger.errors} "
          f"reconnects={ledger.reconnects}", flush=True)


if __name__ == "__main__":
    main()
