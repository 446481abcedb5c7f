"""`remusdb check-image`: does the backup's image equal the guest's memory
at a checkpoint? (remusdb.image_check does the work.)"""
from pathlib import Path

from .. import image_check, protection
from ..protection import ProtectionError
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


def cmd_check_image(args):
    dump = Path(args.dir) / f"rdb-{args.vm}-memory.dump"
    sums = Path(args.dir) / f"rdb-{args.vm}-backup.sums"
    try:
        args.host = host_or_default(args.host)
        args.backup = host_or_default(args.backup) if args.backup else peer_host(args)
        for host in (args.host, args.backup):
            if protection.access(host).via != "local":
                raise ProtectionError(f"{host} is reached through ssh: check-image compares "
                                      f"files both hosts write, so both must share this "
                                      f"machine's files (control via local); run it there")
        size = image_check.guest_memory_bytes(protection.vm_meta(args.host, args.vm)["command"])
        held = image_check.capture(args.vm, dump, sums, size, primary=args.host,
                                   backup=args.backup)
        differ = image_check.differing_pages(image_check.page_sums_of_dump(dump),
                                             image_check.page_sums_of_backup(sums))
    except (ProtectionError, image_check.ImageCheckError, OSError) as e:
        return fail(e)
    finally:
        if not args.keep:
            for f in (dump, sums):
                f.unlink(missing_ok=True)
    print(f"{args.vm}: checkpoint {held['epoch']} (VM held {held['held_s']:.1f} s): "
          f"{held['pages'] - len(differ)} of {held['pages']} pages of pc.ram equal on the "
          f"backup, {len(differ)} differ" + (f" (first: {differ[:8]})" if differ else ""))
    return 0 if not differ else 1


def add_parser(sub):
    p = sub.add_parser("check-image",
                       description="Holds the protected VM paused at its next checkpoint, "
                                   "dumps its memory, and compares the XXH3-64 of every page "
                                   "with the backup's image of that checkpoint (the VM "
                                   "resumes as soon as both are on disk). Exit 0 when every "
                                   "page is equal, 1 otherwise.")
    p.add_argument("vm", metavar="VM", help="the VM's name")
    add_host(p, "the host the VM runs on", "default: the cluster's default_host")
    p.add_argument("--backup", metavar="HOST",
                   help="the backup host, of the cluster file (default: the one the VM's "
                        "protection checkpoints to)")
    p.add_argument("--dir", default="/dev/shm",
                   help="where the memory dump and the checksums go (default /dev/shm)")
    p.add_argument("--keep", action="store_true", help="keep them afterwards")
    p.set_defaults(func=cmd_check_image)
