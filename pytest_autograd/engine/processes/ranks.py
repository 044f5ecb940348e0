"""The ranks of a real process group: ``world_size`` workers that run one task together.

Each rank is a :class:`~pytest_autograd.engine.processes.Worker`, so what
holds for the sandbox holds here: tensors cross by value in their layout, a
crash ends the rank's process and not the session. The ranks join one
default process group (gloo on CPU, NCCL with one GPU per rank on CUDA) at a
rendezvous file of their own, so two groups (pytest-xdist workers) never meet,
and keep it for the items that come. A task runs on every rank at once; when
one rank crashes or raises, the others, most likely waiting in a collective
it never reached, are given a moment, then asked where they wait and stopped.
The group is formed again for the next task.
"""

import atexit
import os
import tempfile
import time

from pytest_autograd.engine.processes import POLL_SECONDS, Crash, Worker

GRACE_SECONDS = 3.0  # after one rank failed, how long the others may take to finish before they are stopped ...
FINISHED_GRACE_SECONDS = 10.0  # ... and after one finished (the others most likely wait in a collective it skipped)
JOIN_SECONDS = 120.0  # forming the group (each rank imports torch.distributed, NCCL creates its communicators)


class RankGroup:
    """Ranks 0 to ``world_size - 1`` of one process group on ``device_type`` ("cpu": gloo, "cuda": NCCL)."""

    def __init__(self, world_size, device_type="cpu"):
        self.world_size = world_size
        self.device_type = device_type
        self.backend = "nccl" if device_type == "cuda" else "gloo"
        self.workers = [Worker(f"rank{rank}") for rank in range(world_size)]
        self._formed_with = None  # the setup functions the group was formed with; None: not formed
        self._rendezvous = None

    def run(self, function, per_rank_args, timeout=None, setups=()):
        """``function(rank, *per_rank_args[rank])`` on every rank at once, the group formed (and each function of
        ``setups`` called with (rank, world_size) on every rank) first; one Outcome per rank. A rank that has
        not answered ``timeout`` seconds after the start, or ``GRACE_SECONDS`` after another rank failed, is
        stopped as hung, with the stacks it waited in."""
        from pytest_autograd.engine.budget import paused

        setups = tuple(setups)
        if self._formed_with != setups:
            with paused():  # forming the group is not the op's time
                formed = self._form(setups)
            if formed is not None:
                return formed
        try:
            outcomes = self._together(function, [(rank, *args) for rank, args in enumerate(per_rank_args)], timeout)
        except BaseException as stopped:  # a time budget or ^C while the ranks work: where they were, then stop
            if not isinstance(stopped, Exception):
                stopped.frames_elsewhere = [frame for worker in self.workers
                                            for frame in Crash(None, worker.stack_now()).frames()]
            self.stop()
            raise
        if not all(outcome.returned for outcome in outcomes):
            self.stop()
        return outcomes

    def _form(self, setups):
        """Form the group: None when every rank joined, else the Outcomes of the ranks that did not."""
        self.stop()
        self._rendezvous = tempfile.mkdtemp(prefix="pytest-autograd-ranks-")
        address = "file://" + os.path.join(self._rendezvous, "store")
        arguments = [(rank, self.world_size, self.backend, address, setups) for rank in range(self.world_size)]
        outcomes = self._together(join_group, arguments, JOIN_SECONDS)
        if all(outcome.returned for outcome in outcomes):
            self._formed_with = setups
            return None
        self.stop()
        return outcomes

    def _together(self, function, arguments, timeout):
        for worker, args in zip(self.workers, arguments):
            worker.submit(function, *args)
        start = time.monotonic()
        deadline = None if timeout is None else start + timeout
        outcomes = [None] * len(self.workers)
        while any(outcome is None for outcome in outcomes):
            for rank, worker in enumerate(self.workers):
                if outcomes[rank] is None:
                    outcomes[rank] = worker.answered()
            finished = [outcome for outcome in outcomes if outcome is not None]
            if finished and len(finished) < len(outcomes):
                grace = FINISHED_GRACE_SECONDS if all(o.returned for o in finished) else GRACE_SECONDS
                if deadline is None or deadline > time.monotonic() + grace:
                    deadline = time.monotonic() + grace
            if deadline is not None and time.monotonic() >= deadline:
                for rank, worker in enumerate(self.workers):
                    if outcomes[rank] is None:
                        outcomes[rank] = worker.stop_waiting(time.monotonic() - start)
            elif any(outcome is None for outcome in outcomes):
                time.sleep(min(POLL_SECONDS / 25, 0.01))
        return outcomes

    def stop(self):
        """End every rank; the next task forms the group anew."""
        for worker in self.workers:
            worker.stop()
        self._formed_with = None
        if self._rendezvous is not None:
            _remove(self._rendezvous)
            self._rendezvous = None


def join_group(rank, world_size, backend, address, setups):
    """On a rank: join the default process group (its GPU first, on NCCL), then run the project's setups."""
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    if backend == "nccl":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group(backend, init_method=address, rank=rank, world_size=world_size)
    for setup in setups:
        setup(rank, world_size)
    dist.barrier()
    return rank


_GROUPS = {}  # (pid, world size, device type) -> RankGroup


def rank_group(world_size, device_type="cpu"):
    """This process's group of ``world_size`` ranks on ``device_type``, formed on first use and kept."""
    key = (os.getpid(), world_size, device_type)
    if key not in _GROUPS:
        _GROUPS[key] = RankGroup(world_size, device_type)
    return _GROUPS[key]


@atexit.register
def _stop_groups():
    """At the session's end: the ranks stopped, their rendezvous files removed."""
    for key, group in list(_GROUPS.items()):
        if key[0] == os.getpid():
            group.stop()


def _remove(directory):
    import shutil

    shutil.rmtree(directory, ignore_errors=True)


__all__ = ["RankGroup", "join_group", "rank_group"]
