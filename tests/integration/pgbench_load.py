"""A pgbench load that runs until the test says stop, for checks that need
a database written to across an event (a fork) and no longer: a fixed
`pgbench -T` has to be sized for the slowest run of the event and then
outlives it by a minute, and a pgbench stopped early loses its summary.
So the load is back-to-back short pgbench runs, each one's exit code and
numbers kept, until stop. Two streams, half a run apart, share the
clients: one stream's gap between runs (a new pgbench connecting) falls
in the middle of the other's run, so the database is never left idle."""
import threading
import time

from remusdb.lab import workload


class PgbenchLoad:
    """Starts at once in its own threads; finish() stops it after the runs
    in progress and returns their totals in workload.pgbench's terms."""

    def __init__(self, ip, clients=4, run_s=4, progress=1, streams=2):
        assert clients >= streams
        self.ip, self.run_s, self.progress, self.clients = ip, run_s, progress, clients
        self.runs = []  # list.append is atomic
        self.stop = threading.Event()
        shares = [clients // streams + (i < clients % streams) for i in range(streams)]
        self.threads = [threading.Thread(target=self.work, args=(n, i * run_s / streams),
                                         daemon=True) for i, n in enumerate(shares)]
        for t in self.threads:
            t.start()

    def work(self, clients, delay):
        if self.stop.wait(delay):
            return
        while not self.stop.is_set():
            started = time.monotonic()
            r = workload.pgbench(self.ip, seconds=self.run_s, clients=clients,
                                 threads=min(2, clients), progress=self.progress)
            r["started_mono"], r["ended_mono"] = started, time.monotonic()
            self.runs.append(r)
            if r["exit_code"] != 0:
                return  # reported by finish(): the load is not to go on silently

    def wait_connected(self, timeout=60):
        """Returns once the database has every client of the load connected
        at once (so every stream runs), as its pg_stat_activity says; an
        AssertionError if a run failed first or after timeout s."""
        deadline = time.monotonic() + timeout
        sql = "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pgbench'"
        while int(workload.psql(self.ip, sql)) < self.clients:
            failed = [r for r in self.runs if r["exit_code"] != 0]
            assert not failed, failed[0]["output"][-2000:]
            assert time.monotonic() < deadline, \
                f"the {self.clients} pgbench clients were not all connected within {timeout} s"
            time.sleep(0.1)

    def longest_idle(self):
        """The longest time (s) between the load's start and end in which no
        pgbench run was under way."""
        spans = sorted((r["started_mono"], r["ended_mono"]) for r in self.runs)
        idle, covered = 0.0, spans[0][1] if spans else 0.0
        for start, end in spans[1:]:
            idle = max(idle, start - covered)
            covered = max(covered, end)
        return round(idle, 3)

    def finish(self):
        """Totals of every run: exit_code is the first failing run's (else
        0); transactions is None if any run's count is missing; started and
        ended (monotonic) bound the whole load."""
        self.stop.set()
        for t in self.threads:
            t.join()
        runs = sorted(self.runs, key=lambda r: r["started_mono"])
        failed = [r for r in runs if r["exit_code"] != 0]
        counts = [r["transactions"] for r in runs]
        return {
            "exit_code": failed[0]["exit_code"] if failed else 0,
            "output": (failed or runs)[-1]["output"] if runs else "",
            "runs": len(runs),
            "transactions": (sum(counts) if counts and None not in counts else None),
            "run_transactions": counts,
            "progress_tps": [t for r in runs for t in r["progress_tps"]],
            "started": runs[0]["started_mono"] if runs else None,
            "ended": max(r["ended_mono"] for r in runs) if runs else None,
            "longest_idle_s": self.longest_idle(),
        }
