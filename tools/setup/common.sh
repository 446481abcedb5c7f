# Shared settings for the setup scripts. Sourced, not executed.
# Everything built or downloaded lives in a cache outside the repository so
# that a second `make setup` takes seconds and a fresh clone stays small.
set -euo pipefail
REMUSDB_CACHE=${REMUSDB_CACHE:-/var/cache/remusdb}
REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
mkdir -p "$REMUSDB_CACHE"
# Each line carries the seconds since its script started, so a cold setup's
# log shows what the package install, the QEMU build and the image cost.
log() { printf '[setup %4ds] %s\n' "$SECONDS" "$*" >&2; }
die() { printf '[setup] error: %s\n' "$*" >&2; exit 1; }
