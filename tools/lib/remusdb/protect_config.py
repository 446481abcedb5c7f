"""A VM's protection settings in one YAML file, the way Patroni keeps one
file per cluster member: `remusdb protect --config /etc/remusdb/vms/db.yml`.

    vm: db                      # the VM the file is for
    host: primary               # where it runs
    backup: backup:7788         # HOST[:PORT] of the backup's remusdbd
    interval: 100               # checkpoint interval, ms (25..500)
    timeout: 600                # seconds `protect` waits for "protected"
    key_file: /etc/remusdb/psk              # the key both daemons hold
    fence_command: /usr/local/sbin/fence-db-primary  # the backup's, before a takeover
    etcd: [http://192.0.2.5:2379]           # the witness both daemons use
    compress: true              # checkpoint compression (ASC)
    read_tracking: true         # disk read tracking (RT)
    commit_protection: false
    cp_dscp: 47

Every key is optional; a flag given on the command line wins over the
file. key_file, fence_command and etcd are settings of the two remusdbd
daemons (their --psk-file, --fence-command, --etcd): `protect` checks
each running daemon against them (ping's "settings") instead of
protecting with a witness or key other than the file says.

load() reports every problem at once, one line each:
"FILE: key 'intervall' is unknown (did you mean 'interval'?)".
"""
import difflib
import os
import re
import stat

DSCP_RANGE = (0, 63)
PSK_MIN, PSK_MAX = 16, 1024    # repl_auth.h: REPL_PSK_MIN, REPL_PSK_MAX
ETCD_URL = re.compile(r"^https?://[A-Za-z0-9.\-\[\]:]+:\d{1,5}/?$")


class ConfigError(Exception):
    """`problems` holds one line per problem, each naming the file."""

    def __init__(self, problems):
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


def _check_int(value, lo, hi, unit=""):
    if isinstance(value, bool) or not isinstance(value, int):
        return f"must be a whole number, not {value!r}"
    if not lo <= value <= hi:
        return f"{value}{unit} is out of range: use {lo}..{hi}{unit}"
    return None


def _interval(value):
    from .protection import INTERVAL_MS_RANGE
    return _check_int(value, *INTERVAL_MS_RANGE, " ms")


def _timeout(value):
    return _check_int(value, 1, 86400, " s")


def _dscp(value):
    return _check_int(value, *DSCP_RANGE)


def _bool(value):
    if not isinstance(value, bool):
        return f"must be true or false, not {value!r}"
    return None


def _name(value):
    if not isinstance(value, str) or not value:
        return f"must be a VM name, not {value!r}"
    from .protection import ProtectionError, check_vm_name
    try:
        check_vm_name(value)
    except ProtectionError as e:
        return str(e)
    return None


def _host(value):
    """A host's name; that the cluster file has it is checked when
    `protect` runs, against the file it runs with."""
    from .cluster import HOST_NAME
    if not isinstance(value, str) or not HOST_NAME.match(value):
        return f"{value!r} is not a host name (letters, digits, '.', '-', '_')"
    return None


def _backup(value):
    """HOST[:PORT] as written; nothing is looked up here (the file is
    checked before anything is asked of the network)."""
    from .protection import backup_syntax_problem
    return backup_syntax_problem(value)


def _key_file(value):
    """What remusdbd's repl_psk_load would refuse, said before any daemon is asked."""
    if not isinstance(value, str) or not value:
        return f"must be a file name, not {value!r}"
    try:
        st = os.stat(value)
    except OSError as e:
        return f"{value}: {e.strerror}"
    if not stat.S_ISREG(st.st_mode):
        return f"{value} is not a regular file"
    if st.st_mode & 0o077:
        return f"{value} is accessible by group or others (mode {st.st_mode & 0o7777:04o}): run chmod 600 {value}"
    try:
        key = key_bytes(value)
    except OSError as e:
        return f"{value}: {e.strerror}"
    if not PSK_MIN <= len(key) <= PSK_MAX:
        return f"the key in {value} is {len(key)} bytes; use {PSK_MIN}..{PSK_MAX}"
    return None


def _fence(value):
    if not isinstance(value, str) or not value.strip():
        return f"must be a shell command, not {value!r}"
    return None


