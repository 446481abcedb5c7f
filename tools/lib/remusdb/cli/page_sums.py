"""`remusdb page-sums --of dump|sums PATH` (hidden): what `remusdb
check-image` runs through ssh on a host whose files this machine does
not share. It writes the XXH3-64 of every 4 KiB page of the file there
(a memory dump: hashed there, so gigabytes of guest memory never cross
the network; a backup's checksum file: its 8-byte sums as they are) to
stdout, big-endian, 8 bytes a page, then removes the file with
--remove. Only check-image's own files (rdb-VM-memory.dump,
rdb-VM-backup.sums) are read or removed."""
import re
import struct
import sys
from pathlib import Path

from .. import image_check, remote_verb
from .output import fail

OWN_FILE = {"dump": re.compile(r"^rdb-[A-Za-z0-9_.-]+-memory\.dump$"),
            "sums": re.compile(r"^rdb-[A-Za-z0-9_.-]+-backup\.sums$")}


def page_sums(kind, path):
    """The file's page sums, as check-image compares them."""
    if kind == "dump":
        return image_check.page_sums_of_dump(path)
    return image_check.page_sums_of_backup(path)


def encode(sums):
    return struct.pack(f">{len(sums)}Q", *sums)


def decode(data, host):
    """encode()'s bytes, as received from `host`, back to page sums."""
    if len(data) % 8:
        raise image_check.ImageCheckError(f"remusdb page-sums on {host} sent {len(data)} "
                                          f"bytes, not 8 a page")
    return list(struct.unpack(f">{len(data) // 8}Q", data))


def cmd_page_sums(args):
    path = Path(args.path)
    try:
        remote_verb.check_forwarded(args.forwarded, args.host)
        if not path.is_absolute() or not OWN_FILE[args.of].match(path.name):
            raise image_check.ImageCheckError(f"{path} is not a check-image {args.of} file "
                                              f"(an absolute path named like "
                                              f"{OWN_FILE[args.of].pattern})")
        if not args.only_remove:
            data = encode(page_sums(args.of, path))
            sys.stdout.buffer.write(data)
            sys.stdout.buffer.flush()
        if args.remove or args.only_remove:
            path.unlink(missing_ok=True)
    except (remote_verb.RemoteVerbError, image_check.ImageCheckError, OSError) as e:
        return fail(e)
    return 0


def add_parser(sub):
    # Hidden: no help line in `remusdb --help`; it is for ssh, not people.
    p = sub.add_parser("page-sums", description="The XXH3-64 of every page of check-image's "
                                                "memory dump or backup checksum file on this "
                                                "host, to stdout (what check-image runs here "
                                                "through ssh).")
    p.add_argument("path", metavar="PATH")
    p.add_argument("--of", choices=sorted(OWN_FILE), required=True)
    p.add_argument("--host", required=True, help="this host's name in the cluster file")
    p.add_argument("--remove", action="store_true", help="remove the file afterwards")
    p.add_argument("--only-remove", action="store_true", help="only remove it")
    p.add_argument("--forwarded", type=int, required=True, metavar="N",
                   help="the caller's forwarding protocol")
    p.set_defaults(func=cmd_page_sums)
