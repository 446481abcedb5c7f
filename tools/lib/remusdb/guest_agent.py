"""A minimal qemu-guest-agent client over a VM's qga unix socket
(vm.vm_files(host, name)['qga']): runs programs in the guest without
touching its network.

The agent's channel is a byte stream with no framing beyond one JSON
object per reply, and a reply meant for an earlier client may still sit in
it. So every session starts with guest-sync-delimited: the agent answers
with 0xFF followed by our random id, and everything before that marker is
thrown away. Every call has a deadline; a guest that does not answer is a
GuestAgentError naming what was asked.
"""
import base64
from contextlib import closing
import json
import random
import socket
import time


class GuestAgentError(Exception):
    pass


class GuestAgent:
    def __init__(self, path, timeout=10.0):
        self.path = str(path)
        self.timeout = timeout
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.buf = b""
        try:
            self.sock.settimeout(timeout)
            self.sock.connect(self.path)
            self._sync()
        except OSError as e:
            self.close()
            raise GuestAgentError(f"cannot reach the guest agent at {self.path}: {e}")
        except GuestAgentError:
            self.close()
            raise

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

    def _send(self, name, arguments=None):
        msg = {"execute": name}
        if arguments:
            msg["arguments"] = arguments
        self.sock.sendall(json.dumps(msg).encode() + b"\n")

    def _read_reply(self, what, deadline):
        """The next whole JSON object from the agent."""
        decoder = json.JSONDecoder()
        while True:
            text = self.buf.lstrip(b" \t\r\n")
            if text:
                try:
                    obj, end = decoder.raw_decode(text.decode("utf-8", "replace"))
                    self.buf = text.decode("utf-8", "replace")[end:].encode()
                    return obj
                except ValueError:
                    pass  # incomplete: read more
            self._recv(what, deadline)

    def _recv(self, what, deadline):
        left = deadline - time.monotonic()
        if left <= 0:
            raise GuestAgentError(f"guest agent: no answer to {what} within "
                                  f"{self.timeout:.0f} s (is the guest up and "
                                  f"qemu-guest-agent running?)")
        self.sock.settimeout(left)
        try:
            chunk = self.sock.recv(65536)
        except socket.timeout:
            chunk = None
        except OSError as e:
            raise GuestAgentError(f"guest agent: {what}: {e}")
        if chunk == b"":
            raise GuestAgentError(f"guest agent closed the channel during {what}")
        if chunk:
            self.buf += chunk

    def _sync(self):
        """guest-sync-delimited: drop whatever stale bytes precede 0xFF and
        the reply carrying our id."""
        ident = random.randrange(1, 2**31)
        deadline = time.monotonic() + self.timeout
        self._send("guest-sync-delimited", {"id": ident})
        while True:
            marker = self.buf.find(b"\xff")
            if marker >= 0:
                self.buf = self.buf[marker + 1:]
                reply = self._read_reply("guest-sync-delimited", deadline)
                if reply.get("return") == ident:
                    return
                continue  # an older sync's answer: look for the next marker
            self.buf = b""
            self._recv("guest-sync-delimited", deadline)

    def command(self, name, **arguments):
        deadline = time.monotonic() + self.timeout
        self._send(name, arguments)
        reply = self._read_reply(name, deadline)
        if "error" in reply:
            err = reply["error"]
            raise GuestAgentError(f"guest agent: {name}: {err.get('desc', err)}")
        if "return" not in reply:
            raise GuestAgentError(f"guest agent: unexpected reply to {name}: {reply}")
        return reply["return"]

    def exec_start(self, argv):
        """Starts argv in the guest with its output captured; returns the pid."""
        r = self.command("guest-exec", path=argv[0], arg=list(argv[1:]),
                         **{"capture-output": True})
        return r["pid"]

    def exec_status(self, pid):
        """guest-exec-status with the output decoded: {exited, exitcode,
        signal, out, err} (out/err as text)."""
        r = self.command("guest-exec-status", pid=pid)
        return {"exited": r.get("exited", False), "exitcode": r.get("exitcode"),
                "signal": r.get("signal"),
                "out": base64.b64decode(r.get("out-data", "")).decode("utf-8", "replace"),
                "err": base64.b64decode(r.get("err-data", "")).decode("utf-8", "replace")}

    def wait_exec(self, pid, timeout, poll=0.5):
        """Polls first every 20 ms, then less often, up to every `poll` s:
        most commands end within a few hundred ms, and a long one should
        not keep the guest's agent busy answering."""
        deadline = time.monotonic() + timeout
        interval = min(0.02, poll)
        while True:
            s = self.exec_status(pid)
            if s["exited"]:
                return s
            if time.monotonic() >= deadline:
                raise GuestAgentError(f"guest process {pid} still running after {timeout:.0f} s")
            time.sleep(interval)
            interval = min(interval * 2, poll)


def start(path, argv, agent_timeout=10.0):
    """Starts argv in the guest; returns its pid for finish(). The channel
    is closed again, so the guest's agent sits idle while argv runs (a
    benchmark's measurement window must not include the agent's work)."""
    with closing(GuestAgent(path, agent_timeout)) as ga:
        return ga.exec_start(argv)


def finish(path, pid, timeout, agent_timeout=10.0):
    """Waits for a guest process started with start(); returns its status."""
    with closing(GuestAgent(path, agent_timeout)) as ga:
        return ga.wait_exec(pid, timeout)


def run(path, argv, timeout, agent_timeout=10.0):
    """Runs argv in the guest to completion; returns exec_status's dict."""
    return finish(path, start(path, argv, agent_timeout), timeout, agent_timeout)
