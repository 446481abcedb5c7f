"""The loop profile's attribution (remusdb.bench.loop_profile): each perf
sample is charged to the handler the loop called, the loop's own wait to
itself, and a stack perf could not unwind to the loop to its outermost
known frame."""
from remusdb.bench.loop_profile import attribute, defined_in, handler_of

# perf script -F ip,sym --no-inline: a blank line, then frames leaf first
SCRIPT = """
\tffffffff813a2313 finish_task_switch.isra.0
\tffffffff8172fab8 do_epoll_wait
\t          108f36 epoll_wait
\t           199a2 event_loop_run_once
\t           1a000 main

\t           2b001 checkpoint_pipeline_add_page
\t           2c002 on_page
\t           2d003 on_stream_io
\t           199a2 event_loop_run_once
\t           1a000 main

\t           2b001 checkpoint_pipeline_add_page+0x1f
\t           2d003 on_stream_io
\t           199b0 event_loop_run_once
\t           1a000 main

\t           3e001 page_delta_decode
\t           3e002 replica_on_frame
\t               0 [unknown]
"""


def test_samples_are_charged_to_the_handler_the_loop_called():
    r = attribute(SCRIPT, seconds=1)
    assert r["samples"] == 4
    shares = {h["handler"]: h["share"] for h in r["handlers"]}
    assert shares == {"on_stream_io": 0.5, "(the loop's own wait and bookkeeping)": 0.25,
                      "(not unwound to the loop; outermost frame replica_on_frame)": 0.25}
    # self time by leaf, the offset dropped
    assert r["self_time"][0] == {"function": "checkpoint_pipeline_add_page", "share": 0.5}
    assert r["loop_thread_cores"] == round(4 / r["hz"], 4)


def test_a_handler_is_not_the_loop_itself():
    # a sample in the loop's own code, below any handler
    assert handler_of(["event_loop_run_once", "main"]) == "(the loop's own wait and bookkeeping)"
    assert handler_of(["serve_buffered", "event_loop_run_once"]) == "serve_buffered"


def test_nothing_sampled_is_a_problem_not_a_profile():
    assert "problem" in attribute("\n\n", seconds=1)


def test_handlers_are_found_in_the_daemons_source():
    assert defined_in("on_stream_io") == ["qemu/colo_capture_socket.c"]
    assert defined_in("flush_and_rearm.isra.0") == ["nbd/nbd_conn.c"]
    assert defined_in("no_such_function_anywhere") == []
