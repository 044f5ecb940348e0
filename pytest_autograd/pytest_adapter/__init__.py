"""The pytest adapter: options and ini values, the autograd_op marker, item generation, fixtures, the
session summary, and the JSON records and pictures written for a session.

It turns pytest's objects (config, items, markers) into the engine's values and the engine's verdicts
into pytest outcomes. Dependencies point one way: this package imports the engine, never the reverse.
"""
