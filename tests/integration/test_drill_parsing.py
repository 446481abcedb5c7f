"""The drill's pure functions: how its figures are computed from what the
clients printed and what pg_stat_activity said. No VM, no lab."""
from remusdb.drill import failover, report
from remusdb.drill.inject import cut_ruleset
from remusdb.drill.survival import (LEDGER_APP, PGBENCH_APP, clients_committed_after,
                                    ledger_workers_with_errors,
                                    kept_backends, parse_pgbench_log, survival)


# ---------------------------------------------------------------- outage()

def test_outage_without_recovery_runs_to_the_end_of_the_load():
    """The negative control that once read "19 ms downtime, 0 TPS after":
    a few acks right after the failure are no recovery."""
    acks = [10.0, 10.5, 11.0, 11.019]
    start, end, recovered = failover.outage(acks, failure_at=11.0, load_end=60.0, resumed_at=13.0)
    assert not recovered
    assert (start, end) == (11.019, 60.0)


def test_outage_without_takeover_and_without_acks_after_the_failure():
    start, end, recovered = failover.outage([1.0, 2.0], failure_at=5.0, load_end=40.0)
    assert (start, end, recovered) == (2.0, 40.0, False)


def test_outage_without_any_ack_starts_at_the_failure():
    assert failover.outage([], failure_at=5.0, load_end=40.0, resumed_at=7.0) == (5.0, 40.0, False)


def test_outage_with_recovery_is_the_longest_gap_across_the_takeover():
    acks = [9.0, 9.9, 10.05, 12.4, 12.5, 12.6, 30.0]  # 30.0: a later, unrelated gap
    start, end, recovered = failover.outage(acks, failure_at=10.0, load_end=40.0, resumed_at=12.3)
    assert recovered
    assert (start, end) == (10.05, 12.4)


def test_outage_of_an_ack_gap_spanning_the_failure():
    start, end, recovered = failover.outage([9.0, 9.8, 13.0, 13.1], failure_at=10.0,
                                         load_end=20.0, resumed_at=12.0)
    assert (start, end, recovered) == (9.8, 13.0, True)


def test_outage_acks_only_between_failure_and_takeover_are_no_recovery():
    start, end, recovered = failover.outage([9.0, 10.2, 11.5], failure_at=10.0,
                                         load_end=20.0, resumed_at=12.0)
    assert (start, end, recovered) == (11.5, 20.0, False)


# ---------------------------------------------------------------- pgbench output

def test_abort_lines_of_postgresql_14_and_15():
    lines = [(1.0, "pgbench: error: client 2 aborted in command 4 (SQL) of script 0; "
                   "perhaps the backend died while processing"),
             (2.0, "pgbench: error: client 0 script 0 aborted in command 6 query 0: "
                   "FATAL:  terminating connection due to administrator command"),
             (3.0, "pgbench: error: client 0 script 0 aborted in command 6 query 0: again"),
             (4.0, "progress: 1700000000.000 s, 12.0 tps, lat 80.1 ms stddev 3.0, 0 failed")]
    assert failover.aborted_clients(lines) == {2: 1.0, 0: 2.0}


def test_progress_lines():
    lines = [(0, "progress: 1700000001.004 s, 55.9 tps, lat 71.2 ms stddev 40.1, 0 failed"),
             (0, "starting vacuum...end.")]
    assert failover.parse_progress(lines) == [(1700000001.004, 55.9)]


def test_pgbench_log_counts_only_committed_transactions():
    lines = ["0 1 5012 0 1700000010 250000",
             "1 1 6001 0 1700000010 900000",
             "1 2 failed 0 1700000020 0",         # did not commit
             "2 1 skipped 0 1700000030 0 12",     # did not run
             "3 7 4000 0 1700000025 5 33 1",      # with lag and retries
             "garbage"]
    commits = parse_pgbench_log(lines)
    assert commits == {0: [1700000010.25], 1: [1700000010.9], 3: [1700000025.000005]}
    assert clients_committed_after(commits, 1700000010.5) == [1, 3]


