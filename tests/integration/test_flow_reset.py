"""Commit protection's fail-safe reset at failover (issue 10), on a real
guest, a real power cut of the primary host and the real relay.

Two connections run to two rdb-cp-echo servers in the guest while it is
protected with --commit-protection at 100 ms:
- "speculative" keeps exchanging unprotected lines: each reply leaves the
  primary at once, ahead of the next checkpoint;
- "committed" made one protected exchange (its reply waited for its
  epoch) and then stays quiet: nothing of it is ahead of any checkpoint.

The primary host loses power (nftables silences its namespace, then its
processes are killed: no FIN, no RST). The backup takes over from its
last committed checkpoint. The speculative connection's client has seen
replies the restored guest never sent, so the backup must reset it both
ways: the client gets an error at once, and the guest's socket is gone.
The committed connection must carry on: a new protected exchange
succeeds, and the guest still has its socket.

Every verdict is read from the server side too: `ss` in the guest, run
through its agent on the backup host, says which connection exists.

The negative control runs the same with the backup's flow reset turned
off (remusdbd --unsafe-no-flow-reset): the speculative client then gets
no error, only silence, and the guest keeps a socket whose two ends
disagree, which is what the reset exists to prevent."""
import json
import os
import subprocess
import time

from conftest import fresh_guest

from remusdb import guest_agent, protection
from remusdb.lab import vm, workload
from remusdb.drill.lab import forget_ownership
from remusdb.drill.inject import Injection

NAME = "cpreset"
BACKUP = "10.77.0.2:7788"
SPEC_PORT, COMMITTED_PORT = 7007, 7008
# The checks need 20 replies and 20 ahead notices before the cut; a
# second of load gives thousands of each on this lab (4 s gave 37000 to
# 42000 replies and 5800 to 8700 notices).
LOAD_BEFORE_CUT_S = 1
# How long after the takeover the test watches the speculative
# connection. A fate both of its ends show (the client's error or a reply
# after the takeover; the guest's socket gone or there) is final once the
# reset engine's probes and their retries are over, RESET_SETTLED_S after
# the takeover (the first 3 s of cp_flow_takeover.c's ticks): the watch
# ends there. A stall shows only as nothing: it takes the whole window.
WATCH_AFTER_TAKEOVER_S = 12
RESET_SETTLED_S = 3.5
WATCH_POLL_S = 0.25

# Runs in the client namespace. The speculative connection exchanges
# unprotected lines in a thread until it fails; the main thread answers
# each "watch T" line on stdin with one JSON line (has the speculative
# connection failed, has it had a reply after unix time T), then waits for
# "check", makes the committed connection's second exchange and prints one
# JSON object.
CLIENT = r"""
import json, socket, sys, threading, time
ip, spec_port, committed_port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])

def connect(port):
    s = socket.create_connection((ip, port), timeout=30)
    s.settimeout(1.0)  # so that a stalled read is seen, and retried
    return s

def exchange(s, line, deadline):
    s.sendall(line.encode() + b"\n")
    reply = b""
    while not reply.endswith(b"\n"):
        try:
            chunk = s.recv(4096)
        except socket.timeout:
            if time.time() > deadline:
                raise
            continue
        if not chunk:
            raise ConnectionError("closed (FIN)")
        reply += chunk
    return reply.decode().strip()

committed = connect(committed_port)
first = exchange(committed, "P0", time.time() + 30)
spec = connect(spec_port)
state = {"replies": 0, "error": None, "error_text": None, "error_at": None,
         "last_reply_at": None}

def speculate():
    i = 0
    while True:
        try:
            exchange(spec, "U%d" % i, time.time() + 600)
        except OSError as e:
            state["error"], state["error_at"] = type(e).__name__, time.time()
            state["error_text"] = str(e)
            return
        state["replies"] += 1
        state["last_reply_at"] = time.time()
        i += 1

t = threading.Thread(target=speculate, daemon=True)
t.start()
print("ready", flush=True)
while True:
    words = sys.stdin.readline().split()
    if words[:1] != ["watch"]:
        break
    seen = dict(state)
    print(json.dumps({"error": seen["error"] is not None,
                      "replied_since": (seen["last_reply_at"] or 0) > float(words[1])}),
          flush=True)
result = {"committed_first": first, "speculative": dict(state)}
try:
    result["committed_second"] = exchange(committed, "P1", time.time() + 30)
except OSError as e:
    result["committed_second_error"] = "%s: %s" % (type(e).__name__, e)
result["speculative"] = dict(state)
print(json.dumps(result), flush=True)
"""

