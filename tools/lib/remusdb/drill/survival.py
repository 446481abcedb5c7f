"""Which client connections lived through a failover, judged from the
server's side and from what the clients committed.

A connection survives a Remus failover when the backup resumes the very
PostgreSQL backend the client was talking to, and the client goes on
using it.  So the drill asks the database twice, through pg_stat_activity:

- just before the failure (on the primary), which backends serve the load:
  pid, backend_start and client_port name a backend uniquely;
- after the takeover (on the resumed VM), which of those are still there
  with the same three values, and whether each ran a statement since
  (its query_start changed).

A backend that is there but idle is not enough: a client can hang on it.
pgbench's per-transaction log (-l) says, per client, when each
transaction completed (client-side clock); a pgbench client committed
after the takeover when a transaction of its completed after the backup
resumed the VM.  pgbench never reconnects a client, so each client that
committed after the takeover did so on its original backend, and each
original backend belongs to one client.  Hence

    pgbench_survived = min(#pgbench backends kept and active,
                           #pgbench clients that committed after the takeover)

A hung client lowers the second count, a vanished backend the first; both
count as not survived.  The ledger's connections are counted the same
way: ledger.py's worker w acknowledges only ids with id % N == w, so the
acknowledged ids say which workers committed after the takeover, and a
worker that reconnected (it printed an error) does not count, since its
commits after the takeover ran on a new backend:

    ledger_survived = min(#ledger backends kept and active,
                          #ledger workers without an error that acknowledged
                           a commit after the takeover)

Everything here but snapshot() is a pure function.
"""
import json
import re

PGBENCH_APP = "remusdb-pgbench"
LEDGER_APP = "remusdb-ledger"   # ledger.py sets it as its application_name
LEDGER_WORKER_ERROR_RE = re.compile(r"^ledger: worker (\d+): ")

SNAPSHOT_SQL = (
    "SELECT coalesce(json_agg(row_to_json(a)), '[]') FROM ("
    "SELECT pid, backend_start, client_addr::text AS client_addr, client_port, "
    "application_name, query_start, state_change, state, xact_start, "
    "now() AS taken_at FROM pg_stat_activity "
    "WHERE backend_type = 'client backend' AND pid <> pg_backend_pid() "
    f"AND application_name IN ('{PGBENCH_APP}', '{LEDGER_APP}') ORDER BY pid) a")


def parse_snapshot(text):
    """psql's output of SNAPSHOT_SQL -> list of backend dicts."""
    rows = json.loads(text.strip() or "[]")
    if not isinstance(rows, list):
        raise ValueError("pg_stat_activity snapshot is not a JSON list")
    return rows


def backend_key(b):
    """What names one backend for good: a new backend after a reconnect
    differs in all three."""
    return (b.get("pid"), b.get("backend_start"), b.get("client_port"))


def kept_backends(before, after, app):
    """The `app` backends of `before` that `after` still lists with the same
    identity: [(before row, after row)]."""
    by_key = {backend_key(b): b for b in after or []}
    return [(b, by_key[backend_key(b)]) for b in before
            if b.get("application_name") == app and backend_key(b) in by_key]


def ran_since(pair):
    """The backend started a statement after the first snapshot."""
    b, a = pair
    return a.get("query_start") is not None and a.get("query_start") != b.get("query_start")


# pgbench -l lines: client_id transaction_no time script_no time_epoch time_us
# [schedule_lag] [retries]; `time` is "failed" or "skipped" for a
# transaction that did not commit.
PGBENCH_LOG_RE = re.compile(r"^(\d+) (\d+) (\S+) (\d+) (\d+) (\d+)\b")


def parse_pgbench_log(lines):
    """{client id: [unix times at which its transactions committed]}."""
    out = {}
    for line in lines:
        m = PGBENCH_LOG_RE.match(line)
        if not m or not m.group(3).isdigit():
            continue
        out.setdefault(int(m.group(1)), []).append(int(m.group(5)) + int(m.group(6)) / 1e6)
    return out


def clients_committed_after(commits, t):
    """Sorted pgbench client ids with a commit later than unix time t."""
    return sorted(c for c, times in commits.items() if any(x > t for x in times))


def ledger_workers_with_errors(lines, since=None):
    """Ledger workers that lost their connection at or after unix time
    `since` (ledger.py prints one line per error, naming the worker),
    from (time, line) pairs.  An earlier error is no matter: the worker's
    new backend is the one the snapshot before the failure saw."""
    return sorted({int(m.group(1)) for seen, line in lines
                   if since is None or seen >= since
                   for m in [LEDGER_WORKER_ERROR_RE.match(line)] if m})


def survival(before, after, commits, ledger_acks, takeover_at, ledger_connections=1,
             ledger_error_workers=()):
    """The connection survival counts (see the module's comment).
    before/after: snapshots (after None: the resumed database never
    answered); commits: parse_pgbench_log(); ledger_acks: (unix time, id)
    of the ledger's acknowledged commits; takeover_at: unix time the
    backup resumed the VM (None: no takeover, nothing survived);
    ledger_error_workers: ledger_workers_with_errors()."""
    pgbench_before = [b for b in before if b.get("application_name") == PGBENCH_APP]
    ledger_before = [b for b in before if b.get("application_name") == LEDGER_APP]
    if takeover_at is None or after is None:
        kept_pg, kept_ledger, committed = [], [], []
    else:
        kept_pg = kept_backends(before, after, PGBENCH_APP)
        kept_ledger = kept_backends(before, after, LEDGER_APP)
        committed = clients_committed_after(commits, takeover_at)
    active_pg = [p for p in kept_pg if ran_since(p)]
    active_ledger = [p for p in kept_ledger if ran_since(p)]
    workers_after = [] if takeover_at is None else sorted(
        {i % ledger_connections for t, i in ledger_acks if t > takeover_at}
        - set(ledger_error_workers))
    return {
        "pgbench_before": len(pgbench_before),
        "pgbench_backends_kept": len(kept_pg),
        "pgbench_backends_active_after": len(active_pg),
        "pgbench_clients_committed_after_takeover": committed,
        "pgbench_survived": min(len(active_pg), len(committed)),
        "ledger_before": len(ledger_before),
        "ledger_backends_kept": len(kept_ledger),
        "ledger_backends_active_after": len(active_ledger),
        "ledger_workers_acked_after_takeover": workers_after,
        "ledger_survived": min(len(active_ledger), len(workers_after)),
    }