# ---------------------------------------------------------------- survival

def backend(pid, port, app=PGBENCH_APP, query_start="q0", start="2026-01-01T00:00:00+00"):
    return {"pid": pid, "backend_start": start, "client_port": port,
            "application_name": app, "query_start": query_start}


BEFORE = [backend(101, 40001), backend(102, 40002), backend(103, 40003),
          backend(104, 40004), backend(200, 40100, app=LEDGER_APP)]
TAKEOVER = 1000.0


def test_every_connection_kept_active_and_committing_survives():
    after = [dict(b, query_start="q1") for b in BEFORE]
    commits = {c: [TAKEOVER + 1] for c in range(4)}
    s = survival(BEFORE, after, commits, [(TAKEOVER + 0.5, 7)], TAKEOVER)
    assert s["pgbench_before"] == 4 and s["pgbench_survived"] == 4
    assert s["ledger_before"] == 1 and s["ledger_survived"] == 1


def test_a_hung_client_does_not_survive():
    """Its backend is still there (and ran something after the snapshot,
    before the failure), but the client never committed after the takeover."""
    after = [dict(b, query_start="q1") for b in BEFORE]
    commits = {0: [TAKEOVER + 1], 1: [TAKEOVER + 1], 2: [TAKEOVER + 1], 3: [TAKEOVER - 5]}
    s = survival(BEFORE, after, commits, [(TAKEOVER + 0.5, 7)], TAKEOVER)
    assert s["pgbench_backends_active_after"] == 4
    assert s["pgbench_clients_committed_after_takeover"] == [0, 1, 2]
    assert s["pgbench_survived"] == 3


def test_a_vanished_backend_does_not_survive():
    """Same pid reused by a new backend: another port and start time."""
    after = [dict(b, query_start="q1") for b in BEFORE[1:]]
    after.append(backend(101, 40999, query_start="q1", start="2026-01-01T00:01:00+00"))
    commits = {c: [TAKEOVER + 1] for c in range(4)}
    s = survival(BEFORE, after, commits, [(TAKEOVER + 0.5, 7)], TAKEOVER)
    assert s["pgbench_backends_kept"] == 3
    assert s["pgbench_survived"] == 3


def test_an_idle_kept_backend_does_not_survive():
    after = [dict(b, query_start="q1") for b in BEFORE]
    after[0]["query_start"] = "q0"  # nothing since the snapshot before the failure
    commits = {c: [TAKEOVER + 1] for c in range(4)}
    assert survival(BEFORE, after, commits, [], TAKEOVER)["pgbench_survived"] == 3


def test_a_reconnected_ledger_does_not_survive():
    after = [dict(b, query_start="q1") for b in BEFORE[:4]]
    after.append(backend(201, 40101, app=LEDGER_APP, query_start="q1"))
    s = survival(BEFORE, after, {}, [(TAKEOVER + 3, 9)], TAKEOVER)
    assert s["ledger_backends_kept"] == 0 and s["ledger_survived"] == 0


LEDGER4_BEFORE = BEFORE[:4] + [backend(200 + w, 40100 + w, app=LEDGER_APP) for w in range(4)]


