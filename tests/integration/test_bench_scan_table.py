"""The DSS scan table of remusdb-bench overhead and compress --record-guest,
created chunk by chunk: the chunks cover every row once, and the table they
build in a real PostgreSQL (a scratch cluster of the host's PostgreSQL 15,
the guest's version) is the one a single CREATE TABLE AS built. No VM, no
lab."""
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from remusdb.bench.overhead import ROW_BYTES, SCAN_CHUNK_MB, scan_chunks, scan_rows

PG_BIN = Path("/usr/lib/postgresql/15/bin")
PORT = 55433


def gaps_or_overlaps(chunks, rows):
    """What is wrong with chunks as a cover of ids 1..rows, in order."""
    problems, expected = [], 1
    for first, last in chunks:
        if first != expected:
            problems.append(f"chunk starts at {first}, expected {expected}")
        if last < first:
            problems.append(f"empty chunk {first}..{last}")
        expected = last + 1
    if expected != rows + 1:
        problems.append(f"chunks end at {expected - 1}, not {rows}")
    return problems


@pytest.mark.parametrize("mb", [1, 63, 64, 65, 384, 430])
def test_chunks_cover_every_row_once_in_about_64_mib_each(mb):
    rows = mb * (1 << 20) // ROW_BYTES
    chunks = scan_chunks(rows, mb)
    assert gaps_or_overlaps(chunks, rows) == []
    per_chunk = SCAN_CHUNK_MB * (1 << 20) // ROW_BYTES
    assert all(last - first + 1 <= per_chunk + 1 for first, last in chunks)


def test_negative_control_one_row_skipped_between_chunks_is_caught():
    chunks = scan_chunks(3355443, 384)
    (a, b), (c, d) = chunks[0], chunks[1]
    assert gaps_or_overlaps([(a, b), (c + 1, d)] + chunks[2:], 3355443)
    assert gaps_or_overlaps([(a, b - 1)] + chunks[1:], 3355443)


def run_checked(argv, cwd):
    r = subprocess.run(argv, capture_output=True, text=True, cwd=cwd)
    assert r.returncode == 0, f"{argv[-1]!r}: {r.stderr.strip()}"
    return r.stdout.strip()


@pytest.fixture(scope="module")
def scratch_pg():
    """psql(sql) against a throwaway PostgreSQL cluster, stopped afterwards."""
    if not (PG_BIN / "initdb").exists():
        pytest.fail(f"{PG_BIN}/initdb missing: install postgresql-15 (tools/setup/install-deps.sh)")
    # Not under pytest's tmp_path: its parent is private to root, and initdb
    # refuses to run as root, so the cluster belongs to nobody then.
    root = Path(tempfile.mkdtemp(prefix="rdb-scan-pg-"))
    as_user = ["runuser", "-u", "nobody", "--"] if os.geteuid() == 0 else []
    if as_user:
        shutil.chown(root, "nobody")
    data = root / "data"
    run_checked([*as_user, str(PG_BIN / "initdb"), "-D", str(data), "-A", "trust",
                 "-U", "postgres"], root)
    run_checked([*as_user, str(PG_BIN / "pg_ctl"), "-D", str(data), "-l", str(root / "log"),
                 "-o", f"-k {root} -p {PORT} -c listen_addresses=''", "-w", "start"], root)

    def psql(sql):
        return run_checked([*as_user, str(PG_BIN / "psql"), "-h", str(root), "-p", str(PORT),
                            "-U", "postgres", "-X", "-A", "-t", "-v", "ON_ERROR_STOP=1",
                            "-c", sql], root)
    try:
        yield psql
    finally:
        subprocess.run([*as_user, str(PG_BIN / "pg_ctl"), "-D", str(data), "-m", "fast",
                        "stop"], capture_output=True, cwd=root)
        shutil.rmtree(root, ignore_errors=True)


def build(psql, name, chunks):
    for first, last in chunks:
        psql(f"CREATE TABLE {name} AS {scan_rows(first, last)}" if first == chunks[0][0]
             else f"INSERT INTO {name} {scan_rows(first, last)}")
        psql("CHECKPOINT")
    psql(f"ANALYZE {name}")


def shape(psql, name):
    """Column names and types, rows, a digest of every column that does not
    come from random(), and the table's pages."""
    columns = psql("SELECT string_agg(attname || ' ' || format_type(atttypid, atttypmod), ', '"
                   f" ORDER BY attnum) FROM pg_attribute WHERE attrelid = '{name}'::regclass"
                   " AND attnum > 0")
    digest = psql("SELECT count(*) || ' ' || md5(string_agg(concat_ws(',', id, flag, status,"
                  f" shipday, comment), ';' ORDER BY id)) FROM {name}")
    ranges = psql(f"SELECT bool_and(qty BETWEEN 0 AND 50 AND price BETWEEN 0 AND 1000"
                  f" AND discount BETWEEN 0 AND 0.1) FROM {name}")
    pages = psql(f"SELECT relpages FROM pg_class WHERE relname = '{name}'")
    return columns, digest, ranges, pages


def test_chunks_build_the_table_one_create_table_as_built(scratch_pg):
    rows = 30000
    # The statement create_scan_table ran before it was chunked, verbatim.
    scratch_pg(f"""CREATE TABLE whole AS SELECT i AS id,
          (i % 3)::int AS flag, (i % 2)::int AS status,
          (random() * 50)::int AS qty, (random() * 1000)::numeric(12,2) AS price,
          (random() * 0.1)::numeric(4,2) AS discount, (i % 2500)::int AS shipday,
          md5(i::text) || md5((i * 7)::text) AS comment
        FROM generate_series(1, {rows}) AS i; ANALYZE whole;""")
    build(scratch_pg, "chunked", [(1, 10000), (10001, 20000), (20001, rows)])
    whole = shape(scratch_pg, "whole")
    assert whole[0].startswith("id integer, flag integer, status integer, qty integer, "
                               "price numeric(12,2), discount numeric(4,2)")
    assert whole[2] == "t"
    assert shape(scratch_pg, "chunked") == whole
    # negative control: one row left out between two chunks
    build(scratch_pg, "short", [(1, 10000), (10002, 20000), (20001, rows)])
    assert shape(scratch_pg, "short")[1] != whole[1]
