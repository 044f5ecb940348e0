"""Time budgets: stop code that runs too long, and say where it was.

A check that never returns (an iterative solver given inputs it cannot
converge on, an op that loops forever) would hang the whole session. Every
item runs under a budget (``--autograd-timeout`` / ini ``autograd_timeout``,
default 300 s, 0 disables); checks may nest tighter budgets of their own.

How: one watchdog thread keeps the deadlines. At a deadline it records the
guarded thread's stack and raises an exception in that thread with
``PyThreadState_SetAsyncExc``; it fires at the thread's next Python
bytecode, and again every second until the guarded code gives up (code that
swallows it once is caught by the next one). No signal is used, so the
budget works in any thread, in xdist workers, and beside pytest-timeout
(whichever limit is shorter wins). What it cannot stop: a single C call that
never returns to Python (a torch kernel, a blocking read, one long
``time.sleep``); the exception then fires as soon as that call returns.

Imports no torch and no pytest; the option (``--autograd-timeout``) is the adapter's ``timeout`` module.
"""

import ctypes
import itertools
from contextlib import contextmanager
import math
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field

from pytest_autograd.engine.defaults import DEFAULT_SECONDS  # noqa: F401 - the default budget, re-exported

RETRY_SECONDS = 1.0
POLL_SECONDS = 0.25  # how often the watchdog looks at the deadlines: their resolution
_INTERNAL = ("/pytest_autograd/engine/budget.py", "/pytest_autograd/engine/running.py", "/threading.py", "/contextlib.py")
_NOT_USER = ("/torch/", "/pytest_autograd/", "/_pytest/", "/pluggy/", "/sympy/", "/threading.py",
             "/contextlib.py", "/functools.py", "/importlib/", "<frozen ")


class TimeBudgetExceeded(BaseException):
    """Raised inside guarded code at its deadline.

    A BaseException, like KeyboardInterrupt, so that ``except Exception`` in
    the op or in a check does not swallow it.
    """


@dataclass
class Expired:
    """A budget that ran out: how long it was and where the guarded code was then."""

    seconds: float
    frames: list = field(default_factory=list)  # traceback.FrameSummary, outermost first

    def user_frame(self):
        """The innermost frame of the user's code (not torch, not the plugin, not pytest)."""
        return _innermost(self.frames, lambda path: not any(part in path for part in _NOT_USER))

    def check_frame(self):
        """The innermost frame inside the plugin's checks."""
        return _innermost(self.frames, lambda path: "/pytest_autograd/checks/" in path
                          and not path.rsplit("/", 1)[-1].startswith(("_", "base.py")))

    def stack_lines(self, limit=12):
        """``file:line in function`` for the frames that matter, innermost last."""
        frames = [f for f in self.frames if not any(part in _path(f) for part in _INTERNAL)]
        lines = [describe(f) for f in frames[-limit:]]
        if len(frames) > limit:
            lines.insert(0, f"... {len(frames) - limit} outer frame(s)")
        return lines


def describe(frame):
    return f"{frame.filename}:{frame.lineno} in {frame.name}"


def _path(frame):
    return frame.filename.replace("\\", "/")


def _innermost(frames, wanted):
    for frame in reversed(frames):
        if wanted(_path(frame)):
            return frame
    return None


@dataclass
class Finished:
    """What ``call_with_limit`` returns: the value, or the Expired budget."""

    value: object = None
    expired: Expired = None


def call_with_limit(seconds, fn):
    """Call ``fn()`` with at most ``seconds`` (None: no limit); never raises for the limit itself."""
    if not seconds or not _can_interrupt():
        return Finished(fn())
    deadline = _Deadline(seconds, threading.get_ident())
    try:
        try:
            _WATCHDOG.add(deadline)
            return Finished(fn())
        finally:
            _WATCHDOG.remove(deadline)
    except TimeBudgetExceeded as raised:
        _WATCHDOG.remove(deadline)
        if not deadline.fired:  # an enclosing budget's: its own call_with_limit handles it
            raise
        frames = traceback.extract_tb(raised.__traceback__)[1:] or deadline.stack or []
        frames = list(frames) + list(getattr(raised, "frames_elsewhere", ()))  # a process it waited for, if any
        return Finished(expired=Expired(seconds, frames))


@contextmanager
def paused():
    """The calling thread's budgets stand still in the block (time the plugin spends on its own work, such as a
    trial run in another process that starts first, is not the op's), and the block gets the seconds the
    innermost of them had left (None without one) to bound that work by."""
    me = threading.get_ident()
    mine = [d for d in list(_WATCHDOG.deadlines) if d.thread_id == me and d.active and not d.fired]
    now = time.monotonic()
    left = {d: d.due - now for d in mine}
    for deadline in mine:
        deadline.due = math.inf
    try:
        yield max(0.0, min(left.values())) if left else None
    finally:
        now = time.monotonic()
        for deadline, seconds in left.items():
            deadline.due = now + seconds


