"""`remusdb control-relay --socket PATH` (hidden): what `ssh HOST remusdb
control-relay` runs on a host of the cluster for a CLI elsewhere. One
request line from stdin to this host's remusdbd control socket, its one
response line to stdout, then exit: the relay understands nothing of
the request, so a newer daemon's commands pass unchanged. Errors that
leave no response (no daemon here) are answered as the daemon would,
{"ok": false, "error": ...}, so the far side reports them like any
refusal, naming this host."""
import json
import socket as socket_module
import sys

from .. import control


def relay(socket_path, stdin, stdout, timeout):
    line = stdin.readline(control.MAX_LINE + 1)
    if not line.endswith(b"\n"):
        answer = {"ok": False, "error": "control-relay: no request line on stdin"
                  if not line else f"control-relay: a request longer than {control.MAX_LINE} "
                                   f"bytes"}
    else:
        try:
            data = control.exchange(socket_path, line, timeout)
            if data:
                stdout.write(data if data.endswith(b"\n") else data + b"\n")
                stdout.flush()
                return 0
            answer = {"ok": False,
                      "error": "remusdbd closed the control connection without answering"}
        except control.ControlError as e:
            answer = {"ok": False, "error": f"{e} on {socket_module.gethostname()}"}
    stdout.write(json.dumps(answer).encode() + b"\n")
    stdout.flush()
    return 0


def cmd_control_relay(args):
    return relay(args.socket, sys.stdin.buffer, sys.stdout.buffer, args.timeout)


def add_parser(sub):
    # Hidden: no help line in `remusdb --help`; it is for ssh, not people.
    p = sub.add_parser("control-relay",
                       description="One control request from stdin to this host's "
                                   "remusdbd and its response to stdout (what the CLI "
                                   "runs here through ssh; docs/operations.md).")
    p.add_argument("--socket", required=True, metavar="PATH",
                   help="the control socket of this host's remusdbd")
    p.add_argument("--timeout", type=float, default=10.0, metavar="S",
                   help="seconds to wait for remusdbd's response (default 10)")
    p.set_defaults(func=cmd_control_relay)
