"""`remusdb protect --config FILE`: the per-VM protection file's parser and
how the command line overrides it. No VM, no lab, no daemon."""
import subprocess
from pathlib import Path

import pytest

from remusdb import protect_config
from remusdb.cli import main, protect
from remusdb.protect_config import ConfigError

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "docs" / "examples" / "protect-db.yml"


@pytest.fixture
def key(tmp_path):
    path = tmp_path / "psk"
    path.write_text("0123456789abcdef0123456789abcdef\n")
    path.chmod(0o600)
    return path


def write(tmp_path, text):
    f = tmp_path / "db.yml"
    f.write_text(text)
    return f


def problems(text, tmp_path):
    with pytest.raises(ConfigError) as e:
        protect_config.load(write(tmp_path, text))
    return e.value.problems


def test_a_complete_file_loads(tmp_path, key):
    """The positive control: every key with a good value."""
    f = write(tmp_path, f"""vm: db
host: primary
backup: backup:7799
interval: 50
timeout: 120
key_file: {key}
fence_command: /usr/local/sbin/fence primary
etcd: [http://10.77.0.5:2379, "http://10.77.0.6:2379"]
compress: false
read_tracking: true
commit_protection: true
cp_dscp: 46
""")
    conf = protect_config.load(f)
    assert conf["interval"] == 50 and conf["backup"] == "backup:7799"
    assert conf["etcd"] == "http://10.77.0.5:2379,http://10.77.0.6:2379"
    assert conf["compress"] is False and conf["commit_protection"] is True


def test_the_documented_example_is_valid_apart_from_its_key_file(tmp_path, key):
    text = EXAMPLE.read_text().replace("/etc/remusdb/psk", str(key))
    assert str(key) in text
    conf = protect_config.load(write(tmp_path, text))
    assert conf["vm"] == "db" and conf["interval"] == 100


def test_an_empty_file_sets_nothing(tmp_path):
    assert protect_config.load(write(tmp_path, "# nothing yet\n")) == {}


def test_an_unknown_key_is_one_line_with_a_suggestion(tmp_path):
    assert problems("intervall: 100\n", tmp_path) == [
        f"{tmp_path}/db.yml: key 'intervall' is unknown (did you mean 'interval'?)"]


@pytest.mark.parametrize("value, says", [
    ("10", "10 ms is out of range: use 25..500 ms"),
    ("501", "501 ms is out of range: use 25..500 ms"),
    ("fast", "must be a whole number, not 'fast'"),
    ("true", "must be a whole number, not True"),
    ("100.5", "must be a whole number, not 100.5"),
])
def test_a_bad_interval_says_why(tmp_path, value, says):
    assert problems(f"interval: {value}\n", tmp_path) == [f"{tmp_path}/db.yml: interval: {says}"]


def test_every_problem_is_reported_one_line_each(tmp_path):
    lines = problems("""vm: db
interval: 5
backup: nowhere:99999
etcd: ftp://x
compress: maybe
cp_dscp: 64
colour: blue
host: "a host"
fence_command: ""
""", tmp_path)
    assert len(lines) == 8, lines
    assert all(line.startswith(f"{tmp_path}/db.yml: ") and "\n" not in line for line in lines)
    joined = "\n".join(lines)
    for fragment in ("interval: 5 ms is out of range", "backup: bad backup port",
                     "etcd: 'ftp://x' is not an etcd client URL",
                     "compress: must be true or false, not 'maybe'",
                     "cp_dscp: 64 is out of range: use 0..63",
                     "key 'colour' is unknown", "host: 'a host' is not a host name",
                     "fence_command: must be a shell command, not ''"):
        assert fragment in joined, (fragment, joined)


def test_a_key_file_remusdbd_would_refuse_is_refused_here(tmp_path, key):
    key.chmod(0o644)
    assert problems(f"key_file: {key}\n", tmp_path) == [
        f"{tmp_path}/db.yml: key_file: {key} is accessible by group or others (mode 0644): "
        f"run chmod 600 {key}"]
    short = tmp_path / "short"
    short.write_text("tooshort\n")
    short.chmod(0o600)
    assert "is 8 bytes; use 16..1024" in problems(f"key_file: {short}\n", tmp_path)[0]
    assert "No such file" in problems(f"key_file: {tmp_path}/nope\n", tmp_path)[0]