SS = ["ss", "-tnH", "state", "established",
      f"( sport = :{SPEC_PORT} or sport = :{COMMITTED_PORT} )"]


def guest_connections(host):
    """Local ports of the guest's established echo connections, as its kernel says."""
    qga = vm.vm_files(host, NAME)["qga"]
    r = guest_agent.run(qga, SS, timeout=30)
    assert r.get("exitcode") == 0, r
    # With a state filter ss prints: Recv-Q Send-Q Local:Port Peer:Port
    return sorted(int(line.split()[2].rsplit(":", 1)[1])
                  for line in r.get("out", "").splitlines() if line.strip())


def watch_after_takeover(client, resumed_at, taken_over):
    """The guest's established echo connections on the backup once the
    speculative connection's fate shows at both of its ends (see
    WATCH_AFTER_TAKEOVER_S), else when the window ends (taken_over:
    monotonic time of the takeover)."""
    deadline = taken_over + WATCH_AFTER_TAKEOVER_S
    while time.monotonic() < deadline:
        if resumed_at is not None and time.monotonic() >= taken_over + RESET_SETTLED_S:
            client.stdin.write(f"watch {resumed_at}\n")
            client.stdin.flush()
            seen = json.loads(client.stdout.readline())
            if seen["error"] or seen["replied_since"]:
                connections = guest_connections("backup")
                continues = seen["replied_since"] and not seen["error"]
                if (SPEC_PORT in connections) == continues:
                    return connections
        time.sleep(WATCH_POLL_S)
    return guest_connections("backup")


def start_backup_daemon(extra):
    vm.stop_daemon("backup")
    old = os.environ.get("REMUSDBD_EXTRA_ARGS")
    os.environ["REMUSDBD_EXTRA_ARGS"] = " ".join(filter(None, [old, extra]))
    try:
        vm.ensure_daemon("backup")
    finally:
        if old is None:
            del os.environ["REMUSDBD_EXTRA_ARGS"]
        else:
            os.environ["REMUSDBD_EXTRA_ARGS"] = old


