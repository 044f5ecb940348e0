"""The child's side of a :class:`~pytest_autograd.engine.processes.Worker`: run tasks until the parent hangs up.

What the child writes goes to its own log, not to the session's output (whose
capture it would otherwise share); ``faulthandler`` writes the Python stack
of a crash there, which the parent reads back into its report.
"""

import faulthandler
import os
import signal
import pickle
import traceback

from pytest_autograd.engine.processes import remove_quietly, transport


def serve(connection, log, environment, farewell=None, marks=None, farewell_to=None):
    """Answer each task with ("value", result), ("raised", RaisedElsewhere) or ("fault", RaisedElsewhere) for
    an error that left the task's GPU unusable (the parent then starts a new child). When the parent hangs up
    without stopping the child (it died), write ``farewell`` to the session's stderr (``farewell_to``, else the
    stderr the child was started with), saying where it was."""
    session_stderr = os.dup(2) if farewell_to is None else farewell_to
    _write_to(log)
    os.environ.update(environment)
    while True:
        try:
            message = connection.recv_bytes()
        except (EOFError, OSError):
            _farewell(session_stderr, farewell, marks)
            remove_quietly(log)  # nobody reads it now
            return
        kind, value = _run(message)
        try:
            answer = transport.dumps((kind, value))
        except Exception as error:  # a result that cannot cross back
            answer = transport.dumps(("raised", _raised(error)))
        connection.send_bytes(answer)


def _farewell(stderr, farewell, marks):
    """The parent stops a child it is done with; a child that finds its parent gone outlived a crash."""
    if not farewell or not marks:
        return
    try:
        with open(marks) as found:
            where = found.read().strip()
        os.unlink(marks)
        if where:  # the session's process ended between items (normally, or killed from outside): not an op's crash
            os.write(stderr, ("\n" + farewell.format(where=where)).encode())
    except OSError:
        pass


def _run(message):
    os.ftruncate(2, 0)  # the log holds this task's words only (fds 1 and 2 append to it)
    try:
        function, args = _task(message)
    except BaseException as error:  # the task could not be rebuilt here (a module that cannot be imported)
        return "unsent", _raised(error)
    try:
        return "value", function(*args)
    except BaseException as error:  # everything the task raised goes back to the parent as its outcome
        from pytest_autograd.engine.device_faults import is_device_fault

        return ("fault" if is_device_fault(error) else "raised"), _raised(error)


def _task(message):
    state_bytes, task_bytes = pickle.loads(message)
    if state_bytes is not None:  # sent when it changed since the last task
        transport.apply_parent_state(pickle.loads(state_bytes))
    return transport.loads(task_bytes)


def _raised(error):
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    return transport.RaisedElsewhere(type(error).__name__, str(error), text[-4000:])


def _write_to(log):
    handle = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    os.dup2(handle, 1)
    os.dup2(handle, 2)
    os.close(handle)
    stream = open(log, "a", buffering=1)
    faulthandler.enable(file=stream, all_threads=True)
    if hasattr(signal, "SIGUSR1"):  # the parent asks where a task that does not return is waiting
        faulthandler.register(signal.SIGUSR1, file=stream, all_threads=True)
