"""libvirt's qemu hook: no start of a remusdb domain that etcd says another
host owns (docs/libvirt.md, "The owner hook").

After a failover the old primary's libvirt still has the domain defined,
shut off; `virsh start` or autostart there would run a second, stale
copy next to the one the backup runs. libvirt runs every executable in
/etc/libvirt/hooks/qemu.d/ with `DOMAIN prepare begin -` and the domain's
XML on stdin before it starts a domain, and a non-zero exit refuses the
start, showing the hook's stderr. decide() is that hook's answer:

  - a domain not wired to remusdbd (`remusdb libvirt-wire`) cannot be
    protected: allowed at once, etcd is not asked;
  - a wired domain: etcd's /remusdb/vms/DOMAIN/owner is read. No key, or
    this host named: allowed. Another host named: refused, naming it.
  - etcd cannot be asked within the time (--etcd-timeout-ms of remusdbd's
    config, at most MAX_TIMEOUT_MS, so that libvirt is never held long):
    refused. A wired domain is one that may have been taken over; not
    knowing is treated as remusdbd treats it (a backup never takes over
    and a primary pauses without etcd's word): a start that waits for
    etcd is better than a second copy.

"This host" and etcd come from remusdbd's config file, the one
remusdbd@HOST reads, /etc/remusdb/HOST.conf: its `etcd` and
`etcd-timeout-ms` keys, and its `host` key or else the file's name (the
unit's instance name is the host's name). With no --config, the hook
takes the one *.conf in /etc/remusdb; none or several make a wired domain's
start refused, saying to name one (--config in the hook script).

etcd is asked through its v3 JSON gateway (POST /v3/kv/range, a
linearizable read), as remusdbd asks it, endpoints in order, each given
an equal share of the time left; proxies are ignored."""
import base64
import json
from pathlib import Path
import time
import urllib.error
import urllib.request
import xml.etree.ElementTree as ET

CONFIG_DIR = Path("/etc/remusdb")
DEFAULT_TIMEOUT_MS = 1000   # remusdbd's --etcd-timeout-ms default
MAX_TIMEOUT_MS = 5000       # libvirt waits for the hook while it holds the domain's job
QEMU_NS = "http://libvirt.org/schemas/domain/qemu/1.0"
# The chardev of remusdbd's own QMP monitor that `remusdb libvirt-wire`
# puts in <qemu:commandline> (libvirt.commandline_args).
DAEMON_QMP_CHARDEV_ID = "rdbqmp"


class HookConfigError(Exception):
    pass


def owner_key(domain):
    return f"/remusdb/vms/{domain}/owner"


