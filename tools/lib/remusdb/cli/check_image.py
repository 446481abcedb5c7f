"""`remusdb check-image`: does the backup's image equal the guest's memory
at a checkpoint? (remusdb.image_check does the work.)

The primary's QEMU writes the memory dump on the primary host, the
backup's remusdbd the checksums on the backup host; a host reached
through ssh hashes its file there (`remusdb page-sums`, run through ssh
as control-relay is) and sends 8 bytes a page, so any two hosts of the
cluster can be checked from any host. The verb is not forwarded whole:
it needs one file from each of two hosts, which may not share files
with each other either."""
from pathlib import Path
import sys

from .. import image_check, protection, remote_verb
from ..protection import ProtectionError
from . import page_sums
from .arguments import add_host, host_or_default
from .output import fail


def peer_host(args):
    """The cluster host the VM's protection checkpoints to."""
    p = protection.primary_protection(args.host, args.vm) or {}
    host = protection.host_of(p.get("peer") or "")
    if not host:
        raise ProtectionError(f"{args.vm} on {args.host} is not protected to a host of the "
                              f"cluster file (peer {p.get('peer') or 'none'}): give --backup")
    return host


def page_sums_on(host, path, kind, remove):
    """The page sums of check-image's `kind` file ("dump" or "sums") at
    `path` on `host`: read here for a host whose files this machine
    shares, else hashed there through ssh (remusdb page-sums)."""
    if protection.access(host).via == "local":
        return page_sums.page_sums(kind, path)
    data = remote_verb.capture(host, "page-sums", str(path), *page_sums_args(host, kind, remove))
    return page_sums.decode(data, host)


def page_sums_args(host, kind, remove=False, only_remove=False):
    """page-sums' options after its PATH (what ssh runs on `host`)."""
    return ["--of", kind, "--host", host, *(["--remove"] if remove else []),
            *(["--only-remove"] if only_remove else [])]


def remove_files(files, done, error=None):
    """Removes check-image's files that are still there, wherever they
    are. A file that cannot be removed is named on a line of its own,
    unless for the cause the verb's error already gave (ssh refusing
    that host, say)."""
    for host, path, kind in files:
        if (host, path) in done:
            continue
        try:
            if protection.access(host).via == "local":
                path.unlink(missing_ok=True)
            else:
                remote_verb.capture(host, "page-sums", str(path),
                                    *page_sums_args(host, kind, only_remove=True))
        except (ProtectionError, remote_verb.RemoteVerbError, OSError) as e:
            if error is None or str(e) not in str(error):
                print(f"remusdb: warning: {path} may be left on {host}: {e}", file=sys.stderr)


def cmd_check_image(args):
    directory = Path(args.dir).absolute()  # read on each host as it is written here
    dump = directory / f"rdb-{args.vm}-memory.dump"
    sums = directory / f"rdb-{args.vm}-backup.sums"
    files, done, error = [], set(), None
    try:
        args.host = host_or_default(args.host)
        args.backup = host_or_default(args.backup) if args.backup else peer_host(args)
        size = image_check.guest_memory_bytes(protection.vm_meta(args.host, args.vm)["command"])
        files = [(args.host, dump, "dump"), (args.backup, sums, "sums")]  # written from here on
        held = image_check.capture(args.vm, dump, sums, size, primary=args.host,
                                   backup=args.backup)
        found = {}
        for host, path, kind in files:
            found[kind] = page_sums_on(host, path, kind, remove=not args.keep)
            if not args.keep and protection.access(host).via != "local":
                done.add((host, path))  # page-sums --remove took it there
        differ = image_check.differing_pages(found["dump"], found["sums"])
    except (ProtectionError, image_check.ImageCheckError, remote_verb.RemoteVerbError,
            OSError) as e:
        error = e
    if not args.keep:
        remove_files(files, done, error)
    if error is not None:
        return fail(error)
    print(f"{args.vm}: checkpoint {held['epoch']} (VM held {held['held_s']:.1f} s): "
          f"{held['pages'] - len(differ)} of {held['pages']} pages of pc.ram equal on the "
          f"backup, {len(differ)} differ" + (f" (first: {differ[:8]})" if differ else ""))
    return 0 if not differ else 1


def add_parser(sub):
    p = sub.add_parser("check-image",
                       description="Holds the protected VM paused at its next checkpoint, "
                                   "dumps its memory, and compares the XXH3-64 of every page "
                                   "with the backup's image of that checkpoint (the VM "
                                   "resumes as soon as both are on disk). Either host may be "
                                   "reached through ssh: it hashes its own file there. Exit 0 "
                                   "when every page is equal, 1 otherwise.")
    p.add_argument("vm", metavar="VM", help="the VM's name")
    add_host(p, "the host the VM runs on", "default: the cluster's default_host")
    p.add_argument("--backup", metavar="HOST",
                   help="the backup host, of the cluster file (default: the one the VM's "
                        "protection checkpoints to)")
    p.add_argument("--dir", default="/dev/shm",
                   help="where the memory dump and the checksums go, on each host (default "
                        "/dev/shm)")
    p.add_argument("--keep", action="store_true", help="keep them afterwards")
    p.set_defaults(func=cmd_check_image)
