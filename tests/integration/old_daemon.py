"""The remusdbd of an earlier commit, built from the repository's history,
for tests of version skew (test_version_skew.py): a daemon of this tree
must keep replicating with the release before it.

    /usr/bin/python3 tests/integration/old_daemon.py [COMMIT]

prints the path of that commit's remusdbd (PREVIOUS_RELEASE by default),
building it first when it is not cached: `git archive COMMIT dom0-daemon`
unpacked into a directory of its own and built there with its own
Makefile. The cache is keyed by the full commit id, under
$REMUSDB_OLD_DAEMONS (default $REMUSDB_CACHE/old-daemons, beside the
project's other cached builds, so that it outlives /tmp); concurrent
callers wait for one build under a lock. It needs the commit in the
repository, which a fresh clone has (the full history)."""
import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# The last release before the protocol's version was negotiated: it speaks
# replication protocol 1 only and answers any other HELLO with ERROR(1).
PREVIOUS_RELEASE = "da66a9f"


def cache_root():
    # The cache's default is remusdb.paths.CACHE's (this script runs
    # without tools/lib on its path).
    cache = os.environ.get("REMUSDB_CACHE") or "/var/cache/remusdb"
    return Path(os.environ.get("REMUSDB_OLD_DAEMONS") or Path(cache) / "old-daemons")


def resolve(commit, repo=REPO):
    """The full id of commit, or SystemExit with one line saying why not."""
    r = subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", "--quiet",
                        f"{commit}^{{commit}}"], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"commit {commit} is not in the repository at {repo} "
                         "(a shallow clone? fetch the full history)")
    return r.stdout.strip()


def _unpack(full, repo, into):
    """git archive FULL dom0-daemon | tar -x -C into, failing on either side."""
    archive = subprocess.Popen(["git", "-C", str(repo), "archive", full, "dom0-daemon"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    tar = subprocess.run(["tar", "-x", "-C", str(into)], stdin=archive.stdout,
                         capture_output=True, text=True)
    archive.stdout.close()
    err = archive.stderr.read().decode(errors="replace")
    if archive.wait() != 0 or tar.returncode != 0:
        raise SystemExit(f"cannot unpack dom0-daemon of {full}: {err.strip()} "
                         f"{tar.stderr.strip()}")


def build(commit=PREVIOUS_RELEASE, repo=REPO):
    """The path of commit's remusdbd, built once and cached."""
    full = resolve(commit, repo)
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    binary = root / full / "remusdbd"
    if os.access(binary, os.X_OK):
        return binary
    with open(root / f"{full}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.access(binary, os.X_OK):
            return binary  # built by whoever held the lock
        work = Path(tempfile.mkdtemp(dir=root, prefix=f"{full}.build."))
        try:
            _unpack(full, repo, work)
            r = subprocess.run(["make", "-s", "-C", str(work / "dom0-daemon"),
                                "build/remusdbd"], capture_output=True, text=True)
            if r.returncode != 0:
                raise SystemExit(f"building remusdbd of {full} failed:\n"
                                 f"{(r.stdout + r.stderr)[-3000:]}")
            staged = work / "out"
            staged.mkdir()
            shutil.copy2(work / "dom0-daemon" / "build" / "remusdbd", staged / "remusdbd")
            # The entry appears whole or not at all.
            os.replace(staged, root / full)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return binary


if __name__ == "__main__":
    print(build(sys.argv[1] if len(sys.argv) > 1 else PREVIOUS_RELEASE))