def read_config(path):
    """remusdbd's `key = value` file ('#' comment lines, optional double
    quotes): the keys the hook uses, with the host defaulting to the
    file's name as remusdbd@HOST's unit sets it."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise HookConfigError(f"cannot read remusdbd's config {path}: {e.strerror}")
    values = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] == '"':
            value = value[1:-1]
        values[key.strip()] = value
    host = values.get("host") or Path(path).stem
    endpoints = [e.strip() for e in values.get("etcd", "").split(",") if e.strip()]
    if not endpoints:
        raise HookConfigError(f"{path} names no etcd (its `etcd` key)")
    try:
        timeout_ms = int(values.get("etcd-timeout-ms") or DEFAULT_TIMEOUT_MS)
    except ValueError:
        raise HookConfigError(f"{path}: etcd-timeout-ms is not a number")
    return {"path": str(path), "host": host, "endpoints": endpoints,
            "timeout_ms": max(1, min(timeout_ms, MAX_TIMEOUT_MS))}


def find_config(config_dir=CONFIG_DIR):
    found = sorted(Path(config_dir).glob("*.conf"))
    if len(found) != 1:
        what = ", ".join(p.name for p in found) if found else "none"
        raise HookConfigError(f"cannot tell this host's remusdbd: {len(found)} configs in "
                              f"{config_dir} ({what}); name one with --config in the hook "
                              f"script")
    return found[0]


def wired_to_remusdbd(root, domain):
    """The domain's XML as `remusdb libvirt-wire` leaves it: its disk is
    remusdbd's NBD export of that name, or remusdbd's QMP monitor is on
    its command line."""
    for src in root.iterfind("devices/disk/source"):
        if src.get("protocol") == "nbd" and src.get("name") == domain:
            return True
    for arg in root.iterfind(f"{{{QEMU_NS}}}commandline/{{{QEMU_NS}}}arg"):
        if f"id={DAEMON_QMP_CHARDEV_ID}," in (arg.get("value") or ""):
            return True
    return False


def _range(endpoint, key, timeout_s):
    body = json.dumps({"key": base64.b64encode(key.encode()).decode()}).encode()
    request = urllib.request.Request(endpoint.rstrip("/") + "/v3/kv/range", data=body,
                                     headers={"Content-Type": "application/json"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(request, timeout=timeout_s) as reply:
        return json.loads(reply.read())


def read_owner(endpoints, domain, timeout_ms):
    """{"owner", "generation"} or None (no key). Raises OSError naming
    every endpoint's failure when none answered in time."""
    deadline = time.monotonic() + timeout_ms / 1000
    failures = []
    for i, endpoint in enumerate(endpoints):
        left = deadline - time.monotonic()
        if left <= 0:
            failures.append(f"{endpoint}: no time left")
            continue
        try:
            reply = _range(endpoint, owner_key(domain), left / (len(endpoints) - i))
        except urllib.error.HTTPError as e:  # an etcd error answer: the next endpoint
            failures.append(f"{endpoint}: HTTP {e.code} {e.reason}")
            continue
        except (OSError, ValueError) as e:  # URLError is an OSError
            failures.append(f"{endpoint}: {getattr(e, 'reason', None) or e}")
            continue
        kvs = reply.get("kvs") or []
        if not kvs:
            return None
        text = base64.b64decode(kvs[0].get("value", "")).decode("utf-8", "replace")
        try:
            value = json.loads(text)
            return {"owner": str(value["owner"]), "generation": int(value["generation"])}
        except (ValueError, KeyError, TypeError):
            return {"owner": None, "raw": text}
    raise OSError("; ".join(failures))


def decide(domain, operation, sub_operation, xml_text, config_path=None, host=None,
           config_dir=CONFIG_DIR):
    """None: allowed; else the one line that refuses the start."""
    if (operation, sub_operation) != ("prepare", "begin"):
        return None
    try:
        root = ET.fromstring(xml_text)
    except ET.ParseError:
        return None  # libvirt always sends its XML; without one nothing says it is ours
    if not wired_to_remusdbd(root, domain):
        return None
    refusing = f"refusing to start {domain}, a domain wired to remusdbd"
    try:
        cfg = read_config(config_path or find_config(config_dir))
    except HookConfigError as e:
        return f"{refusing}: {e}"
    me = host or cfg["host"]
    try:
        rec = read_owner(cfg["endpoints"], domain, cfg["timeout_ms"])
    except OSError as e:
        return (f"{refusing}: etcd could not be asked within {cfg['timeout_ms']} ms ({e}), so "
                f"nothing says whether another host took it over; start it once etcd "
                f"answers")
    if rec is None or rec["owner"] == me:
        return None
    if rec["owner"] is None:
        return (f"{refusing}: etcd's {owner_key(domain)} is not remusdbd's "
                f"({rec['raw'][:60]!r}); `remusdb owner show {domain}`")
    return (f"{refusing}: etcd says host {rec['owner']} owns it (generation "
            f"{rec['generation']}), not {me}: it runs there since a takeover; to run it "
            f"here, protect it from {rec['owner']} to {me} and fail over, or, if "
            f"{rec['owner']} no longer runs it, `remusdb owner retire {domain} --host {me}`")