def _etcd(value):
    urls = etcd_urls(value)
    if urls is None:
        return f"must be a URL, a comma-separated string of them or a list, not {value!r}"
    if not urls:
        return "names no endpoint"
    bad = [u for u in urls if not ETCD_URL.match(u)]
    if bad:
        return f"{bad[0]!r} is not an etcd client URL like http://192.0.2.5:2379"
    return None


KEYS = {
    "vm": _name,
    "host": _host,
    "backup": _backup,
    "interval": _interval,
    "timeout": _timeout,
    "key_file": _key_file,
    "fence_command": _fence,
    "etcd": _etcd,
    "compress": _bool,
    "read_tracking": _bool,
    "commit_protection": _bool,
    "cp_dscp": _dscp,
}


def etcd_urls(value):
    """"a,b" or ["a", "b"] -> ["a", "b"]; None when it is neither."""
    if isinstance(value, str):
        return [u.strip() for u in value.split(",") if u.strip()]
    if isinstance(value, list) and all(isinstance(u, str) for u in value):
        return [u.strip() for u in value if u.strip()]
    return None


def key_bytes(path):
    """The key as remusdbd reads it: the file's bytes without one final
    newline (or CRLF)."""
    with open(path, "rb") as f:
        data = f.read(PSK_MAX + 3)
    if data.endswith(b"\n"):
        data = data[:-1]
        if data.endswith(b"\r"):
            data = data[:-1]
    return data


def key_fingerprint(path):
    """What remusdbd's ping reports as settings.psk_sha256."""
    import hashlib
    return hashlib.sha256(key_bytes(path)).hexdigest()[:16]


def parse(text, origin):
    """The file's text -> {key: value} of the keys it sets; ConfigError
    with every problem."""
    import yaml
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{origin}:{mark.line + 1}" if mark else origin
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError([f"{where}: not valid YAML: {problem}"])
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError([f"{origin}: expected 'key: value' lines, got a "
                           f"{type(data).__name__}"])
    problems = []
    for key, value in data.items():
        check = KEYS.get(key)
        if check is None:
            near = difflib.get_close_matches(str(key), KEYS, n=1)
            problems.append(f"{origin}: key {key!r} is unknown"
                            + (f" (did you mean {near[0]!r}?)" if near
                               else f" (known: {', '.join(KEYS)})"))
            continue
        if value is None:
            problems.append(f"{origin}: key {key!r} has no value")
            continue
        problem = check(value)
        if problem:
            problems.append(f"{origin}: {key}: {problem}")
    if problems:
        raise ConfigError(problems)
    if "etcd" in data:
        data["etcd"] = ",".join(etcd_urls(data["etcd"]))
    return data


def load(path):
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read(1 << 20)
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError([f"{path}: cannot read it: {getattr(e, 'strerror', None) or e}"])
    return parse(text, str(path))


def daemon_mismatches(settings, want, host, check_fence):
    """Lines saying where a running remusdbd's ping settings differ from
    the file's key_file / etcd / fence_command; [] when they agree."""
    lines = []
    if settings is None:
        return [f"remusdbd on {host} does not report its settings (an older "
                f"remusdbd?): restart it to check it against the file"]
    if "key_file" in want:
        mine = key_fingerprint(want["key_file"])
        theirs = settings.get("psk_sha256")
        if theirs != mine:
            lines.append(f"remusdbd on {host} holds "
                         + ("no key" if not theirs else f"another key (sha256 {theirs}...)")
                         + f", not the one in {want['key_file']} ({mine}...): restart it "
                         f"with --psk-file {want['key_file']}")
    if "etcd" in want:
        theirs = sorted(etcd_urls(settings.get("etcd") or "") or [])
        if theirs != sorted(etcd_urls(want["etcd"])):
            lines.append(f"remusdbd on {host} arbitrates through etcd "
                         f"{','.join(theirs) or '(none)'}, the file says {want['etcd']}: "
                         f"restart it with --etcd {want['etcd']}")
    if check_fence and "fence_command" in want:
        theirs = settings.get("fence_command") or ""
        if theirs != want["fence_command"]:
            lines.append(f"remusdbd on {host} fences with {theirs or '(nothing)'!r}, the "
                         f"file says {want['fence_command']!r}: restart it with "
                         f"--fence-command '{want['fence_command']}'")
    return lines
