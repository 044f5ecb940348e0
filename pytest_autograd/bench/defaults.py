"""The timer's defaults that the ``--autograd-bench-*`` options name in their help, in a module of their own:
declaring the options at start-up imports nothing else of the bench package."""

DEFAULT_BUDGET = 0.5  # seconds of measuring per timing (one direction of one implementation)
DEFAULT_NOISE = 0.03  # stop once IQR / median is below this
DEFAULT_WARMUP = 0.05  # seconds of untimed calls after the first call
