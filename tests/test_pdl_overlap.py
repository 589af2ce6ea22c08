"""benchmarks/pdl_overlap.py: the per-token kernel sum, span and busy union of a capture."""

import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from pdl_overlap import token_stats  # noqa: E402


def test_overlapping_kernels_count_once_in_the_busy_union():
    """Two kernels overlapping by 2 us and a third after a 1 us gap: sum 11, span 10, busy 9."""
    k = pd.DataFrame({"start_ns": [0, 3000, 7000], "end_ns": [5000, 6000, 10000]})
    total, span, busy, n = token_stats(k)
    assert (total, span, busy, n) == (11.0, 10.0, 9.0, 3)


def test_back_to_back_kernels_have_span_equal_to_their_sum():
    k = pd.DataFrame({"start_ns": [2000, 0], "end_ns": [4000, 2000]})
    assert token_stats(k) == (4.0, 4.0, 4.0, 2)
