"""What the record codec's property tests (tests/unit/test_records*.py) draw: timestamps, codecs, fields."""

from __future__ import annotations

from hypothesis import strategies as st

from engine.records import Compression

TS = 1_700_000_000_000
CODECS = list(Compression)


def field_strategies(max_size: int, max_key_chars: int, max_headers: int) -> tuple[
        st.SearchStrategy[bytes], st.SearchStrategy[bytes | None],
        st.SearchStrategy[list[tuple[str, bytes | None]]]]:
    """(blobs, nullable blobs, header lists): keys and values of up to ``max_size`` bytes, and up to
    ``max_headers`` headers of keys up to ``max_key_chars`` characters and nullable values."""
    blobs = st.binary(max_size=max_size)
    nullable = st.none() | blobs
    return blobs, nullable, st.lists(st.tuples(st.text(max_size=max_key_chars), nullable), max_size=max_headers)
