"""Benchmarks (``make bench``); never part of the test suite."""
