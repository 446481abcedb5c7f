"""What `remusdb`'s verbs accept on their command lines: the VM hosts, and
the argparse types of positive numbers and checkpoint intervals."""
import argparse

from .. import protection


VM_HOSTS = protection.vm_hosts()


def positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} must be positive")
    return value


def interval_ms(text):
    value = positive_int(text)
    lo, hi = protection.INTERVAL_MS_RANGE
    if not lo <= value <= hi:
        raise argparse.ArgumentTypeError(f"{value} ms is out of range: use {lo}..{hi}")
    return value
