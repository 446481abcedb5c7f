"""The COLO trace's parser (remusdb.bench.colo_trace): QEMU 7.2's log
lines, with -msg timestamp=on, turned into each checkpoint's phases. The
lines below are as a lab QEMU wrote them (2026-11-28), with one checkpoint
cut short and one out of order. No lab, no VM."""
from remusdb.bench import colo_trace

ONE = """\
656@1795870341.917296:colo_send_message Send 'checkpoint-request' message
656@1795870341.917328:colo_receive_message Receive 'checkpoint-reply' message
656@1795870341.918002:colo_vm_state_change Change 'run' => 'stop'
656@1795870341.918033:colo_send_message Send 'vmstate-send' message
656@1795870341.920380:colo_send_message Send 'vmstate-size' message
656@1795870341.920524:colo_receive_message Receive 'vmstate-received' message
656@1795870341.920529:colo_receive_message Receive 'vmstate-loaded' message
656@1795870341.920983:colo_vm_state_change Change 'stop' => 'run'
"""


def shifted(text, seconds):
    out = []
    for line in text.splitlines():
        pid, rest = line.split("@", 1)
        t, tail = rest.split(":", 1)
        out.append(f"{pid}@{float(t) + seconds:.6f}:{tail}")
    return out


def test_a_checkpoint_gives_its_phases():
    cps = colo_trace.checkpoints(ONE.splitlines())
    assert len(cps) == 1
    s = colo_trace.summary(ONE.splitlines(), 1795870341.9, 1795870342.0)
    assert s["checkpoints"] == 1
    assert s["A_reply_ms_p99"] == 0.032
    assert s["B_stop_ms_p99"] == 0.674
    assert s["D_ram_ms_p99"] == 2.347
    assert s["G_start_ms_p99"] == 0.454
    # the guest's pause: stopped (918002) to running (920983)
    assert s["guest_pause_ms_p50"] == 2.981
    assert s["reply_to_loaded_ms_p99"] == 3.201


def test_cut_short_or_out_of_order_checkpoints_are_left_out():
    lines = ONE.splitlines()
    cut = lines[3:]                     # the log began mid-checkpoint
    unordered = shifted(ONE, 0.1)
    unordered[4], unordered[5] = unordered[5], unordered[4]
    later = shifted(ONE, 0.2)
    noise = ["qemu-system-x86_64: some warning", "656@1795870342.1:colo_compare_main x"]
    cps = colo_trace.checkpoints(cut + noise + unordered + later)
    assert len(cps) == 1
    assert abs(cps[0][0] - (1795870341.917296 + 0.2)) < 1e-6


def test_the_window_picks_checkpoints_by_their_request():
    lines = ONE.splitlines() + shifted(ONE, 10)
    assert colo_trace.summary(lines, 1795870345, 1795870355)["checkpoints"] == 1
    assert colo_trace.summary(lines, 0, 1)["checkpoints"] == 0


def test_percentiles_are_nearest_rank_like_the_daemons():
    values = list(range(1, 101))
    assert colo_trace.percentile(values, 99) == 99
    assert colo_trace.percentile(values, 50) == 50
    assert colo_trace.percentile([7], 99) == 7
    assert colo_trace.percentile([], 99) is None
