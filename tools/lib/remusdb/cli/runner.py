"""How every command-line tool ends: one line per error, never a
traceback. An error this project raises says what to do in its own
message; anything else is a bug, reported in one line with where it
happened (REMUSDB_DEBUG=1 shows the whole traceback)."""
import os
import subprocess
import sys
import traceback


def _one_line(text):
    return " ".join(str(text).split()) or "(no message)"


def _expected(e):
    from .. import control, qmp
    known = (control.ControlError, qmp.QMPError, OSError, subprocess.CalledProcessError,
             subprocess.TimeoutExpired)
    if isinstance(e, known):
        return True
    # The libraries' own error classes: ForkError, DrillError, ProtectionError...
    return type(e).__module__.startswith("remusdb.") and type(e).__name__.endswith("Error")


def run(main, prog):
    try:
        main()
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        sys.exit(130)
    except SystemExit as e:
        if isinstance(e.code, str):  # a message: one line, named
            line = _one_line(e.code)
            print(line if line.startswith(f"{prog}:") else f"{prog}: {line}", file=sys.stderr)
            sys.exit(1)
        raise
    except Exception as e:  # noqa: BLE001 -- the last line of defence
        if os.environ.get("REMUSDB_DEBUG"):
            raise
        if _expected(e):
            print(f"{prog}: error: {_one_line(e)}", file=sys.stderr)
        else:
            where = traceback.extract_tb(e.__traceback__)[-1]
            print(f"{prog}: internal error: {type(e).__name__}: {_one_line(e)} (at "
                  f"{os.path.basename(where.filename)}:{where.lineno}); rerun with "
                  f"REMUSDB_DEBUG=1 for the traceback and report it", file=sys.stderr)
        sys.exit(1)
