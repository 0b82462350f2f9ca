"""The JSON views read by the tools users point at them: DuckDB, pandas (and Spark's read.json in tests/spark).

Each samples the first rows to choose a schema (DuckDB 20,480 of them), so
every row must carry the same members: the rows here change encodings only
after row 30,000, and every value read must be the bytes that were appended
(Spark's read.json: tests/spark/test_spark.py).
"""

from __future__ import annotations

import base64
import json
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.helpers import JsonObject

pytestmark = pytest.mark.mount

PLAIN = 30_000
MEMBERS = ["topic", "partition", "offset", "timestamp", "timestampType", "key", "keyEncoding", "value",
           "valueEncoding", "headers"]


def _tail_rows() -> list[JsonObject]:
    """Rows past the sample: bytes that are not UTF-8 (base64), headers, a null value, numeric-looking text."""
    return [
        {"key": base64.b64encode(b"\xffk").decode(), "keyEncoding": "base64",
         "value": base64.b64encode(b"caf\xe9").decode(), "valueEncoding": "base64",
         "headers": [{"key": "h", "value": base64.b64encode(b"\x00\xfe").decode(), "valueEncoding": "base64"},
                     {"key": "n", "value": None}]},
        {"key": "k", "value": None},
        {"key": "k", "value": "007"},
        {"key": "k", "value": "été"},
    ]


#: what the tail rows hold, as (key, value, headers) bytes
TAIL = [(b"\xffk", b"caf\xe9", (("h", b"\x00\xfe"), ("n", None))), (b"k", None, ()), (b"k", b"007", ()),
        (b"k", "été".encode(), ())]


def decode(text: str | None, encoding: str | None) -> bytes | None:
    if text is None:
        return None
    return base64.b64decode(text) if encoding == "base64" else text.encode()


def fill(mount) -> None:
    """Topic ``t``: PLAIN keyed UTF-8 records without headers, then the tail rows."""
    mount.sh("mkdir t")
    with open(mount / "t/0/append.jsonl", "w") as f:
        f.write("".join('{"key":"k%d","value":"v%05d"}\n' % (i % 7, i) for i in range(PLAIN)))
    with open(mount / "t/0/append.jsonl", "w") as f:
        f.write("".join(json.dumps(row) + "\n" for row in _tail_rows()))


@pytest.fixture
def topic(mount):
    fill(mount)
    return mount


def expected(i: int) -> tuple[bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...]]:
    return ((b"k%d" % (i % 7), b"v%05d" % i, ()) if i < PLAIN else TAIL[i - PLAIN])


def test_every_row_of_every_json_view_has_the_same_members(topic):
    for view in ("t/0/records.jsonl", "t/0/from/29990.jsonl", "t/0/segments/00000000000000000000.jsonl"):
        rows = [json.loads(line) for line in topic.sh(f"cat {view}").stdout.splitlines()]
        assert rows, view
        assert all(list(row) == MEMBERS for row in rows), view
        assert all(list(h) == ["key", "value", "valueEncoding"] for row in rows for h in row["headers"])
    since = topic.sh("cat t/0/since/0").stdout
    assert since == topic.sh("cat t/0/records").stdout       # since/ is text; its .jsonl is records.jsonl
    assert topic.sh("cat t/0/since/0.jsonl").stdout == topic.sh("cat t/0/records.jsonl").stdout


def test_duckdb_default_sampling_reads_every_value(topic):
    import duckdb

    relation = duckdb.sql(f"""select "offset", key, keyEncoding, value, valueEncoding, headers
                              from read_json_auto('{topic / "t/0/records.jsonl"}') order by "offset" """)
    assert relation is not None                     # a select answers a relation (None is for statements)
    rows = relation.fetchall()
    assert len(rows) == PLAIN + len(TAIL)
    for i, (offset, key, key_encoding, value, value_encoding, headers) in enumerate(rows):
        assert offset == i
        # every header column is read: a list of structs, or of JSON texts when the sample had none
        decoded = tuple((h["key"], decode(h["value"], h["valueEncoding"]))
                        for h in (json.loads(h) if isinstance(h, str) else h for h in headers))
        assert (decode(key, key_encoding), decode(value, value_encoding), decoded) == expected(i), i


def test_pandas_reads_every_value(topic):
    import pandas as pd

    df = pd.read_json(topic / "t/0/records.jsonl", lines=True, dtype=False)   # as docs/usage.md shows
    assert list(df.columns) == MEMBERS
    assert len(df) == PLAIN + len(TAIL)
    def null(x):     # pandas shows a null as NaN in a column of strings
        return None if not isinstance(x, str) and pd.isna(x) else x

    for i, row in enumerate(df.itertuples(index=False)):
        assert row.offset == i
        got = (decode(null(row.key), null(row.keyEncoding)), decode(null(row.value), null(row.valueEncoding)),
               tuple((h["key"], decode(h["value"], h["valueEncoding"])) for h in row.headers))
        assert got == expected(i), i
