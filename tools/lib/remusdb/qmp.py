"""Small synchronous QMP client for the tools (the daemon has its own)."""
import json
import socket
import time


class QMPError(Exception):
    pass


class QMP:
    def __init__(self, path, timeout=30.0):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(str(path))
        self.file = self.sock.makefile("rwb")
        self.greeting = self._read()
        self.command("qmp_capabilities")

    def _read(self):
        line = self.file.readline()
        if not line:
            raise QMPError("QEMU closed the QMP connection")
        return json.loads(line)

    def command(self, name, /, **arguments):
        # name positional-only: some commands take an argument "name"
        # (trace-event-set-state, qom-get's property is another)
        msg = {"execute": name}
        if arguments:
            msg["arguments"] = arguments
        self.file.write(json.dumps(msg).encode() + b"\r\n")
        self.file.flush()
        while True:
            reply = self._read()
            if "return" in reply:
                return reply["return"]
            if "error" in reply:
                raise QMPError(f"{name}: {reply['error'].get('desc', reply['error'])}")
            # an asynchronous event: not ours to handle here

    def close(self):
        try:
            self.file.close()
            self.sock.close()
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def wait_for_socket(path, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return QMP(path)
        except (FileNotFoundError, ConnectionRefusedError):
            time.sleep(0.1)
    raise QMPError(f"no QMP socket at {path} after {timeout:.0f} s")
