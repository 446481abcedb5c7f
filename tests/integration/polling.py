"""Waiting for the lab to reach a state, with a deadline and a reason."""
import time

from remusdb.lab import workload


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


def acked_count(ledger_file):
    """How many commits the ledger writing ledger_file saw acknowledged."""
    return len(workload.ledger_acked_ids(ledger_file))


def wait_for_acks(ledger_file, count, timeout=60, what="acknowledged commits"):
    """Until the ledger has `count` commits acknowledged: the load is
    under way (it commits within 3 s of its start, then several a second)."""
    wait_for(lambda: acked_count(ledger_file) >= count, timeout,
             f"the ledger to reach {count} {what}")
