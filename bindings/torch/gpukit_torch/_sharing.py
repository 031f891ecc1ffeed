# SPDX-License-Identifier: Apache-2.0
"""CUDA tensors sent through torch.multiprocessing: a failure reaches the receiver, never a hang.

torch.multiprocessing pickles a CUDA tensor with ``reductions.reduce_tensor``, which asks the
allocator for a shareable handle. ``mp.Queue.put`` pickles in the queue's feeder thread, where
an exception is printed and the item silently dropped: the receiver would wait forever in
``get()``. install() (run by gpukit_torch.install()) wraps that reducer: a failure in a feeder
thread turns the item into one whose unpickling raises SharingError, with the sender's message,
in the receiver; the sender gets a RuntimeWarning with the same message. Anywhere else
(``SimpleQueue``, ``Pipe.send``, pickling by hand) the error is raised in the calling thread, as
before.

gpukit refuses to share growable memory where receivers could not open it (pidfd_getfd missing or
not permitted: a probe, once per process), with a message naming the cause and the setting that
avoids it (GPUKIT_ALLOC_CONF=segments:synchronous). This module needs torch only in install().
"""

import threading
import warnings
from multiprocessing.reduction import ForkingPickler

__all__ = ["SharingError", "guard_reducer", "install"]


class SharingError(RuntimeError):
    """A tensor sent to this process could not be shared by its sender (the message says why)."""


def _raise_sharing_error(message):
    # Called by the receiver's unpickler in place of rebuilding the tensor.
    raise SharingError(message)


def _in_feeder_thread():
    # multiprocessing.queues.Queue names the thread that pickles what put() queued.
    return threading.current_thread().name.startswith("QueueFeederThread")


def guard_reducer(reduce):
    """``reduce`` (a ForkingPickler reducer), made to hand a failure in an mp.Queue feeder thread
    to the receiver as SharingError (and warn the sender) instead of losing it."""

    def guarded(obj):
        try:
            return reduce(obj)
        except Exception as e:
            if not _in_feeder_thread():
                raise
            message = (
                f"gpukit: a {type(obj).__name__} put on a multiprocessing queue could not be "
                f"shared, so the receiver gets this error instead of it: {e}"
            )
            warnings.warn(message, RuntimeWarning, stacklevel=2)
            return _raise_sharing_error, (message,)

    guarded.__wrapped__ = reduce
    return guarded


_lock = threading.Lock()


def install():
    """Guards torch.multiprocessing's tensor reducer wherever ForkingPickler uses it. Idempotent."""
    from torch.multiprocessing import reductions  # noqa: PLC0415 (registers the reducers)

    original = reductions.reduce_tensor
    with _lock:
        reducers = ForkingPickler._extra_reducers
        guarded = None
        for cls, reducer in list(reducers.items()):
            if getattr(reducer, "__wrapped__", None) is original:
                guarded = reducer  # installed before
            elif reducer is original:
                guarded = guarded or guard_reducer(original)
                reducers[cls] = guarded
