"""Shared by the commit-protection DBMS tests (test_commit_protection_pg.py,
test_commit_protection_mariadb.py): protect the guest in commit-protection
mode, run a client in the lab's client namespace that times each kind of
reply, and judge whether commit acknowledgements were held.

A held reply waits for the checkpoint of its epoch, so its latency is a
good part of the interval; an unheld one comes back in a few ms. The relay's
counters say the same from the host's side: marked_held counts the frames
it held because the guest marked them."""
import json
import statistics
import subprocess

from remusdb import guest_agent, protection
from remusdb.lab import vm, workload
from remusdb.drill.lab import forget_ownership

BACKUP = "10.77.0.2:7788"
INTERVAL_MS = 100
# A held reply waits on average half an epoch plus the checkpoint and its
# acknowledgement; unheld replies take a few ms. A quarter of the interval
# separates the two with a wide margin on each side.
HELD_MS = INTERVAL_MS / 4


def run_client(script, *args, timeout=300):
    """Runs a Python client script in the client namespace; its last stdout
    line is a JSON object."""
    r = subprocess.run(["ip", "netns", "exec", workload.CLIENT_NS, "/usr/bin/python3", "-c",
                        script, *map(str, args)],
                       capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def guest_run(name, argv, timeout=60):
    """Runs argv in the guest through its agent; returns its status."""
    qga = vm.vm_files("primary", name)["qga"]
    pid = guest_agent.start(qga, argv)
    return guest_agent.finish(qga, pid, timeout)


def protected_run(name, measure):
    """Protects `name` with --commit-protection at INTERVAL_MS, runs
    measure() and returns its result with the relay's counters over it
    under "relay"."""
    forget_ownership(name)
    protection.protect(name, BACKUP, INTERVAL_MS, options={"commit_protection": True})
    try:
        protection.wait_protected(name, timeout=900)
        before = protection.primary_protection("primary", name)["commit_protection"]
        result = measure()
        after = protection.primary_protection("primary", name)
    finally:
        protection.unprotect(name)
    assert after["state"] == "protected", after.get("error")
    cp = after["commit_protection"]
    result["relay"] = {k: cp[k] - before[k] if k not in ("dscp", "flows_holding") else cp[k]
                       for k in cp}
    result["medians_ms"] = {k: round(statistics.median(v), 1)
                            for k, v in result["latency_ms"].items()}
    print(json.dumps(result, indent=1))
    return result


def not_held(result, commits, others, min_held_frames):
    """Why the commit acknowledgements of `result` were not held, or the
    other replies were: an empty list when commit protection worked.
    `commits` name the latency series that acknowledge commits, `others`
    those that must come back at once."""
    med = result["medians_ms"]
    why = []
    for k in commits:
        if med[k] < HELD_MS:
            why.append(f"{k} replies took {med[k]} ms (median), not held (>= {HELD_MS} ms)")
    for k in others:
        if med[k] >= HELD_MS:
            why.append(f"{k} replies took {med[k]} ms (median): held, should leave at once")
    if result["relay"]["marked_held"] < min_held_frames:
        why.append(f"the relay held {result['relay']['marked_held']} marked frames, "
                   f"expected at least {min_held_frames}")
    return why
