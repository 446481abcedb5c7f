"""The command line that the daemon's tree checks share
(check_layering.py, check_file_table.py):

  SCRIPT [PATH ...]   run the check on the paths given, the defaults for
                      those not given; exit 1 when it fails
  SCRIPT --self-test  run the check's negative controls; exit 1 when one
                      is missed

Imported from the scripts' own folder, which Python puts on the path of a
script it runs.
"""
import sys


def run(check, self_test, defaults, argv=None):
    """The exit status of one command line: check(*paths) and self_test()
    return True when they pass; defaults fills the paths argv leaves out
    (arguments beyond them are ignored)."""
    argv = sys.argv if argv is None else argv
    if argv[1:] == ["--self-test"]:
        return 0 if self_test() else 1
    given = argv[1:1 + len(defaults)]
    paths = list(given) + list(defaults[len(given):])
    return 0 if check(*paths) else 1
