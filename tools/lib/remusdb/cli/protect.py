"""`remusdb protect`: start Remus protection of a running VM to a backup
host and wait until it is protected; the protection file (--config)
fills what the command line leaves out."""
import sys
import time

from .. import protect_config, protection
from ..protection import ProtectionError
from .arguments import add_host, host_or_default, interval_ms, positive_int
from .output import fail, show_progress

# `protect` options a protection file (--config) can set, and their
# defaults; the host's is the cluster file's default_host.
PROTECT_DEFAULTS = {"host": None, "interval": 100, "timeout": 600, "cp_dscp": 47,
                    "compress": True, "read_tracking": True, "commit_protection": False}
DAEMON_SETTINGS = ("key_file", "etcd", "fence_command")


def resolve_protect_args(args):
    """Fills args from the protection file (--config), where the command
    line left them unset, then from the defaults. Returns the daemon
    settings the file names (key_file, etcd, fence_command)."""
    conf = protect_config.load(args.config) if args.config else {}
    if args.vm and conf.get("vm") and args.vm != conf["vm"]:
        raise protect_config.ConfigError(
            [f"{args.config} is the protection file of VM {conf['vm']!r}, not {args.vm!r}: "
             f"give the file of {args.vm} or leave the VM name out"])
    args.vm = args.vm or conf.get("vm")
    if not args.vm:
        raise protect_config.ConfigError(["no VM named: give `remusdb protect VM` or "
                                          "`vm:` in the --config file"])
    if not args.backup:
        args.backup = conf.get("backup")
        if not args.backup:
            raise protect_config.ConfigError(["no backup named: give --backup HOST[:PORT] "
                                              "or `backup:` in the --config file"])
    for key in ("host", "interval", "timeout", "cp_dscp"):
        if getattr(args, key) is None:
            setattr(args, key, conf.get(key, PROTECT_DEFAULTS[key]))
    # The store_true flags only ever turn something off (or on, for commit
    # protection): given, they win; absent, the file decides.
    args.no_compress = args.no_compress or not conf.get("compress", True)
    args.no_read_tracking = args.no_read_tracking or not conf.get("read_tracking", True)
    args.commit_protection = args.commit_protection or conf.get("commit_protection", False)
    return {k: conf[k] for k in DAEMON_SETTINGS if k in conf}


def check_daemon_settings(settings, hosts):
    """The protection file's key, witness and fence command against what
    each running remusdbd reports (ping); ProtectionError listing each
    difference. hosts: [(host, is_backup)]."""
    problems = []
    for host, is_backup in hosts:
        reply = protection.request(host, "ping")
        problems += protect_config.daemon_mismatches(reply.get("settings"), settings, host,
                                                     check_fence=is_backup)
    if problems:
        raise ProtectionError("\n".join(problems))


def cmd_protect(args):
    try:
        settings = resolve_protect_args(args)
    except protect_config.ConfigError as e:
        for line in e.problems:
            print(f"remusdb: error: {line}", file=sys.stderr)
        return 2
    try:  # what the operator can fix before any daemon is touched
        protection.check_interval(args.interval)
        args.host = host_or_default(args.host)
        backup = protection.parse_backup(args.backup)
        backup_host = protection.host_of(backup)
        if backup_host == args.host:
            return fail(f"the backup {backup} is {args.host} itself: pick another host")
        libvirt_uris = None
        if args.libvirt:
            libvirt_uris = (args.libvirt, args.backup_libvirt or args.libvirt)
            protection.libvirt_meta(args.host, args.vm, *libvirt_uris)
        else:
            protection.vm_meta(args.host, args.vm)
    except ProtectionError as e:
        return fail(e)
    try:
        # The backup's remusdbd runs as a service of its host (remusdbd@.service);
        # protect only asks it, through its control access.
        if settings:
            check_daemon_settings(settings, [(args.host, False)]
                                  + ([(backup_host, True)] if backup_host else []))
        output_commit = not args.unsafe_no_output_commit
        if not output_commit:
            print("WARNING: output commit is OFF: the VM's network output is released "
                  "before the backup has its checkpoint; acknowledged commits can be lost "
                  "on failover. This is a negative control for drills, never for real use.",
                  file=sys.stderr)
        started = time.monotonic()
        options = {}
        if args.no_compress:
            options["compress"] = False
        if args.no_read_tracking:
            options["read_tracking"] = False
        if args.commit_protection:
            options["commit_protection"] = True
            options["cp_dscp"] = args.cp_dscp
        if args.full_copy:
            options["full_copy"] = True
        p = protection.protect(args.vm, backup, args.interval, host=args.host,
                               output_commit=output_commit, options=options,
                               libvirt_uris=libvirt_uris)
        print(f"protecting {args.vm} on {args.host} to {backup} every {args.interval} ms "
              f"(now {p.get('state', '?')})", flush=True)
        p = protection.wait_protected(args.vm, args.host, args.timeout, progress=show_progress)
    except ProtectionError as e:
        return fail(f"{e}\n  (`tools/remusdb status` shows both hosts; "
                    f"`tools/remusdb unprotect {args.vm}` stops a protection in progress)")
    except KeyboardInterrupt:
        return fail(f"interrupted; remusdbd goes on protecting {args.vm} "
                    f"(`tools/remusdb unprotect {args.vm}` stops it)")
    print(f"{args.vm} is protected by {p.get('peer', backup)}: epoch {p.get('epoch', 0)}, "
          f"{time.monotonic() - started:.1f} s")
    copy = p.get("disk_copy") or {}
    if copy:
        print(f"  disk: {copy.get('mode')} copy, {copy.get('bytes_sent', 0) / 2**20:.1f} MiB "
              f"of {copy.get('extents', 0)} extents of 1 MiB ({copy.get('reason', '')})")
    return 0


