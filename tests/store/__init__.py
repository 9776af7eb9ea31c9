"""The store conformance suite: one suite, run unchanged against every backend."""
