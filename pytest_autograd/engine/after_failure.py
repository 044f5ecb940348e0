"""What happens to a failure before it is reported: its sample shrunk, and a script that reproduces it.

Shared by the pytest items and ``run_checks``, so both report the same. The
report keeps its own numbers (the original sample's); it gains the shrunk
sample's shapes and worst element (``Report.shrunk``) and the script's path
(``Report.repro``).
"""

from pytest_autograd.engine.device_faults import fault_on
from pytest_autograd.engine.repro import write_repro
from pytest_autograd.engine.shrink import shrink


def follow_up(check, context, failure, name):
    """Shrink ``failure``'s sample and write its script, as ``context.case.run_options`` asks; ``name``: the
    item's name for the script's file (e.g. ``test_ops.py-test_linear-gradcheck-cpu``)."""
    report = failure.report
    options = context.case.run_options
    if fault_on(context.device) is not None:  # the device runs nothing more in this process: nothing to shrink on
        return
    across = context.case.option("world_size")  # its layout divides the sizes it is given, not smaller ones
    try:
        shrunk = shrink(check, context, failure, options.shrink_seconds) if options is not None and not across \
            else None
    except Exception as error:  # noqa: BLE001 - shrinking must never hide the failure: the original sample stands
        shrunk = None
        report.details.append(f"shrinking: stopped by {type(error).__name__}: {error}; the sample above is the "
                              "original")
    if shrunk is not None:
        report.shrunk = shrunk.as_dict()
    if options is None or not options.repro_dir or report.sample is None or report.worst is None:
        return
    sample = shrunk.sample if shrunk is not None else context.case.samples[report.sample]
    locus = shrunk.locus if shrunk is not None else report.locus
    try:
        path, why_not = write_repro(options.repro_dir, name, context.case, sample, locus, report,
                                    context.device, report.nodeid or name)
    except Exception as error:  # noqa: BLE001 - a script must never hide the failure it reproduces
        path, why_not = None, f"{type(error).__name__}: {error}"
    if path is not None:
        report.repro = str(path)
    else:
        report.details.append(f"repro: not written ({why_not})")
