"""Waiting for the lab to reach a state, with a deadline and a reason."""
import time


def wait_for(predicate, timeout, what, every=0.2):
    """predicate()'s first true value, polled every `every` seconds; an
    AssertionError naming `what` when `timeout` seconds pass first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what}")
