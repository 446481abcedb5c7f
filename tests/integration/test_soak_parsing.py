"""The soak's pure parts: the far-side two-primary count from the LAN
bridge's counters, the verdict and the summary. No VM, no lab. Each
check has its small-bug control: one interval, one lost commit, one
fault that failed is enough to fail the run."""
import argparse

import pytest

from remusdb.cli.drill import fault_kinds
from remusdb.drill import mac_watch, soak

MAC = "52:54:00:00:00:01"
P, B = mac_watch.PORTS


def samples(*frames):
    """[(t, {(MAC, port): frames})] from (primary, backup) totals."""
    return [(float(i), {(MAC, P): p, (MAC, B): b}) for i, (p, b) in enumerate(frames)]


def test_one_move_is_no_two_primaries():
    s = samples((0, 0), (5, 0), (9, 0), (9, 0), (9, 3), (9, 8))
    assert mac_watch.both_ports_intervals(s, MAC) == []
    assert mac_watch.port_runs(s, MAC) == [P, B]


def test_a_move_within_one_interval_is_no_two_primaries():
    """A switchover pauses the VM about 100 ms: its last frame from the old
    host and its first from the new one can share a sampling interval."""
    s = samples((0, 0), (5, 0), (9, 0), (10, 3), (10, 8))
    assert mac_watch.both_ports_intervals(s, MAC) == []
    s = samples((0, 0), (5, 0), (5, 0), (6, 2), (6, 2), (6, 5))  # quiet around it
    assert mac_watch.both_ports_intervals(s, MAC) == []


def test_the_other_copy_speaking_once_while_one_serves_is_caught():
    """The small bug: one interval in which the fenced copy spoke, the
    serving host's frames before and after it."""
    s = samples((0, 0), (5, 0), (9, 0), (10, 1), (14, 1))
    assert mac_watch.both_ports_intervals(s, MAC) == [3.0]


def test_both_hosts_in_two_intervals_in_a_row_are_caught():
    s = samples((0, 0), (5, 0), (9, 2), (12, 4), (12, 9))
    assert mac_watch.both_ports_intervals(s, MAC) == [2.0, 3.0]


def test_the_old_copy_speaking_again_shows_in_the_runs():
    s = samples((0, 0), (5, 0), (5, 4), (6, 4), (6, 9))
    assert mac_watch.port_runs(s, MAC) == [P, B, P, B]
    assert mac_watch.both_ports_intervals(s, MAC) == []


def test_other_macs_do_not_count():
    s = [(0.0, {(MAC, P): 0, ("52:54:00:00:00:02", B): 0}),
         (1.0, {(MAC, P): 4, ("52:54:00:00:00:02", B): 7})]
    assert mac_watch.both_ports_intervals(s, MAC) == []


def test_the_ruleset_counts_each_mac_on_each_port():
    text = mac_watch.ruleset([MAC])
    assert text.count("counter") == 2
    assert f'iifname "{P}" ether saddr {MAC}' in text
    assert f'iifname "{B}" ether saddr {MAC}' in text


def good_fault(kind="power"):
    return {"kind": kind, "at": 100.0, "at_s": 10.0, "protected_again_s": 12.0,
            "vms": {"soak1": {"downtime_ms": 600.0, "lost": 0, "two_primary_intervals": 0},
                    "soak2": {"downtime_ms": 90.0, "lost": 0, "two_primary_intervals": 0}}}


def result(faults, final=None):
    final = final or {n: {"acked": 500, "lost": 0, "amcheck_rc": 0} for n in ("soak1", "soak2")}
    return {"faults": faults, "final": final}


def test_a_clean_soak_passes():
    ok, problems = soak.verdict(result([good_fault(), good_fault("cut-link")]))
    assert ok, problems


def test_one_lost_commit_fails_the_soak():
    f = good_fault()
    f["vms"]["soak2"]["lost"] = 1
    ok, problems = soak.verdict(result([good_fault(), f]))
    assert not ok and "soak2 lost 1" in problems[0]


def test_a_lost_commit_found_only_at_the_end_fails_it():
    final = {"soak1": {"acked": 500, "lost": 1, "amcheck_rc": 0},
             "soak2": {"acked": 500, "lost": 0, "amcheck_rc": 0}}
    assert not soak.verdict(result([good_fault()], final))[0]


def test_one_interval_with_two_primaries_fails_the_soak():
    f = good_fault()
    f["vms"]["soak1"]["two_primary_intervals"] = 1
    assert not soak.verdict(result([f]))[0]


def test_a_fault_that_was_not_repaired_fails_the_soak():
    f = good_fault()
    f["failed"] = "SoakError: soak1 on backup to notice its backup gone: not within 60 s"
    ok, problems = soak.verdict(result([good_fault(), f]))
    assert not ok and "fault 2 (power)" in problems[0]


def test_clients_that_never_recovered_fail_the_soak():
    f = good_fault()
    f["vms"]["soak1"]["downtime_ms"] = None
    assert not soak.verdict(result([f]))[0]


def test_no_fault_or_no_load_is_no_verdict():
    assert not soak.verdict(result([]))[0]
    final = {n: {"acked": 0, "lost": 0, "amcheck_rc": 0} for n in ("soak1", "soak2")}
    assert not soak.verdict(result([good_fault()], final))[0]


def test_an_unchecked_lost_count_is_not_zero():
    f = good_fault()
    f["vms"]["soak1"]["lost"] = None  # the database could not be asked
    assert not soak.verdict(result([f]))[0]


def test_summary_counts_kinds_and_medians():
    faults = [good_fault(), good_fault("etcd-member"), good_fault()]
    faults[1]["protected_again_s"] = 1.0
    s = soak.summary(result(faults))
    assert s["faults"] == 3 and s["kinds"] == {"power": 2, "etcd-member": 1}
    assert s["lost"] == 0 and s["downtime_ms_max"] == 600.0
    assert s["protected_again_s_median"] == 12.0


def test_fault_kinds_are_checked():
    assert fault_kinds("power,etcd-member") == "power,etcd-member"
    with pytest.raises(argparse.ArgumentTypeError):
        fault_kinds("power,meteor")
