"""Benchmarks of autograd ops: the ``bench`` check and the ``autograd_bench`` fixture.

Split by job so that the pytest side (``plugin``, ``config``, ``table``,
``results``) never imports torch; only ``timers``, ``roofline`` and
``measure`` do, and only once a benchmark actually runs.
"""
