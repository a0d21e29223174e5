"""dlasync: asynchronous, validated DLPack imports onto CPUs and GPUs.

    import dlasync, numpy as np
    with dlasync.Runtime(cuda="sim:1") as rt:
        t = rt.from_dlpack(np.arange(6.0), device="cuda:0")    # synchronous
        back = np.from_dlpack(rt.from_dlpack(t, device="cpu"))
        # in a coroutine:  t = await rt.import_dlpack(x, device="cuda:0")

See docs/python.md for the contract: ownership, streams, where deleters run,
and the errors.
"""

import asyncio as _asyncio
import atexit as _atexit
import weakref as _weakref

from . import _core
from ._core import Device, Tensor

__all__ = ["Runtime", "Tensor", "Device", "from_dlpack"]

_bridges = _weakref.WeakKeyDictionary()


def _bridge(loop):
    """The loop's bridge, made at its first import that waits."""
    bridge = _bridges.get(loop)
    if bridge is None:
        bridge = _core._LoopBridge()
        loop.add_reader(bridge.fd, bridge.drain)
        _bridges[loop] = bridge
    return bridge


# When the awaiting coroutine stops waiting (its task cancelled, or the
# coroutine closed) the import is cancelled, and `future` is let go there: a
# result that reached the future before the cancellation (resolved, but the
# task not yet resumed) would otherwise be kept, with its memory and copy
# budget, by the exception's traceback, which holds this frame's locals for
# as long as the task lives. The awaits are written out in each method, with
# no coroutine between them and the future, so that no other frame holds it.


class Runtime(_core.Runtime):
    __doc__ = _core.Runtime.__doc__

    async def import_dlpack(self, x, /, *, device=None, copy=None, stream=None,
                            require_contiguous=False, require_writable=False):
        """Imports `x` on the running asyncio loop; returns a Tensor.

        No thread waits for it: the completion reaches the loop through an
        eventfd. Validation and consumption happen at the call: an error
        raised before the first await leaves `x` untouched. Cancelling the
        awaiting task cancels the import (the producer's tensor is released
        once nothing reads it); a result that arrives anyway is released at
        once."""
        started = self._start_import(x, _asyncio.get_running_loop(), device=device,
                                     copy=copy, stream=stream,
                                     require_contiguous=require_contiguous,
                                     require_writable=require_writable)
        if type(started) is not tuple:
            return started  # a view, made at once: nothing to wait for
        call, future = started
        try:
            return await future
        except BaseException:
            call.cancel()
            future = started = None  # noqa: F841 (see above)
            raise

    async def import_batch(self, xs, /, *, device=None, copy=None, stream=None,
                           require_contiguous=False, require_writable=False,
                           return_exceptions=False):
        """Imports a sequence of tensors as one batch: validated together
        (when one is refused, none is taken), their copies' budget reserved
        at once. Returns a list of Tensors; with return_exceptions=True, a
        member that failed is its exception in the list, else the first
        failure is raised."""
        loop = _asyncio.get_running_loop()
        future = loop.create_future()
        call = self._start_batch(list(xs), _bridge(loop), future, return_exceptions,
                                 device=device, copy=copy, stream=stream,
                                 require_contiguous=require_contiguous,
                                 require_writable=require_writable)
        try:
            return await future
        except BaseException:
            call.cancel()
            future = None  # noqa: F841 (see above)
            raise

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()
        return False


_default = None


def _default_runtime():
    """The runtime of the process, made at first use (its CUDA setting from
    DLASYNC_CUDA, else "auto"): dlasync.from_dlpack's, and the exchange API's
    (managed_tensor_to_py_object_no_sync, managed_tensor_allocator)."""
    global _default
    if _default is None:
        _default = Runtime()
    return _default


def from_dlpack(x, /, *, device=None, copy=None):
    """The array API's from_dlpack, on the runtime of the process made at
    first use (its CUDA setting from DLASYNC_CUDA, else "auto")."""
    return _default_runtime().from_dlpack(x, device=device, copy=copy)


_atexit.register(_core._at_exit)