def test_ledger_workers_are_counted_like_pgbench_clients():
    """Four ledger connections: worker w acknowledges ids with id % 4 == w.
    Worker 1 reconnected (its ack after the takeover ran on a new backend),
    worker 3 hung (acknowledged nothing after the takeover): two survived."""
    after = [dict(b, query_start="q1") for b in LEDGER4_BEFORE if b["pid"] != 201]
    after.append(backend(299, 40199, app=LEDGER_APP, query_start="q1"))
    acks = [(TAKEOVER - 1, 43), (TAKEOVER + 1, 40), (TAKEOVER + 1, 41), (TAKEOVER + 2, 46)]
    errors = ledger_workers_with_errors([(TAKEOVER - 60, "ledger: worker 2: early, reconnected"),
                                         (TAKEOVER, "ledger: worker 1: OperationalError: gone"),
                                         (TAKEOVER + 9, "ledger: acked=4 errors=2 reconnects=2")],
                                        since=TAKEOVER - 1)
    assert errors == [1]
    s = survival(LEDGER4_BEFORE, after, {}, acks, TAKEOVER, ledger_connections=4,
                 ledger_error_workers=errors)
    assert s["ledger_before"] == 4 and s["ledger_backends_kept"] == 3
    assert s["ledger_workers_acked_after_takeover"] == [0, 2]
    assert s["ledger_survived"] == 2


def test_nothing_survives_without_a_takeover_or_an_answer():
    commits = {c: [TAKEOVER + 1] for c in range(4)}
    for after, takeover in ((BEFORE, None), (None, TAKEOVER)):
        s = survival(BEFORE, after, commits, [(TAKEOVER + 1, 3)], takeover)
        assert s["pgbench_survived"] == 0 and s["ledger_survived"] == 0
        assert s["pgbench_before"] == 4


def test_kept_backends_match_by_pid_start_and_port():
    after = [backend(101, 40001), backend(102, 40002, start="later")]
    assert [b["pid"] for b, _ in kept_backends(BEFORE, after, PGBENCH_APP)] == [101]


# ---------------------------------------------------------------- verdict, series

def result(**kw):
    r = {"acked_commits": 100, "lost_acked_commits": 0, "amcheck_clean": True,
         "guest_kernel_errors": [], "takeover": True, "load_collapsed": None,
         "failed_reason": None,
         "power_cut": {"lan_frames_from_primary_after_cut": 0, "frames_dropped": {}}}
    r.update(kw)
    return r


def test_verdict_requires_acknowledged_commits_and_a_silent_cut():
    opts = failover.DrillOptions(mode="power")
    assert failover.verdict(opts, result()) == (True, "PASS")
    passed, words = failover.verdict(opts, result(acked_commits=0))
    assert not passed and "no commit was acknowledged" in words
    passed, words = failover.verdict(opts, result(
        power_cut={"lan_frames_from_primary_after_cut": 3, "frames_dropped": {}}))
    assert not passed and "3 frames left the primary" in words
    passed, words = failover.verdict(opts, result(power_cut=None))
    assert not passed
    passed, words = failover.verdict(opts, result(load_collapsed="pgbench ended 30 s before"))
    assert not passed and "collapsed" in words


def test_verdict_requires_every_connection_to_survive():
    opts = failover.DrillOptions(mode="power")
    full = dict(connections_before=8, connections_survived=8, pgbench_before=4,
                pgbench_survived=4, ledger_before=4, ledger_survived=4)
    assert failover.verdict(opts, result(**full)) == (True, "PASS")
    passed, words = failover.verdict(opts, result(**dict(full, connections_survived=7,
                                                          ledger_survived=3)))
    assert not passed and "only 7 of 8 connections survived" in words
    assert "ledger 3 of 4" in words


def test_negative_control_fails_when_it_catches_lost_commits():
    opts = failover.DrillOptions(mode="power", release_early=True)
    assert opts.negative_control
    passed, words = failover.verdict(opts, result(lost_acked_commits=2))
    assert not passed and "2 acknowledged commits LOST" in words


