"""Progress lines of the remusdb tools, one helper for all of them:
"[prefix] message", each tool or module with its own prefix, flushed at
once so that a line lands in order with the output of the programs the
tool runs. (How the `remusdb` verbs report an error is cli/output.py's.)"""
import sys


def say(prefix, msg, err=False):
    """One progress line "[prefix] msg" on stdout, or on stderr with
    err=True (the tools whose stdout is their result)."""
    print(f"[{prefix}] {msg}", file=sys.stderr if err else sys.stdout, flush=True)
