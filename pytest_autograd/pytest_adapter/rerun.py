"""The ``rerun:`` command of a failure: pasteable into a shell, from any directory.

Node ids are relative to pytest's rootdir, so when pytest ran elsewhere the
command starts with ``cd ROOTDIR &&``. The node id is double-quoted as it
always was when that is safe, and shell-quoted (``shlex.quote``) when it
holds a quote, ``$``, a backtick, a backslash or ``!``.
"""

import shlex
from pathlib import Path

_UNSAFE_IN_DOUBLE_QUOTES = set('"$`\\!')


def quote_nodeid(nodeid):
    if _UNSAFE_IN_DOUBLE_QUOTES.isdisjoint(nodeid):
        return f'"{nodeid}"'
    return shlex.quote(nodeid)


def rerun_prefix(config):
    """``cd ROOTDIR && `` when pytest ran outside its rootdir, else ''."""
    if config is None:
        return ""
    rootdir = Path(str(config.rootpath))
    invoked = Path(str(config.invocation_params.dir))
    if invoked.resolve() == rootdir.resolve():
        return ""
    return f"cd {shlex.quote(str(rootdir))} && "


def pytest_command(config, nodeid, *options):
    """``[cd ROOTDIR && ]pytest "NODEID" OPTIONS...``."""
    return " ".join([f"{rerun_prefix(config)}pytest {quote_nodeid(nodeid)}", *options])
