"""Work in other processes: the one way the plugin runs anything outside the session's own process.

A kernel that segfaults, aborts or faults its GPU takes its process with it.
Work that must survive that runs in a :class:`Worker`: a persistent child
process, started from Python's ``multiprocessing`` forkserver (spawn where
there is none) with torch already imported, that runs one task at a time
and is started afresh after a crash. A task is a module-level function and
its arguments; tensors cross by value with their exact layout (strides,
storage offset), and objects of the test's own modules (a Function defined
in a test file or a conftest) are found in the child by the file the parent
imported them from (``transport``).

What comes back is an :class:`Outcome`: the value, the exception the task
raised, or how the process ended (``Crash``: the signal, and the last words
it wrote, e.g. the Python frame ``faulthandler`` saw crash) or that it did
not answer in time.

:func:`sandbox` is the session's worker for trial runs (see
``engine.exploration.isolation``); one per process, so each pytest-xdist
worker has its own. Ranks of a process group are the same workers, several
at once.
"""

import atexit
import multiprocessing
import os
import signal
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.connection import wait

from pytest_autograd.engine.processes import transport

POLL_SECONDS = 0.25  # how often a waiting parent returns to Python (so a time budget can interrupt the wait)
LOG_TAIL_BYTES = 4096  # what a report quotes of a crashed child's last words ...
STACK_SECONDS = 0.2  # how long a hung child is given to write its stacks before it is stopped
LOG_BYTES = 1 << 22  # ... out of at most this much it wrote during its last task


@dataclass
class Crash:
    """How a child process ended without answering."""

    exitcode: int
    log: str = ""  # what the child wrote during the task (a C++ abort message, faulthandler's Python stack)

    @property
    def last_words(self):
        if len(self.log) <= LOG_TAIL_BYTES:
            return self.log
        tail = self.log[-LOG_TAIL_BYTES:]
        return tail[tail.find("\n") + 1:] if "\n" in tail else tail  # whole lines only

    @property
    def signal_name(self):
        """``SIGSEGV`` for a child killed by a signal; ``exit code N`` otherwise."""
        if self.exitcode is not None and self.exitcode < 0:
            try:
                return signal.Signals(-self.exitcode).name
            except ValueError:
                return f"signal {-self.exitcode}"
        return f"exit code {self.exitcode}"

    def frames(self):
        """The Python frames of the thread faulthandler wrote first (the crashed, or asked, one), outermost first,
        as ``traceback.FrameSummary``."""
        import re
        import traceback

        found, started = [], False
        for line in self.log.splitlines():
            text = line.strip()
            if text.startswith(("Current thread", "Thread 0x")):
                if started:
                    break
                started = True
                continue
            match = re.match(r'File "(.*)", line (\d+) in (.*)', text)
            if started and match:
                found.append(traceback.FrameSummary(match.group(1), int(match.group(2)), match.group(3),
                                                    lookup_line=False))
        return found[::-1]

    def crashed_frame(self):
        """The innermost Python frame faulthandler saw when the process crashed, outside torch and the plugin."""
        frames = [line.strip() for line in self.last_words.splitlines() if line.strip().startswith("File ")]
        user = [line for line in frames if "pytest_autograd" not in line
                and not transport.is_system_file(line.split('"')[1] if '"' in line else "")]
        return user[0] if user else None  # faulthandler prints the innermost frame first

    def first_message(self):
        """The first line the child wrote that is neither faulthandler's stack nor blank (e.g. Triton's or
        the C++ runtime's own words before an abort)."""
        for line in self.last_words.splitlines():
            text = line.strip()
            if text and not text.startswith(("File ", "pytest-autograd", "Current thread", "Thread 0x", "Fatal Python error",
                                             "Extension modules:", "Stack (most recent")):
                return text[:200]
        return None


@dataclass
class Outcome:
    """What a task in another process came to: exactly one of ``value``, ``raised``, ``crash`` or ``hung``."""

    value: object = None
    raised: object = None  # transport.RaisedElsewhere: the exception the task raised, by type name and message
    crash: Crash = None  # also set for a hung child: its exit code None, its log holding where it waited
    hung: float = None  # seconds waited before the child was stopped
    fault: bool = False  # ``raised`` is a GPU fault: the child's device was unusable after it (a new child follows)
    unsent: bool = False  # ``raised`` came from rebuilding the task in the child: it never ran

    @property
    def returned(self):
        return self.raised is None and self.crash is None


