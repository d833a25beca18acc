"""Times and rates in sentences and tables read as a person writes them."""

import pytest

from rltrace.analysis._format import number_text, rate_text, seconds_text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.000231, "231 µs"),
        (6.58e-05, "65.8 µs"),
        (0.0124, "12.4 ms"),
        (1.234, "1.23 s"),
        (4.0, "4.00 s"),
        (0.9996, "1.00 s"),  # the unit is chosen after rounding
        (59.96, "1 min 00 s"),
        (245.2, "4 min 05 s"),
        (7385, "2 h 03 min"),
        (0.0, "0 s"),
        (3e-9, "3.00 ns"),
        (-0.5, "-500 ms"),
        (None, "-"),
        (float("nan"), "-"),
    ],
)
def test_seconds(seconds, text):
    assert seconds_text(seconds) == text


def test_rates_and_numbers():
    assert [rate_text(x) for x in (850, 1e6, 24.8e6, 2.36e9, 999.6, None)] == [
        "850 B/s", "1.00 MB/s", "24.8 MB/s", "2.36 GB/s", "1.00 kB/s", "-"
    ]
    assert [number_text(x) for x in (1.123456e-07, 0.0827, None)] == ["1.12e-07", "0.0827", "-"]
