"""Client for remusdbd's control socket: one JSON request per line, one
JSON response per line ({"ok": true, ...} or {"ok": false, "error": ...}).

A host of the cluster (remusdb.cluster) is reached through its control
access: `local`, its socket on this machine; `ssh`, the same request
carried by `ssh TARGET remusdb control-relay --socket PATH`, which hands
the line to the socket on that host and the response back (see the
cluster module's header for why ssh and no listening port of remusdbd's
own)."""
import json
import socket
import subprocess

# One request and its response; a status of a daemon with many VMs is
# tens of KiB. A relay refuses anything longer rather than cut it.
MAX_LINE = 16 << 20


class ControlError(Exception):
    pass


def exchange(socket_path, line, timeout=10.0):
    """Sends one request line (bytes ending in a newline) to the daemon's
    socket; returns its response line (bytes, b"" if it closed without
    answering). ControlError when there is no daemon to ask."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(str(socket_path))
            sock.sendall(line)
            data = b""
            while not data.endswith(b"\n"):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
                if len(data) > MAX_LINE:
                    raise ControlError(f"control socket {socket_path}: a response longer "
                                       f"than {MAX_LINE} bytes")
            return data
    except (FileNotFoundError, ConnectionRefusedError):
        raise ControlError(f"remusdbd is not running (no control socket at {socket_path})")
    except OSError as e:
        raise ControlError(f"control socket {socket_path}: {e}")


def _reply(data):
    if not data:
        raise ControlError("remusdbd closed the control connection without answering")
    reply = json.loads(data)
    if not reply.get("ok"):
        raise ControlError(reply.get("error", "remusdbd refused the request"))
    return reply


def request(socket_path, cmd, timeout=10.0, **fields):
    message = dict(fields, cmd=cmd)
    return _reply(exchange(socket_path, json.dumps(message).encode() + b"\n", timeout))


def request_over_ssh(access, cmd, timeout=10.0, **fields):
    """The request through `ssh ... remusdb control-relay` (access: a
    remusdb.cluster.Control with via ssh). ssh's own failures (no route,
    a refused key, an unknown host key) and a missing remusdb there come
    back as one line (Control.ssh_failure); the relay's (no daemon
    there) as an error reply."""
    message = json.dumps(dict(fields, cmd=cmd)).encode() + b"\n"
    argv = access.ssh_argv("control-relay", "--socket", access.socket,
                           "--timeout", f"{timeout:g}")
    try:
        r = subprocess.run(argv, input=message, capture_output=True, timeout=timeout + 10)
    except subprocess.TimeoutExpired:
        raise ControlError(f"ssh {access.target}: no answer within {timeout + 10:g} s")
    except OSError as e:
        raise ControlError(f"cannot run ssh: {e}")
    err = r.stderr.decode(errors="replace").strip().splitlines()
    line = access.ssh_failure(r.returncode, err[-1] if err else None, access.target)
    if line:
        raise ControlError(line)
    if r.returncode != 0:
        raise ControlError(f"remusdb control-relay on {access.target} exited "
                           f"{r.returncode}: {err[-1] if err else '(no message)'}")
    return _reply(r.stdout)


def request_via(access, cmd, timeout=10.0, **fields):
    """request() to the daemon behind a cluster host's control access."""
    if access.via == "ssh":
        return request_over_ssh(access, cmd, timeout, **fields)
    return request(access.socket, cmd, timeout, **fields)


def reachable(socket_path):
    try:
        request(socket_path, "ping", timeout=2.0)
        return True
    except ControlError:
        return False
