"""kanri.instance.divergence: the switchpoint from a timeline history file and the end of the last WAL record
pg_waldump printed (page headers a record crosses included)."""

from __future__ import annotations

from kanri.instance.divergence import Divergence, end_of_last_record, lsn, switchpoint_of

HISTORY = "1\t0/5000A0\tno recovery target specified\n\n2\t0/7001F28\tno recovery target specified\n"
WALDUMP = """\
rmgr: Heap        len (rec/tot):     59/    59, tx:        725, lsn: 0/014A90A0, prev 0/014A9060, desc: INSERT off 3
rmgr: Transaction len (rec/tot):     34/    34, tx:        725, lsn: 0/014A90E0, prev 0/014A90A0, desc: COMMIT 2026
"""


def test_the_switchpoint_of_each_timeline_in_a_history() -> None:
    assert switchpoint_of(HISTORY, 1) == lsn("0/5000A0")
    assert switchpoint_of(HISTORY, 2) == lsn("0/7001F28")
    assert switchpoint_of(HISTORY, 3) is None  # the history does not pass through it
    assert switchpoint_of("", 1) is None


def test_the_end_is_the_last_records_start_plus_its_length_aligned() -> None:
    # 0x14A90E0 + 34 = 0x14A9102, MAXALIGNed: 0x14A9108 (where pg_waldump then reports "invalid record length")
    assert end_of_last_record(WALDUMP) == lsn("0/14A9108")
    assert end_of_last_record("pg_waldump: error: could not find a valid record after 0/1700000") is None


def test_a_record_crossing_pages_counts_their_headers() -> None:
    # starts 16 bytes before a page boundary: 16 bytes, a 24-byte page header, the other 84, then MAXALIGN (+ 4)
    line = "rmgr: Heap len (rec/tot):    100/   100, tx: 1, lsn: 0/01001FF0, prev 0/01001FB0, desc: INSERT"
    assert end_of_last_record(line) == 0x1001FF0 + 100 + 24 + 4
    # crossing into a new 16 MiB segment: its first page has the long (40-byte) header
    line = "rmgr: Heap len (rec/tot):    100/   100, tx: 1, lsn: 0/01FFFFF0, prev 0/01FFFFB0, desc: INSERT"
    assert end_of_last_record(line) == 0x1FFFFF0 + 100 + 40 + 4  # + 4: MAXALIGN


def test_divergence_bytes_never_go_negative() -> None:
    assert Divergence(1, lsn("0/5000A0"), lsn("0/5010A0")).bytes == 0x1000
    assert Divergence(1, lsn("0/5000A0"), lsn("0/5000A0")).bytes == 0
    assert Divergence(1, 100, 50).as_json() == {"timeline": 1, "switchpoint": "0/64", "end": "0/32", "bytes": 0}
