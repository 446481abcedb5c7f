"""RemusDB's two lemmas for commit protection (issue 10) under a power cut
of the primary host, with the patched DBMS in a real guest
(tools/lib/remusdb/drill/commit_protection.py runs one drill and says what it checks).

A drill whose load did not exercise both lemmas (no acknowledged commit
on one side of the failure, or no transaction interrupted after its
client saw results) proves nothing either way: it is retried, up to
ATTEMPTS, and never counted as a pass. The negative control turns the
DBMS patch off with the relay still in commit-protection mode: commit
acknowledgements then leave speculatively, and a drill must show one
lost. It cuts the power a quarter into a 500 ms epoch (cut="mid-epoch",
commit_protection.py says why that loses commits every time without the
patch), so that its first drill decides; at 50 ms and a cut anywhere in
the epoch it took up to four.

The load runs 5 to 8 s before the cut and 6 s after it, what the
verdict needs rather than the operator's default of 8 to 14 s and 15 s:
in the 28 drills of 2026-11-26, every txclient connection had committed
within 2 s of the client's first transaction (which comes about 1 s into
the load), and the first commit after the cut came within 2.4 s of it."""
import json
import random
import time

import pytest

from remusdb.drill import commit_protection

# The drill cuts right after a result that followed an acknowledgement
# (cut="after-result", commit_protection.py says why). After-ack cuts
# exercised both lemmas in 38 of 57 drills (2026-11-26/27), then in none
# of CI's eight postgres drills of 2026-11-27 20:18. Side by side
# (docs/bench/cp-cuts/), after-result exercised them in 14 of 15 drills
# (8 of 8 with its final rule), after-ack in 3 of 7. Eight attempts stay
# the bound; a drill that exercises them ends the series.
ATTEMPTS = 8
AFTER_S = 6


def drills(dbms, dbms_cp, until, **how):
    results = []
    for i in range(ATTEMPTS):
        # Each drill on a VM restored from its saved guest (conftest.py).
        r = commit_protection.run(f"/var/lib/remusdb-drills/cp-{dbms}-{int(time.time())}-{i}",
                                  dbms=dbms, dbms_cp=dbms_cp, from_saved=True,
                                  failure_at_s=random.uniform(5, 8), after_s=AFTER_S, **how)
        summary = {k: r.get(k) for k in (
            "exercised", "passed", "acknowledged", "acknowledged_before_failure",
            "acknowledged_after_failure", "lost_acknowledged", "ledger_acknowledged",
            "ledger_lost", "broken", "broken_with_results_seen", "committed_despite_break",
            "in_doubt", "in_doubt_committed", "first_error_after_failure_s",
            "resumed_after_failure_s", "interval_ms", "cut", "epoch_sent_before_cut",
            "committed_epoch", "dbms_switch", "cut_after_ack_ms", "cut_after_result_ms",
            "load_killed")}
        summary["reset"] = (r.get("backup_flows") or {}).get("reset")
        summary["wrong"] = r.get("wrong", [])[:5]
        print(json.dumps(summary, indent=1))
        results.append(r)
        if until(r):
            break
    return results


@pytest.mark.parametrize("dbms", ["postgres", "mariadb"])
def test_lemmas_hold_with_commit_protection(lab, dbms):
    results = drills(dbms, True, lambda r: r["exercised"])
    for r in results:
        assert r["frames_out_after_cut"] == 0, r
        assert r["dbms_switch"] == "on", r["dbms_switch"]
        # Never a violation, exercised or not.
        assert not r["wrong"], r["wrong"]
    assert any(r["exercised"] for r in results), "no drill exercised both lemmas"
    r = next(r for r in results if r["exercised"])
    assert r["lost_acknowledged"] == 0 and r.get("ledger_lost", 0) == 0
    if dbms == "postgres":  # the autocommit ledger runs against PostgreSQL
        assert r["ledger_acknowledged"] > 0
    assert r["committed_despite_break"] == 0 and r["partial"] == 0
    # The interrupted connections learned of it at once: a reset, not a timeout.
    assert r["first_error_after_failure_s"] is not None
    assert r["first_error_after_failure_s"] < r["resumed_after_failure_s"] + 2.0, r
    assert r["backup_flows"]["reset"]["flows"] >= 1, r["backup_flows"]


@pytest.mark.parametrize("dbms", ["postgres"])
def test_without_the_dbms_patch_acknowledged_commits_are_lost(lab, dbms):
    results = drills(dbms, False, lambda r: r["lost_acknowledged"] + r.get("ledger_lost", 0) > 0,
                     interval_ms=500, cut="mid-epoch")
    assert results[-1]["dbms_switch"] == "off"
    assert any(r["lost_acknowledged"] + r.get("ledger_lost", 0) > 0 for r in results), \
        [(r["acknowledged"], r["lost_acknowledged"]) for r in results]
