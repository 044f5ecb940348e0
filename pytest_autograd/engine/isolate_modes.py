"""Where a crash of the op cannot end the run: the isolation modes (``engine.exploration``), as options and markers
name them. Apart from that package, so that declaring the option imports nothing else."""

ISOLATE_MODES = ("explore", "all", "off")  # the first is the default
ISOLATE_HELP = ("where a crash of the op (a segfault, an abort, a GPU fault) cannot end the session: 'explore' "
                "(default) runs the checks that try inputs you did not give (sizes, noncontiguous, extreme, the "
                "shrinker) in a sandbox process, the others on your samples in pytest's process (a crash there "
                "ends the session, naming the item); 'all' runs every check in the sandbox; 'off' runs everything "
                "in pytest's own process")


def isolate_mode(case):
    """The case's isolation mode: the marker's ``isolate=``, else the run's (``RunOptions.isolate``); "off" for an
    op across ranks, whose ranks are processes of their own already (``engine.distributed``)."""
    if case.option("world_size"):
        return "off"
    return case.option("isolate") or getattr(case.run_options, "isolate", ISOLATE_MODES[0])


def isolate_problem(value, source):
    """None when ``value`` names an isolation mode, else the usage error saying which ones there are."""
    if value in ISOLATE_MODES:
        return None
    return f"{source}: unknown isolation mode {value!r}; use one of {', '.join(ISOLATE_MODES)}"
