"""How `remusdb`'s verbs report: an error on stderr (and the exit status 1
of a failed operation), progress lines while they wait."""
import sys
import time

from .. import protection


def fail(message):
    print(f"remusdb: error: {message}", file=sys.stderr)
    return 1


def show_progress(obj):
    print(f"  {time.strftime('%H:%M:%S')} {protection.describe_progress(obj)}", flush=True)
