"""remusdb-vm start|stop|status NAME --host primary: database VMs in the lab."""
import argparse
import json

from ..lab import netns, vm
from .runner import run


def main():
    parser = argparse.ArgumentParser(prog="remusdb-vm", description=__doc__)
    parser.add_argument("action", choices=["start", "stop", "status"])
    parser.add_argument("name")
    parser.add_argument("--host", default="primary", choices=netns.VM_HOSTS)
    parser.add_argument("--ip", default=vm.DEFAULT_IP, help="guest LAN address")
    parser.add_argument("--mem", type=int, default=1024, help="guest memory in MiB")
    parser.add_argument("--cpus", type=int, default=1,
                        help="guest vCPUs (-smp; multi-threaded TCG without KVM); default 1")
    parser.add_argument("--disk", choices=["nbd", "file"], default="nbd",
                        help="disk through remusdbd's NBD export (default) or the file opened by QEMU")
    parser.add_argument("--net", choices=["relay", "tap"], default="relay",
                        help="NIC through remusdbd's relay (default) or a plain tap")
    parser.add_argument("--plain", action="store_true", help="same as --disk file --net tap (baseline)")
    parser.add_argument("--fresh", action="store_true", help="start from a fresh copy of the guest image")
    parser.add_argument("--no-wait", action="store_true", help="do not wait for PostgreSQL")
    parser.add_argument("--timeout", type=int, default=300, help="seconds to wait for PostgreSQL")
    args = parser.parse_args()
    if args.action == "start":
        disk_via, net_via = ("file", "tap") if args.plain else (args.disk, args.net)
        vm.start(args.name, args.host, ip=args.ip, mem_mb=args.mem, disk_via=disk_via,
                 net_via=net_via, fresh=args.fresh, wait=not args.no_wait,
                 wait_timeout=args.timeout, cpus=args.cpus)
    elif args.action == "stop":
        vm.stop(args.name, args.host)
    else:
        print(json.dumps(vm.status(args.name, args.host), indent=2))


def entry():
    """The `remusdb-vm` command."""
    run(main, "remusdb-vm")


if __name__ == "__main__":
    entry()
