"""A `remusdb` verb run on a host of the cluster reached through ssh, for
the verbs that need that host's files rather than only its daemon
(libvirt-wire: its libvirt and run directory; fork: its parent's QEMU,
guest agent and the clones' overlays; check-image's page sums: its
memory dump or checksum file). `ssh TARGET remusdb VERB ... --forwarded
N` is run with the cluster file's ssh settings (Control.ssh_argv: user,
port, key, known_hosts, BatchMode), its standard output passed on as it
comes and its exit status returned, the way control-relay carries one
request.

--forwarded N says "you are the host named by --host, act here": the far
side refuses to forward again (its own cluster file must reach that host
`via: local`) and refuses a caller of another forwarding protocol, so
two versions never half-understand each other. A remusdb too old to know
--forwarded fails argparse's way (exit 2, "unrecognized arguments"),
which is reported as such.

ssh's own failures (exit 255: unreachable, refused key, unknown or
changed host key), a missing remusdb there (126, 127) and an older
remusdb come back as one line naming the target; the far verb's own
error lines are passed on naming the host."""
import subprocess
import sys
import threading

from . import cluster

# What --forwarded carries; raise it when a forwarded verb's arguments
# change in a way an older far side would misread.
FORWARD_PROTOCOL = 1


class RemoteVerbError(Exception):
    """One line: what failed on which host, and what to do."""


def forward_argv(access, verb, *args):
    """ssh's command line that runs `remusdb VERB ARGS --forwarded N` on the
    host behind `access` (a cluster.Control with via ssh)."""
    return access.ssh_argv(verb, *args, "--forwarded", str(FORWARD_PROTOCOL))


def check_forwarded(protocol, host):
    """On the far side of a forwarded verb: the caller's protocol must be
    ours, and `host` must be this machine's own (via local in the cluster
    file read here), or the verb would be forwarded again."""
    if protocol != FORWARD_PROTOCOL:
        raise RemoteVerbError(f"forwarded by a remusdb of forwarding protocol {protocol}; "
                              f"this one speaks {FORWARD_PROTOCOL}: install the same remusdb "
                              f"version on both hosts")
    c = cluster.current()
    if c.host(host).control.via != "local":
        raise RemoteVerbError(f"{host} was asked to run this verb itself, but its cluster file "
                              f"{c.path} reaches {host} through ssh: make {host} `via: local` "
                              f"in the cluster file on {host}")


def _failure(access, host, verb, code, held):
    """The one line for a forwarded verb that failed before the far
    remusdb spoke, or None when its own error lines say it all."""
    last = held[-1] if held else None
    target = access.target
    line = access.ssh_failure(code, last, host)
    if line:
        return line
    text = "\n".join(held)
    if code == 2 and ("--forwarded" in text or "invalid choice" in text):
        return (f"remusdb on {host} ({target}) does not know `{verb} --forwarded` (an older "
                f"version): install the same remusdb version there")
    return None


def _relay_stderr(stream, held):
    """Progress lines ("[prefix] ...") pass at once; every other line is
    held until the exit status says whether it is the far verb's error
    (passed on, naming the host) or ssh's (summed up in one line)."""
    for raw in iter(stream.readline, b""):
        line = raw.decode(errors="replace").rstrip("\n")
        if line.startswith("["):
            print(line, file=sys.stderr, flush=True)
        elif line.strip():
            held.append(line)


def run(host, verb, *args, stdin_data=None):
    """Runs `remusdb VERB ARGS` on cluster host `host` (via ssh) with the
    remote's stdout passed through to ours; returns its exit status.
    RemoteVerbError when ssh, or the remusdb there, could not run it."""
    access = cluster.current().host(host).control
    argv = forward_argv(access, verb, *args)
    sys.stdout.flush()
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE if stdin_data is not None
                                else subprocess.DEVNULL, stderr=subprocess.PIPE)
    except OSError as e:
        raise RemoteVerbError(f"cannot run ssh: {e}")
    held = []
    reader = threading.Thread(target=_relay_stderr, args=(proc.stderr, held))
    reader.start()
    if stdin_data is not None:
        try:
            proc.stdin.write(stdin_data)
            proc.stdin.close()
        except BrokenPipeError:
            pass  # ssh ended first: its exit status says why
    code = proc.wait()
    reader.join()
    line = _failure(access, host, verb, code, held)
    if line:
        raise RemoteVerbError(line)
    for x in held:
        prefix = "remusdb: error: "
        print(f"{prefix}{host}: {x[len(prefix):]}" if x.startswith(prefix) else x,
              file=sys.stderr)
    return code


def capture(host, verb, *args, timeout=120):
    """Runs `remusdb VERB ARGS` on `host` through ssh and returns its
    stdout (bytes); RemoteVerbError (one line) unless it exits 0."""
    access = cluster.current().host(host).control
    argv = forward_argv(access, verb, *args)
    try:
        r = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RemoteVerbError(f"ssh {access.target} remusdb {verb}: no answer within "
                              f"{timeout} s")
    except OSError as e:
        raise RemoteVerbError(f"cannot run ssh: {e}")
    held = [x for x in r.stderr.decode(errors="replace").splitlines() if x.strip()]
    if r.returncode == 0:
        return r.stdout
    line = _failure(access, host, verb, r.returncode, held)
    if line:
        raise RemoteVerbError(line)
    last = held[-1].removeprefix("remusdb: error: ") if held else f"exit {r.returncode}"
    raise RemoteVerbError(f"remusdb {verb} on {host}: {last}")