def test_yaml_syntax_errors_name_the_line(tmp_path):
    [line] = problems("vm: db\ninterval: [100\n", tmp_path)
    assert line.startswith(f"{tmp_path}/db.yml:") and "not valid YAML" in line


def test_a_list_is_not_a_config(tmp_path):
    [line] = problems("- vm: db\n", tmp_path)
    assert "expected 'key: value' lines" in line


def args_for(argv):
    return main.build_parser().parse_args(["protect", *argv])


def test_flags_override_the_file_and_the_file_overrides_defaults(tmp_path, key):
    f = write(tmp_path, f"vm: db\nbackup: backup\ninterval: 250\ntimeout: 30\n"
                        f"compress: false\nkey_file: {key}\n")
    args = args_for(["--config", str(f), "--interval", "50"])
    settings = protect.resolve_protect_args(args)
    assert (args.vm, args.backup, args.interval, args.timeout) == ("db", "backup", 50, 30)
    # The host is the cluster file's default_host, decided when protect runs.
    assert args.no_compress and not args.no_read_tracking and args.host is None
    assert args.cp_dscp == 47
    assert settings == {"key_file": str(key)}
    args = args_for(["--config", str(f), "--backup", "10.77.0.9:7000"])
    protect.resolve_protect_args(args)
    assert (args.backup, args.interval) == ("10.77.0.9:7000", 250)


def test_without_a_file_the_old_defaults_hold():
    args = args_for(["db", "--backup", "backup"])
    assert protect.resolve_protect_args(args) == {}
    assert (args.interval, args.timeout, args.host, args.cp_dscp) == (100, 600, None, 47)
    assert not args.no_compress and not args.commit_protection


def test_the_vm_on_the_command_line_must_be_the_files(tmp_path):
    f = write(tmp_path, "vm: db\nbackup: backup\n")
    with pytest.raises(ConfigError) as e:
        protect.resolve_protect_args(args_for(["other", "--config", str(f)]))
    assert "protection file of VM 'db', not 'other'" in str(e.value)


def test_the_cli_prints_one_error_line_per_problem_and_exits_2(tmp_path):
    f = write(tmp_path, "vm: db\nbackup: backup\ninterval: 1000\nbogus: 1\n")
    r = subprocess.run([str(REPO / "tools" / "remusdb"), "protect",
                        "--config", str(f)], capture_output=True, text=True)
    assert r.returncode == 2
    assert r.stderr.splitlines() == [
        f"remusdb: error: {f}: interval: 1000 ms is out of range: use 25..500 ms",
        f"remusdb: error: {f}: key 'bogus' is unknown (known: {', '.join(protect_config.KEYS)})",
    ]
    r = subprocess.run([str(REPO / "tools" / "remusdb"), "protect", "db"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.strip() == (
        "remusdb: error: no backup named: give --backup HOST[:PORT] or `backup:` in the "
        "--config file")


def test_running_daemons_are_checked_against_the_file(key):
    mine = protect_config.key_fingerprint(key)
    want = {"key_file": str(key), "etcd": "http://10.77.0.5:2379",
            "fence_command": "fence-it"}
    same = {"psk_sha256": mine, "etcd": "http://10.77.0.5:2379", "fence_command": "fence-it"}
    assert protect_config.daemon_mismatches(same, want, "backup", check_fence=True) == []
    other = {"psk_sha256": "00" * 8, "etcd": "http://10.77.0.9:2379", "fence_command": ""}
    lines = protect_config.daemon_mismatches(other, want, "backup", check_fence=True)
    assert len(lines) == 3 and all(line.startswith("remusdbd on backup ") for line in lines)
    assert "restart it with --psk-file" in lines[0] and "--etcd" in lines[1]
    assert len(protect_config.daemon_mismatches(other, want, "primary", check_fence=False)) == 2
    assert "does not report its settings" in protect_config.daemon_mismatches(
        None, want, "primary", check_fence=False)[0]
