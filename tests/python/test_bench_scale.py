"""The pure parts of remusdb-bench scale: which backup samples count as
"before the failure" and which as the takeover's peak, and the per-size
summary of the drills. No lab, no VM."""
from remusdb.bench import scale


def sample(t, rss, protected, pss):
    return {"t": t, "daemon_rss_bytes": rss, "protected_ram_bytes": protected,
            "host_pss_bytes": pss}


def sampler_with(samples):
    s = scale.BackupSampler()
    s.samples = samples
    return s


GIB = 1 << 30


def test_before_is_the_last_sample_with_a_replica_before_the_failure():
    s = sampler_with([sample(1, 100, GIB, 10), sample(2, 300 << 20, GIB, 20),
                      sample(3, None, None, 30),   # status unanswered: skipped
                      sample(10, 900 << 20, GIB, 40)])  # after the failure at 5
    m = s.summary(failure_at=5)
    assert m["daemon_rss_bytes"] == 300 << 20
    assert m["daemon_rss_per_protected_gib"] == (300 << 20) / 1
    assert m["daemon_rss_over_protected_ram"] == (300 << 20) / GIB
    assert m["host_pss_bytes_before"] == 20


def test_the_peak_is_taken_inside_the_takeover_window_only():
    w = scale.TAKEOVER_PEAK_WINDOW_S
    s = sampler_with([sample(4, 1, GIB, 999),          # before: not the takeover's
                      sample(5, 1, GIB, 50), sample(6, 1, GIB, 70),
                      sample(5 + w, 1, GIB, 80),       # the window's last instant counts
                      sample(5 + w + 1, 1, GIB, 500)])  # after the window: not counted
    assert s.summary(failure_at=5)["host_pss_bytes_peak_takeover"] == 80


def test_no_failure_time_has_no_peak():
    s = sampler_with([sample(1, 100, GIB, 10)])
    m = s.summary(failure_at=None)
    assert m["host_pss_bytes_peak_takeover"] is None
    assert m["daemon_rss_bytes"] == 100


def test_no_replica_held_gives_no_ratio():
    s = sampler_with([sample(1, 100, 0, 10)])
    assert s.summary(failure_at=5)["daemon_rss_per_protected_gib"] is None
    assert s.summary(failure_at=5)["daemon_rss_over_protected_ram"] is None


def run(mem, mode, passed=True, **kw):
    r = {"mem_mb": mem, "restore": mode, "passed": passed, "pause_ms_p50": 1,
         "pause_ms_p99": 2, "bitmap_sync_ms_p50": None, "bitmap_sync_ms_p99": 1,
         "bytes_per_epoch_mean": 10, "initial_sync_s": 3, "takeover_ms": 100,
         "downtime_ms": 500,
         "backup_memory": {"daemon_rss_over_protected_ram": 0.5,
                           "host_pss_bytes_peak_takeover": 7}}
    r.update(kw)
    return r


def test_summary_counts_failed_drills_but_takes_figures_from_passed_ones():
    runs = [run(1024, "shared", pause_ms_p99=2), run(1024, "eager", pause_ms_p99=4),
            run(1024, "lazy", passed=False, pause_ms_p99=1000, takeover_ms=9999),
            run(2048, "shared", pause_ms_p99=3)]
    out = scale.ram_summary(runs, [1024, 2048], ["shared", "eager", "lazy"])
    one = out["1024"]
    assert one["drills"] == 3 and one["passed"] == 2
    assert one["pause_ms_p99"] == 3          # median of 2 and 4; the failed 1000 left out
    assert one["takeover_ms"] == {"shared": 100, "eager": 100}
    assert out["2048"]["drills"] == 1 and out["2048"]["pause_ms_p99"] == 3
    assert one["bitmap_sync_ms_p50"] is None  # no value is not a zero


def test_rdb_dirty_argv_carries_the_fixed_rate():
    class A:
        dirty_rate = 8.0
        dirty_mode = "sparse"
    argv = scale.rdb_dirty_argv(A, 61.7)
    assert argv[argv.index("--rate-mb") + 1] == "8"
    assert argv[argv.index("--seconds") + 1] == "61"
    assert argv[argv.index("--mode") + 1] == "sparse"