class Worker:
    """One persistent child process running tasks one at a time; started on first use, again after a crash."""

    def __init__(self, name="sandbox", environment=None, farewell=None):
        self.name = name
        self.environment = environment or {}  # variables the child sets before its first task
        # What the child writes to the session's stderr when the session's process dies under it (a crash: the
        # process is gone without a word of its own), ``{where}`` replaced by what ``mark`` said last
        self.farewell = farewell
        self._farewell_fd = None  # where the farewell goes (the session's real stderr); None: the child's stderr
        self._marks = None
        self._process = None
        self._connection = None
        self._log = None
        self._state = None  # the parent's import state the child has
        self._lock = threading.Lock()
        self.starts = 0

    def run(self, function, *args, timeout=None):
        """``function(*args)`` in the child, as an :class:`Outcome`. ``timeout``: seconds before the child is
        stopped and the outcome is ``hung``; None waits as long as the task takes."""
        with self._lock:
            try:
                self.submit(function, *args)
                return self._answer(timeout)
            except BaseException as stopped:  # a time budget or ^C while the child works: its state is unknown now
                if not isinstance(stopped, Exception):  # say where the child was (the budget's report shows it)
                    stopped.frames_elsewhere = Crash(None, self.stack_now()).frames()
                self.stop()
                raise

    def submit(self, function, *args):
        """Hand ``function(*args)`` to the child and return at once (``answer`` waits for it): for several workers
        working together, as the ranks of a process group do."""
        self._ensure_started()
        payload, self._state = transport.task_message(function, args, self._state)
        self._connection.send_bytes(payload)

    def answer(self, timeout=None):
        """The Outcome of the task ``submit`` handed over (see ``run``)."""
        return self._answer(timeout)

    def answered(self):
        """The Outcome of the submitted task if it has come (or the child has died), else None, without waiting."""
        ready = wait([self._connection, self._process.sentinel], timeout=0)
        return self._answer(None) if ready else None

    def stop_waiting(self, waited):
        """Stop a child whose task has not come back: ``hung``, with the stacks it was in."""
        where = self.stack_now()
        self.stop()
        return Outcome(hung=waited, crash=Crash(None, where))

    def start_soon(self, *warm):
        """Start the child in the background, so that the first task does not wait for torch's import there; then
        run ``warm`` (a function and its arguments: what the first tasks will import) there."""
        threading.Thread(target=self._start_quietly, args=warm, name=f"pytest-autograd-{self.name}-start",
                         daemon=True).start()

    def _start_quietly(self, *warm):
        with self._lock:
            try:
                self._ensure_started()
                if warm:
                    self.submit(*warm)
                    self._answer(None)
            except Exception:  # noqa: BLE001 - the first task starts it again, and says what went wrong
                self.stop()

    def _answer(self, timeout):
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = POLL_SECONDS if deadline is None else min(POLL_SECONDS, deadline - time.monotonic())
            if left <= 0:
                return self.stop_waiting(timeout)
            ready = wait([self._connection, self._process.sentinel], timeout=left)
            if self._connection in ready:
                try:
                    kind, value = transport.loads(self._connection.recv_bytes())
                except (EOFError, OSError):
                    return Outcome(crash=self._ended())
                if kind == "value":
                    return Outcome(value=value)
                if kind == "fault":  # the task left its device unusable: the next task needs a new process
                    self.stop()
                return Outcome(raised=value, fault=kind == "fault", unsent=kind == "unsent")
            if self._process.sentinel in ready:
                return Outcome(crash=self._ended())

    def stack_now(self):
        """The child's Python stacks, as faulthandler writes them when asked (where a task that hangs waits)."""
        if not hasattr(signal, "SIGUSR1") or self._process is None or not self._process.is_alive():
            return ""
        os.kill(self._process.pid, signal.SIGUSR1)
        time.sleep(STACK_SECONDS)
        return _read(self._log)

    def _ended(self):
        """The Crash of a child that died, read from its exit code and the tail of its log; the next task starts
        a new child."""
        self._process.join(5)
        crash = Crash(self._process.exitcode, _read(self._log))
        self._forget()
        return crash

    def _ensure_started(self):
        if self._process is not None and self._process.is_alive():
            return
        self._forget()
        context = multiprocessing.get_context(start_method())
        if start_method() == "forkserver":  # children forked from a server that has imported torch start at once
            context.set_forkserver_preload(["torch", "pytest_autograd.engine.processes.child"])
        parent_end, child_end = context.Pipe(duplex=True)
        handle, self._log = tempfile.mkstemp(prefix=f"pytest-autograd-{self.name}-", suffix=".log")
        os.close(handle)
        self._make_marks()
        farewell_to = None if self._farewell_fd is None else _InheritedFd(self._farewell_fd)
        process = context.Process(target=_serve, args=(child_end, self._log, self.environment, self.farewell,
                                                        self._marks, farewell_to),
                                  name=f"pytest-autograd-{self.name}", daemon=True)
        with _main_module_hidden():
            process.start()
        child_end.close()
        self._process, self._connection = process, parent_end
        self.starts += 1
        _LIVE.add(self)

    def farewell_to(self, fd):
        """Write the farewell to ``fd`` (a copy is kept): the session's stderr as pytest's capture left it, where
        a child started while an item's output is captured would write it into the capture."""
        self._farewell_fd = os.dup(fd)
        self._make_marks()  # items may start before the child has: what they mark must wait for it

    def _make_marks(self):
        if self.farewell and self._marks is None:
            handle, self._marks = tempfile.mkstemp(prefix=f"pytest-autograd-{self.name}-", suffix=".where")
            os.close(handle)
            atexit.register(remove_quietly, self._marks)  # before the child is stopped: a normal end bids no farewell

    def mark(self, where):
        """Say what the session is doing now (the item running), for the farewell of a child whose session died."""
        if self._marks is not None:
            with open(self._marks, "w") as marks:
                marks.write(where)

    def stop(self):
        """End the child now (killed if it does not answer); the next task starts a new one."""
        if self._process is not None and self._process.is_alive():
            self._process.kill()
            self._process.join(5)
        self._forget()

    def _forget(self):
        if self._connection is not None:
            self._connection.close()
        if self._log is not None and os.path.exists(self._log):
            os.unlink(self._log)
        self._process = self._connection = self._log = self._state = None
        _LIVE.discard(self)


