"""The commit ledger: inserts numbered rows, one transaction each, and
appends an id to --out only after PostgreSQL acknowledged its COMMIT.
Afterwards every id in --out must exist in the database; one that does not
is a lost acknowledged commit.  Errors (connection lost, server restarting)
are counted, and the client reconnects and goes on."""
import argparse
import os
import sys
import time

import psycopg2


def connect(host):
    return psycopg2.connect(host=host, user="bench", dbname="bench",
                            password=os.environ.get("PGPASSWORD", "bench"),
                            connect_timeout=5, keepalives=1, keepalives_idle=5,
                            # the drill tells its backend from pgbench's by this
                            application_name="remusdb-ledger")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--host", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--seconds", type=float, required=True)
    args = p.parse_args()
    deadline = time.monotonic() + args.seconds
    conn = None
    next_id, acked, errors, reconnects = 1, 0, 0, 0
    with open(args.out, "a", buffering=1) as out:
        while time.monotonic() < deadline:
            try:
                if conn is None:
                    conn = connect(args.host)
                    conn.autocommit = True
                    with conn.cursor() as cur:
                        cur.execute("CREATE TABLE IF NOT EXISTS ledger "
                                    "(id bigint PRIMARY KEY, at timestamptz DEFAULT now())")
                        cur.execute("SELECT coalesce(max(id), 0) + 1 FROM ledger")
                        next_id = max(next_id, cur.fetchone()[0])
                with conn.cursor() as cur:
                    cur.execute("INSERT INTO ledger (id) VALUES (%s)", (next_id,))
                # autocommit: execute() returned, so the COMMIT was acknowledged
                out.write(f"{next_id}\n")
                acked += 1
                next_id += 1
            except psycopg2.Error as e:
                errors += 1
                print(f"ledger: {type(e).__name__}: {str(e).strip()}", file=sys.stderr, flush=True)
                try:
                    if conn is not None:
                        conn.close()
                except psycopg2.Error:
                    pass
                conn = None
                reconnects += 1
                # an id whose INSERT failed may or may not have committed;
                # skip it so that a later row cannot be mistaken for it
                next_id += 1
                time.sleep(0.2)
    print(f"ledger: acked={acked} errors={errors} reconnects={reconnects}", flush=True)


if __name__ == "__main__":
    main()
