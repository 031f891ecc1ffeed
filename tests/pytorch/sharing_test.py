# SPDX-License-Identifier: Apache-2.0
"""gpukit_torch._sharing without torch or a GPU: a tensor reducer that fails in an mp.Queue feeder
thread reaches the receiver as an error that raises (not a hang) and warns the sender; a failure
in the calling thread raises there; install() guards every registration of torch's reducer, once.
A stand-in object plays the CUDA tensor (its reducer fails, as gpukit's shareIpcHandle does when
pidfd_getfd is refused); the receiver is another process. Usage: sharing_test.py (CTest runs it)."""

import multiprocessing
import os
import pickle
import queue
import sys
import threading
import types
import unittest
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "bindings", "torch"))
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
from multiprocessing.reduction import ForkingPickler  # noqa: E402

from gpukit_torch import _sharing  # noqa: E402 (imports no torch)

REFUSAL = ("gpukit: pidfd_getfd failed: not permitted (EPERM). Setting "
           "GPUKIT_ALLOC_CONF=segments:synchronous shares tensors through CUDA IPC handles")


class Unshareable:
    """Stands for a CUDA tensor whose memory cannot be shared."""


class Shareable:
    def __init__(self, value):
        self.value = value


def refuse(obj):
    raise RuntimeError(REFUSAL)


def rebuild(value):
    return Shareable(value)


def share(obj):
    return rebuild, (obj.value,)


def receive(q, answers, timeouts):
    """The receiving process: reports what each get() gave or raised, waiting up to each timeout."""
    for timeout in timeouts:
        try:
            got = q.get(timeout=timeout)
            answers.put(("value", got.value))
        except queue.Empty:
            answers.put(("hang", f"nothing arrived in {timeout} s"))
        except Exception as e:  # noqa: BLE001 (the test checks what it was)
            answers.put((type(e).__name__, str(e)))


class FeederThread(unittest.TestCase):
    def setUp(self):
        self.saved = dict(ForkingPickler._extra_reducers)
        self.warned = []
        self.saved_show = warnings.showwarning
        warnings.simplefilter("always")
        warnings.showwarning = self.record_warning

    def record_warning(self, message, category, *args, **kwargs):
        if issubclass(category, RuntimeWarning):  # not, e.g., a DeprecationWarning of fork()
            self.warned.append(str(message))

    def tearDown(self):
        ForkingPickler._extra_reducers.clear()
        ForkingPickler._extra_reducers.update(self.saved)
        warnings.showwarning = self.saved_show
        warnings.resetwarnings()

    def exchange(self, guarded):
        """Puts an unshareable then a shareable object on an mp.Queue to another process."""
        ForkingPickler.register(Unshareable, _sharing.guard_reducer(refuse) if guarded else refuse)
        ForkingPickler.register(Shareable, share)
        ctx = multiprocessing.get_context("fork")
        q, answers = ctx.Queue(), ctx.Queue()
        # Unguarded, the second get() waits for an item that never comes: 5 s says enough.
        timeouts = (60, 60) if guarded else (60, 5)
        p = ctx.Process(target=receive, args=(q, answers, timeouts))
        p.start()
        q.put(Unshareable())
        q.put(Shareable(7))
        got = [answers.get(timeout=90) for _ in range(2)]
        p.join(30)
        self.assertEqual(p.exitcode, 0)
        q.close()
        q.join_thread()
        return got

    def test_a_refusal_in_the_feeder_reaches_the_receiver_and_warns_the_sender(self):
        got = self.exchange(guarded=True)
        self.assertEqual(got[0][0], "SharingError")
        self.assertIn("EPERM", got[0][1])
        self.assertIn("GPUKIT_ALLOC_CONF=segments:synchronous", got[0][1])
        self.assertIn("Unshareable", got[0][1])
        self.assertEqual(got[1], ("value", 7))  # the queue goes on working
        self.assertEqual(len(self.warned), 1, self.warned)
        self.assertIn("EPERM", self.warned[0])

    def test_without_the_guard_the_item_is_lost(self):
        # What the guard prevents: the feeder prints the error and drops the item, so the
        # receiver's first get() takes the next item (or, with none, waits forever).
        stderr = sys.stderr
        sys.stderr = open(os.devnull, "w")  # the feeder's traceback
        try:
            got = self.exchange(guarded=False)
        finally:
            sys.stderr.close()
            sys.stderr = stderr
        self.assertEqual(got[0], ("value", 7))
        self.assertEqual(got[1][0], "hang")

    def test_in_the_calling_thread_the_error_is_raised_there(self):
        ForkingPickler.register(Unshareable, _sharing.guard_reducer(refuse))
        with self.assertRaisesRegex(RuntimeError, "EPERM"):
            ForkingPickler.dumps(Unshareable())
        errors = []

        def worker():  # any thread but a queue's feeder
            try:
                ForkingPickler.dumps(Unshareable())
            except RuntimeError as e:
                errors.append(str(e))

        t = threading.Thread(target=worker, name="worker")
        t.start()
        t.join()
        self.assertEqual(errors, [REFUSAL])
        self.assertEqual(self.warned, [])

    def test_what_shares_is_untouched(self):
        guarded = _sharing.guard_reducer(share)
        self.assertIs(guarded.__wrapped__, share)
        self.assertEqual(guarded(Shareable(3)), (rebuild, (3,)))
        # The receiver's side of a refusal unpickles into a raise.
        with self.assertRaisesRegex(_sharing.SharingError, "why"):
            pickle.loads(pickle.dumps(_Refused("why")))


class _Refused:
    def __init__(self, message):
        self.message = message

    def __reduce__(self):
        return _sharing._raise_sharing_error, (self.message,)


class Install(unittest.TestCase):
    def test_install_guards_every_registration_of_torch_reducer_once(self):
        reduce_tensor = lambda t: (rebuild, (1,))  # noqa: E731 (torch's reduce_tensor)
        torch = types.ModuleType("torch")
        torch_mp = types.ModuleType("torch.multiprocessing")
        reductions = types.ModuleType("torch.multiprocessing.reductions")
        reductions.reduce_tensor = reduce_tensor
        torch.multiprocessing, torch_mp.reductions = torch_mp, reductions
        saved_modules = {k: sys.modules.get(k) for k in (torch.__name__, torch_mp.__name__,
                                                         reductions.__name__)}
        saved = dict(ForkingPickler._extra_reducers)
        sys.modules.update({m.__name__: m for m in (torch, torch_mp, reductions)})
        try:
            class Tensor:
                pass

            class Parameter(Tensor):
                pass

            ForkingPickler.register(Tensor, reduce_tensor)
            ForkingPickler.register(Parameter, reduce_tensor)
            ForkingPickler.register(Shareable, share)
            _sharing.install()
            _sharing.install()  # idempotent
            guarded = ForkingPickler._extra_reducers[Tensor]
            self.assertIs(guarded.__wrapped__, reduce_tensor)
            self.assertIs(ForkingPickler._extra_reducers[Parameter], guarded)
            self.assertIs(ForkingPickler._extra_reducers[Shareable], share)
        finally:
            ForkingPickler._extra_reducers.clear()
            ForkingPickler._extra_reducers.update(saved)
            for name, module in saved_modules.items():
                if module is None:
                    sys.modules.pop(name, None)
                else:
                    sys.modules[name] = module


if __name__ == "__main__":
    unittest.main(verbosity=2)
