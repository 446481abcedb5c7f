"""Client for remusdbd's control socket: one JSON request per line, one
JSON response per line ({"ok": true, ...} or {"ok": false, "error": ...})."""
import json
import socket


class ControlError(Exception):
    pass


def request(socket_path, cmd, timeout=10.0, **fields):
    message = dict(fields, cmd=cmd)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(str(socket_path))
            sock.sendall(json.dumps(message).encode() + b"\n")
            data = b""
            while not data.endswith(b"\n"):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
    except (FileNotFoundError, ConnectionRefusedError):
        raise ControlError(f"remusdbd is not running (no control socket at {socket_path})")
    except OSError as e:
        raise ControlError(f"control socket {socket_path}: {e}")
    if not data:
        raise ControlError("remusdbd closed the control connection without answering")
    reply = json.loads(data)
    if not reply.get("ok"):
        raise ControlError(reply.get("error", "remusdbd refused the request"))
    return reply


def reachable(socket_path):
    try:
        request(socket_path, "ping", timeout=2.0)
        return True
    except ControlError:
        return False