def test_a_failed_drill_is_a_result_and_counts_in_the_series():
    opts = failover.DrillOptions()
    broken = failover.failed_result(opts, "/tmp/x", "pgbench ended early (exit 2)")
    assert not broken["passed"] and "pgbench ended early" in broken["verdict"]
    good = dict(result(), passed=True, mode="power", interval_ms=50, peer_timeout_ms=1000,
                detection_ms=1010, downtime_ms=2500.0, clients_recovered=True,
                pgbench_before=4, pgbench_survived=4, ledger_before=1, ledger_survived=1)
    s = report.series_summary([good, broken, dict(good, downtime_ms=3500.0)])
    assert (s["drills"], s["passed"], s["failed"], s["broke_off"]) == (3, 2, 1, 1)
    assert s["downtime_ms"] == {"min": 2500.0, "median": 3000.0, "max": 3500.0, "n": 2}
    assert s["peer_timeout_ms"] == [1000]
    assert s["pgbench_survived_total"] == 8 and s["ledger_survived_total"] == 2
    assert s["negative_control_catch_rate"] is None
    assert "1 broke off" in report.series_words(s)


def test_catch_rate_of_negative_controls():
    runs = [dict(result(lost_acked_commits=n), mode="power", negative_control=True,
                 passed=not n) for n in (0, 3, 1, 0)]
    runs[0]["passed"] = False  # lost nothing, but a connection did not survive
    broken = failover.failed_result(failover.DrillOptions(release_early=True), None, "refused")
    s = report.series_summary(runs + [broken])
    assert s["negative_control_catch_rate"] == 0.5
    assert (s["negative_controls"], s["negative_controls_broke_off"]) == (4, 1)
    assert s["negative_control_verdict_fail_rate"] == 0.75
    assert "caught lost commits in 50%, failed the verdict in 75%" in \
        report.series_words(s)


def test_ended_early():
    assert failover.ended_early({"pgbench": 70.0, "ledger": None}, 100.0) == {"pgbench": 30.0}
    assert failover.ended_early({"pgbench": 99.0, "ledger": 101.0}, 100.0) == {}


def test_the_cut_drops_both_directions_of_the_wire():
    rules = cut_ruleset("eth0")
    assert 'hook ingress device "eth0"' in rules and 'hook egress device "eth0"' in rules
    assert "table bridge" in rules and "table inet" in rules


# ---------------------------------------------------------------- switchover

def switched(**kw):
    """A switchover drill's result: the backup resumed epoch 41, the one the
    primary stopped at; the VM protected back from backup to primary."""
    r = result(power_cut=None, replica_committed_epoch=41,
               switchover={"from": "primary", "to": "backup", "epoch": 41, "held_epoch": 41,
                           "primary_switchover": {"state": "handed-over"}},
               reverse_protection={"runs_on": "backup", "backup": "primary",
                                   "state": "protected", "peer": "10.77.0.1:7788",
                                   "expected_peer": "10.77.0.1:7788", "replica_state": "ready",
                                   "old_primary_qemu_running": False, "error": None})
    r.update(kw)
    return r


def test_switchover_verdict_needs_the_stopped_epoch_and_the_reverse_protection():
    opts = failover.DrillOptions(mode="switchover")
    assert failover.verdict(opts, switched()) == (True, "PASS")
    # each small bug alone fails it
    passed, words = failover.verdict(opts, switched(replica_committed_epoch=40))
    assert not passed and "resumed epoch 40, not the stopped checkpoint's 41" in words
    rev = switched()["reverse_protection"]
    passed, words = failover.verdict(opts, switched(
        reverse_protection=dict(rev, old_primary_qemu_running=True)))
    assert not passed and "the old primary's QEMU still runs" in words
    passed, words = failover.verdict(opts, switched(
        reverse_protection=dict(rev, replica_state="receiving")))
    assert not passed and "not protected the other way round" in words
    passed, words = failover.verdict(opts, switched(
        reverse_protection=dict(rev, peer="10.77.0.2:7788")))
    assert not passed and "not protected the other way round" in words
    passed, words = failover.verdict(opts, switched(reverse_protection=None))
    assert not passed and "not protected back" in words
    passed, words = failover.verdict(opts, switched(
        switchover=dict(switched()["switchover"], primary_switchover={"state": "cancelled"})))
    assert not passed and "switchover is cancelled" in words
    passed, words = failover.verdict(opts, switched(switchover=None))
    assert not passed and "no switchover" in words
