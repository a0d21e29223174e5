"""The installed package, imported the way a user imports it.

Run by run_pip_install.sh with the virtual environment's python, from a folder
outside the source and build trees, in isolated mode (-I): what it imports
comes from the environment's site-packages (NumPy from the system's, through
--system-site-packages), never from the repository.

    python -I smoke.py <venv> <version>
"""

import importlib.metadata
import os
import sys

import numpy as np

import dlasync

venv, version = os.path.realpath(sys.argv[1]), sys.argv[2]
location = os.path.realpath(dlasync.__file__)
assert location.startswith(venv + os.sep), f"dlasync imported from {location}, not from {venv}"
assert os.path.realpath(dlasync._core.__file__).startswith(venv + os.sep), dlasync._core.__file__
installed = importlib.metadata.version("dlasync")
assert installed == version, f"installed version {installed}, the project's is {version}"

a = np.arange(24, dtype=np.float32).reshape(4, 6)
with dlasync.Runtime(cuda="sim:1") as rt:
    on_cpu = rt.from_dlpack(a, device="cpu:0")
    assert str(on_cpu.device) == "cpu:0" and on_cpu.shape == (4, 6), (on_cpu.device, on_cpu.shape)
    np.testing.assert_array_equal(np.from_dlpack(on_cpu), a)

    on_gpu = rt.from_dlpack(a, device="cuda:0")
    assert str(on_gpu.device) == "cuda:0" and rt.is_simulated(on_gpu.device), on_gpu.device
    assert on_gpu.is_copy
    back = rt.from_dlpack(on_gpu, device="cpu")
    np.testing.assert_array_equal(np.from_dlpack(back), a)

    try:
        rt.from_dlpack(a, copy=1)
    except TypeError as e:
        assert "copy" in str(e) and "True, False or None" in str(e), str(e)
    else:
        raise AssertionError("copy=1 was accepted; a TypeError was expected")

print(f"dlasync {installed} from {location}: cpu:0 and simulated cuda:0 imports match NumPy")