FAREWELL = ("pytest-autograd: the test session's process died while running {where}, without a word of its own: "
            "an op's native code crashed it there, in pytest's own process. --autograd-isolate=all runs every check in "
            "a sandbox process, where such a crash is reported as the check's failure and the session goes on.\n")
_LIVE = set()
_SANDBOX = {}  # pid -> the sandbox worker of that process (a forked child never uses its parent's)


def sandbox():
    """This process's worker for trial runs, created on first use."""
    pid = os.getpid()
    if pid not in _SANDBOX:
        _SANDBOX.clear()
        _SANDBOX[pid] = Worker("sandbox", farewell=FAREWELL)
    return _SANDBOX[pid]


def start_method():
    """forkserver where the platform has it (each child is forked from a server that has imported torch, so a
    restart costs milliseconds), spawn elsewhere. Never fork: the session may hold CUDA and thread pools."""
    return "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"


def remove_quietly(path):
    """Remove a file that may be gone already (the child or the parent took it first)."""
    try:
        os.unlink(path)
    except OSError:  # the child took it, bidding farewell
        pass


@atexit.register
def _stop_all():
    for worker in list(_LIVE):
        worker.stop()


@contextmanager
def _main_module_hidden():
    """Start a child without it importing the parent's ``__main__`` (multiprocessing would run a script that calls
    ``run_checks`` unguarded again there, and start its checks in the child)."""
    main = sys.modules.get("__main__")
    saved = {name: main.__dict__[name] for name in ("__spec__", "__file__") if main is not None and name in main.__dict__}
    try:
        if main is not None:
            main.__spec__ = None
            main.__dict__.pop("__file__", None)
        yield
    finally:
        if main is not None:
            main.__dict__.update(saved)


def _serve(connection, log, environment, farewell, marks, farewell_to):
    from pytest_autograd.engine.processes.child import serve

    serve(connection, log, environment, farewell, marks, farewell_to)


class _InheritedFd:
    """A file descriptor of the parent that the child receives a copy of, whatever the start method."""

    def __init__(self, fd):
        self.fd = fd

    def __reduce__(self):  # pickled while multiprocessing starts the child: DupFd hands the fd over then
        from multiprocessing.reduction import DupFd

        return _detached, (DupFd(self.fd),)


def _detached(duplicate):
    return duplicate.detach()


def _read(path):
    """What the child wrote to its log during its last task (the child empties it at each task's start)."""
    try:
        with open(path, "rb") as log:
            log.seek(0, os.SEEK_END)
            log.seek(max(0, log.tell() - LOG_BYTES))
            return log.read().decode("utf-8", "replace")
    except (OSError, TypeError):
        return ""


__all__ = ["Crash", "Outcome", "Worker", "sandbox", "start_method"]
