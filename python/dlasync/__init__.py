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
    bridge = _bridges.get(loop)
    if bridge is None:
        bridge = _core._LoopBridge()
        loop.add_reader(bridge.fd, bridge.drain)
        _bridges[loop] = bridge
    return bridge


async def _completion(future, call):
    """Awaits an import's future; cancelling the awaiting task cancels the
    import."""
    try:
        return await future
    except _asyncio.CancelledError:
        call.cancel()
        raise


class Runtime(_core.Runtime):
    __doc__ = _core.Runtime.__doc__

    async def import_dlpack(self, x, /, *, device=None, copy=None, stream=None,
                            require_contiguous=False, require_writable=False):
        """Imports `x` on the running asyncio loop; returns a Tensor.

        No thread waits for it: the completion reaches the loop through an
        eventfd. Validation and consumption happen at the call: an error
        raised before the first await leaves `x` untouched. Cancelling the
        awaiting task cancels the import (the producer's tensor is released
        once nothing reads it)."""
        loop = _asyncio.get_running_loop()
        future = loop.create_future()
        call = self._start_import(x, _bridge(loop), future, device=device, copy=copy,
                                  stream=stream, require_contiguous=require_contiguous,
                                  require_writable=require_writable)
        return await _completion(future, call)

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
        return await _completion(future, call)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()
        return False


_default = None


def from_dlpack(x, /, *, device=None, copy=None):
    """The array API's from_dlpack, on a runtime of the process made at first
    use (its CUDA setting from DLASYNC_CUDA, else "auto")."""
    global _default
    if _default is None:
        _default = Runtime()
    return _default.from_dlpack(x, device=device, copy=copy)


_atexit.register(_core._at_exit)
