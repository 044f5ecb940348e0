"""Result values: failure reports and the evidence behind them, tensor comparisons, names of ops and
arguments, and pictures. They depend on nothing else in the package, so the engine builds them and the
adapter renders and records them.
"""