def add_parser(sub):
    p = sub.add_parser("protect",
                       description="Checkpoint a running VM to a backup host every --interval "
                                   "ms; waits until it is protected (initial disk and memory "
                                   "copy done). Exit 0 when protected.")
    p.add_argument("vm", metavar="VM", nargs="?",
                   help="the VM's name (optional with --config: the file's `vm:`)")
    p.add_argument("--config", metavar="FILE",
                   help="the VM's protection file (YAML: vm, host, backup, interval, "
                        "timeout, key_file, fence_command, etcd, compress, read_tracking, "
                        "commit_protection, cp_dscp; docs/operations.md); options given "
                        "here override it")
    p.add_argument("--backup", metavar="HOST[:PORT]",
                   help=f"a host of the cluster file (its replication address), an "
                        f"IP address or a DNS name (resolved here: remusdbd takes IPv4); "
                        f"port {protection.DEFAULT_PORT} or the host's by default "
                        f"(required, here or in --config)")
    p.add_argument("--interval", type=interval_ms, metavar="MS",
                   help="checkpoint interval, 25..500 ms (default 100)")
    add_host(p, "the host the VM runs on", "default: the cluster's default_host")
    p.add_argument("--timeout", type=positive_int, metavar="S",
                   help="seconds to wait for the state 'protected' (default 600)")
    p.add_argument("--no-compress", action="store_true",
                   help="send dirty pages whole (no XOR+RLE/LZ4 checkpoint compression)")
    p.add_argument("--no-read-tracking", action="store_true",
                   help="do not send pages that equal disk blocks the guest read as references")
    p.add_argument("--commit-protection", action="store_true",
                   help="hold only the output the guest's remusdb_cp module marked (commit "
                        "acknowledgements of a patched DBMS) and, behind it, the rest of its "
                        "connection; everything else leaves at once (default: Remus, all "
                        "output waits for its checkpoint)")
    p.add_argument("--cp-dscp", type=int, metavar="N",
                   help="the guest module's DSCP mark (its dscp parameter, default 47)")
    p.add_argument("--full-copy", action="store_true",
                   help="copy the whole disk even where the backup holds an older copy of "
                        "the same generation that a resync of changed blocks would update "
                        "(a failback; docs/operations.md)")
    p.add_argument("--unsafe-no-output-commit", action="store_true",
                   help="DEBUG negative control: release the VM's network output at once "
                        "instead of after the backup acknowledged its checkpoint; a failover "
                        "can then lose acknowledged commits")
    p.add_argument("--libvirt", metavar="URI",
                   help="VM is a libvirt domain (wired by `remusdb libvirt-wire`) on this "
                        "libvirt; the backup takes it over through its own libvirt")
    p.add_argument("--backup-libvirt", metavar="URI",
                   help="the backup host's libvirt URI (default: the same as --libvirt)")
    p.set_defaults(func=cmd_protect)
