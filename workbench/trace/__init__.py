"""Traces: one event table (Nsight-like rows) from the simulator, CUPTI or imported files."""

from .table import API_ROW, COLUMNS, KINDS, MARKER_ROW, Trace, TraceError, normalize, rebased, stream_row

__all__ = ["API_ROW", "COLUMNS", "KINDS", "MARKER_ROW", "Trace", "TraceError", "normalize", "rebased", "stream_row"]