def failover_run(backup_extra=None):
    """Boots, protects, loads, cuts the primary's power; returns what the
    client, the guest and the backup's daemon saw."""
    start_backup_daemon(backup_extra)
    injection = None
    try:
        with fresh_guest(NAME, backup_daemon=False):
            qga = vm.vm_files("primary", NAME)["qga"]
            for port in (SPEC_PORT, COMMITTED_PORT):
                guest_agent.start(qga, ["/usr/local/bin/rdb-cp-echo", str(port)])
            forget_ownership(NAME)
            protection.protect(NAME, BACKUP, 100, options={"commit_protection": True})
            protection.wait_protected(NAME, timeout=900)
            client = subprocess.Popen(
                ["ip", "netns", "exec", workload.CLIENT_NS, "/usr/bin/python3", "-c", CLIENT,
                 vm.DEFAULT_IP, str(SPEC_PORT), str(COMMITTED_PORT)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            try:
                assert client.stdout.readline().strip() == "ready"
                # ss runs in the guest well before the cut: under TCG its
                # start takes the vCPU for a while, and the cut must fall
                # on a busy connection.
                before_connections = guest_connections("primary")
                time.sleep(LOAD_BEFORE_CUT_S)
                before = protection.primary_protection("primary", NAME)["commit_protection"]
                injection = Injection("power", NAME)
                cut_at = injection.inject()
                replica = protection.wait_active(NAME, "backup", timeout=120)
                after_connections = watch_after_takeover(
                    client, (replica.get("failover") or {}).get("resumed_at_unix"),
                    time.monotonic())
                client.stdin.write("check\n")
                client.stdin.flush()
                out, _ = client.communicate(timeout=60)
            finally:
                if client.poll() is None:
                    client.kill()
            replica = protection.replica("backup", NAME)
            evidence = injection.evidence()
            result = {"client": json.loads(out.strip().splitlines()[-1]),
                      "cut_at": cut_at,
                      "resumed_at": replica["failover"]["resumed_at_unix"],
                      "committed_epoch": replica["committed_epoch"],
                      "flows": replica["flows"], "primary_cp_before_cut": before,
                      "guest_connections_before": before_connections,
                      "guest_connections_after": after_connections,
                      "frames_out_after_cut": evidence}
    finally:
        if injection is not None:
            injection.undo()
        start_backup_daemon(None)
    spec = result["client"]["speculative"]
    if spec["error_at"]:
        result["error_after_cut_ms"] = round((spec["error_at"] - result["cut_at"]) * 1000)
        result["error_after_resume_ms"] = round((spec["error_at"] - result["resumed_at"]) * 1000)
    print(json.dumps(result, indent=1))
    return result


def outcome(r):
    """What became of the speculative connection, from both of its ends:
    reset (the client got an RST, the guest's socket is gone), continued
    (replies after the takeover, the guest's socket is there: the client
    had seen nothing the restored guest lacked), or stalled (neither)."""
    spec = r["client"]["speculative"]
    in_guest = SPEC_PORT in r["guest_connections_after"]
    if spec["error"] == "ConnectionResetError" and spec["error_at"] > r["cut_at"] and not in_guest:
        return "reset"
    if spec["error"] is None and spec["last_reply_at"] > r["resumed_at"] and in_guest:
        return "continued"
    if spec["error"] is None and spec["last_reply_at"] < r["resumed_at"] and in_guest:
        return "stalled"
    return "inconsistent"


def check_common(r):
    spec, client = r["client"]["speculative"], r["client"]
    # A real load ran, and the primary told the backup of its early releases.
    assert spec["replies"] >= 20, spec
    assert r["primary_cp_before_cut"]["ahead_notices"] >= 20, r["primary_cp_before_cut"]
    assert r["guest_connections_before"] == [SPEC_PORT, COMMITTED_PORT]
    assert r["frames_out_after_cut"]["lan_frames_from_primary_after_cut"] == 0
    # The committed connection carries on, on both ends.
    assert client["committed_first"] == "P P0", client
    assert client.get("committed_second") == "P P1", client
    assert COMMITTED_PORT in r["guest_connections_after"], r["guest_connections_after"]


# How many power cuts a test may spend looking for one that leaves the
# client ahead of the restored guest. Where the power goes decides it:
# about one cut in three leaves a client the restored guest can carry on
# with (measured on this lab: 3 of 8 cuts; CI once saw 3 in a row). Either
# the client had read nothing beyond the checkpoint, or only a reply that
# the restored guest, given the same line again, sends again with the same
# bytes. Eight attempts miss in about 1 run of 2500; each costs about
# 50 s, and the loop stops at the first cut that shows what it looks for.
ATTEMPTS = 8


def test_speculative_connection_reset_committed_one_continues(lab):
    """Whether the client is ahead of the restored checkpoint depends on
    when the power goes (a cut just after a commit, with no reply out
    since, leaves it level): each attempt must end reset or continued,
    never stalled, until one shows the reset."""
    seen = []
    for _ in range(ATTEMPTS):
        r = failover_run()
        check_common(r)
        seen.append(outcome(r))
        reset = r["flows"]["reset"]
        assert seen[-1] in ("reset", "continued"), (seen, r)
        if seen[-1] == "continued":
            # The backup asked the client and found it level.
            assert reset["flows"] == 0 and reset["verified_consistent"] >= 1, reset
            continue
        assert reset["flows"] == 1, reset
        assert reset["client_rsts"] >= 1 and reset["guest_rsts"] >= 1, reset
        assert r["error_after_resume_ms"] < 2000, r
        break
    print("outcomes:", seen)
    assert "reset" in seen, seen


def test_without_the_reset_the_speculative_connection_stalls(lab):
    """Negative control: the same failover with the reset off
    (remusdbd --unsafe-no-flow-reset) leaves a client that saw output
    the restored guest lacks hanging on a connection whose guest end
    still exists: no error, no reply."""
    seen = []
    for _ in range(ATTEMPTS):
        r = failover_run("--unsafe-no-flow-reset")
        check_common(r)
        seen.append(outcome(r))
        assert "reset" not in r["flows"], r["flows"]
        if seen[-1] == "stalled":
            break
    print("outcomes:", seen)
    assert "stalled" in seen, seen
