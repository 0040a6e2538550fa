"""Sizes and times as text (module_utils/dgx_units.py)."""
import re

import pytest

from ansible.module_utils.dgx_units import human_bytes, utc_epoch, utc_text

MIB, GIB = 1024 ** 2, 1024 ** 3


@pytest.mark.parametrize("size, text", [(None, "0 B"), (0, "0 B"), (1023, "1023 B"), (3277, "3.2 KiB"),
                                        (812 * MIB, "812.0 MiB"), (12 * GIB + 300 * MIB, "12.3 GiB"),
                                        (1300 * GIB, "1.3 TiB"), (3 * 1024 * 1024 * GIB, "3072.0 TiB")])
def test_bytes_in_binary_units(size, text):
    assert human_bytes(size) == text


def test_utc_text_is_iso_8601_utc_to_the_second_and_reads_back():
    assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$", utc_text())
    assert utc_text(0) == "1970-01-01T00:00:00Z"
    assert utc_epoch(utc_text(1790000000)) == 1790000000


@pytest.mark.parametrize("text", [None, "", "yesterday", "2026-12-01 10:00:00", "2026-12-01T10:00:00+01:00"])
def test_utc_epoch_of_anything_else_is_none(text):
    assert utc_epoch(text) is None