def _can_interrupt():
    return hasattr(ctypes, "pythonapi") and hasattr(ctypes.pythonapi, "PyThreadState_SetAsyncExc")


class _Deadline:
    def __init__(self, seconds, thread_id):
        self.due = time.monotonic() + seconds
        self.thread_id = thread_id
        self.order = next(_ORDER)  # budgets of one thread nest: a later one is an inner one
        self.active = False  # between add and remove: only an active deadline is fired
        self.fired = False
        self.stack = None


class _Watchdog:
    """One daemon thread for all deadlines; it looks at them every ``POLL_SECONDS``.

    The guarded thread takes no lock: an exception fired into it while it
    held one (registering a nested deadline, say) would leave the lock held
    for good, and the watchdog, waiting on it, would stop every later budget
    in the session. Registering is one list operation, atomic under the GIL;
    the only race, the watchdog firing a deadline its thread is removing, is
    closed by ``firing``: remove waits while the watchdog is inside the
    firing of that deadline, then drops what it may have sent.

    Adding or removing a deadline never wakes the watchdog: waking another
    thread costs the guarded thread a GIL hand-off (milliseconds on a busy
    machine), and checks add a deadline per input magnitude.
    """

    def __init__(self):
        self.deadlines = []
        self.firing = None  # the deadline the watchdog is firing right now
        self.thread = None
        self.starting = threading.Lock()

    def add(self, deadline):
        if self.thread is None:
            self._start()
        deadline.active = True
        self.deadlines.append(deadline)

    def _start(self):
        """Start the one watchdog thread, at the first deadline ever: none can fire into the caller yet.

        Its liveness is never asked later: ``Thread.is_alive`` interrupted by
        a fired exception marks a running thread as stopped, which would
        start a second watchdog.
        """
        with self.starting:
            if self.thread is None:
                thread = threading.Thread(target=self._loop, name="pytest-autograd-budget", daemon=True)
                thread.start()
                self.thread = thread

    def remove(self, deadline):
        """End ``deadline`` and every budget nested in it: an exception that cut an inner budget's own removal
        short must not leave it to fire later, outside its code."""
        ending = [d for d in list(self.deadlines) if d.thread_id == deadline.thread_id and d.order > deadline.order]
        ending.append(deadline)
        for d in ending:
            d.active = False
        while self.firing in ending:  # the watchdog saw one active a moment ago: let it finish
            time.sleep(0.0001)
        for d in ending:
            try:
                self.deadlines.remove(d)
            except ValueError:  # never added, or removed already
                pass
        outer_fired = any(d.fired and d.active and d.thread_id == deadline.thread_id for d in list(self.deadlines))
        if any(d.fired for d in ending) and not outer_fired:
            _set_async_exc(deadline.thread_id, None)  # drop a copy not yet delivered

    def _loop(self):
        while True:  # never ends: the thread is started once (see _start)
            now = time.monotonic()
            deadlines = list(self.deadlines)
            for deadline in deadlines:
                if deadline.active and deadline.due <= now:
                    try:
                        self._fire(deadline, now)
                    except Exception:  # noqa: BLE001 - a stack that cannot be read must not end the watchdog
                        deadline.stack = deadline.stack or []
            upcoming = min((d.due for d in deadlines if d.active), default=math.inf)
            time.sleep(min(POLL_SECONDS, max(0.0, upcoming - time.monotonic())))

    def _fire(self, deadline, now):
        self.firing = deadline
        try:
            if not deadline.active:  # removed between the look and announcing the firing
                return
            if deadline.stack is None:
                frame = sys._current_frames().get(deadline.thread_id)
                deadline.stack = traceback.extract_stack(frame) if frame is not None else []
            deadline.fired = True
            deadline.due = now + RETRY_SECONDS
            _set_async_exc(deadline.thread_id, TimeBudgetExceeded)
        finally:
            self.firing = None


def _set_async_exc(thread_id, exception):
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id),
                                               None if exception is None else ctypes.py_object(exception))


_ORDER = itertools.count()
_WATCHDOG = _Watchdog()


def time_budget_failure(check_name, expired, device=None, sample=None):
    """The CheckFailure of an item stopped at its budget: where the op and the check were."""
    from pytest_autograd.results.report import CheckFailure, Report

    details = []
    user, check = expired.user_frame(), expired.check_frame()
    if user is not None:
        details.append(f"stopped in the op's code at {describe(user)}")
    if check is not None:
        details.append(f"the check was at {describe(check)}")
    stack = expired.stack_lines()
    if stack:
        details.append("stack at the limit (innermost last):")
        details.extend(f"  {line}" for line in stack)
    return CheckFailure(Report(
        check=check_name, device=device, sample=sample,
        summary=f"the item ran past its time budget of {expired.seconds:g} s and was stopped",
        details=details,
        hint=("the op may not terminate on these samples (a loop whose exit is never reached, an iterative solver "
              "that does not converge), or it is only slow: give items more time with --autograd-timeout=SECONDS "
              "(ini autograd_timeout; 0 disables the limit), or check it on smaller samples")))
