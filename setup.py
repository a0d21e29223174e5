"""Builds and installs the Python module dlasync with CMake.

    python3 -m pip install --no-build-isolation .      # offline, Debian's pip and setuptools
    python3 -m pip install --no-build-isolation ./python   # the same, from python/

The package is python/dlasync plus the extension dlasync._core, which is the
CMake target dlasync_python: build_ext configures the project (Release, the
module alone: no tests, examples or benchmarks), builds that one target and
copies the extension into the wheel. The module is built for the interpreter
that runs pip, which needs pybind11's CMake config for it: Debian's
/usr/bin/python3, or a virtual environment made from it.

Nothing is written into the source tree: setuptools and CMake build in the
folder DLASYNC_PIP_BUILD_DIR names (kept, so that a second install rebuilds
only what changed), else in a temporary folder removed when pip's build step
ends. CMAKE_<LANG>_COMPILER_LAUNCHER (ccache) and CMAKE_BUILD_PARALLEL_LEVEL
are taken from the environment.
"""

import atexit
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

source_dir = Path(__file__).resolve().parent


def project_version():
    """The version of CMakeLists.txt's project(), the one number the project keeps."""
    text = (source_dir / "CMakeLists.txt").read_text(encoding="utf-8")
    match = re.search(r"project\(\s*dlasync\s+VERSION\s+([0-9]+(?:\.[0-9]+)*)", text)
    if match is None:
        sys.exit(f"setup.py: no 'project(dlasync VERSION x.y.z' in {source_dir / 'CMakeLists.txt'}")
    return match.group(1)


def build_base():
    """Where setuptools and CMake build: never the source tree, whose build/ is CMake's own."""
    given = os.environ.get("DLASYNC_PIP_BUILD_DIR")
    if given:
        path = Path(given).resolve()
        path.mkdir(parents=True, exist_ok=True)
        return path
    # pip runs each build step in a process of its own; each one's folder
    # goes when it ends, after the wheel has been written elsewhere.
    path = Path(tempfile.mkdtemp(prefix="dlasync-pip-build-"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


class cmake_build_ext(build_ext):
    """Builds each extension as its CMake target (all of them: dlasync._core)."""

    targets = {"dlasync._core": "dlasync_python"}

    def build_extension(self, ext):
        cmake = shutil.which("cmake")
        if cmake is None:
            sys.exit("setup.py: cmake is not on PATH (Debian: apt-get install cmake)")
        cmake_dir = Path(self.build_temp).resolve() / "cmake"
        configure = [
            cmake, "-S", str(source_dir), "-B", str(cmake_dir),
            "-DCMAKE_BUILD_TYPE=Release",
            "-DDLASYNC_BUILD_TESTS=OFF", "-DDLASYNC_BUILD_EXAMPLES=OFF",
            "-DDLASYNC_BUILD_BENCH=OFF", "-DDLASYNC_BUILD_PYTHON=ON",
            # pybind11 2.10 finds Python through PYTHON_EXECUTABLE: the
            # interpreter that runs pip (a venv's python is its own).
            f"-DPYTHON_EXECUTABLE={sys.executable}",
        ]
        # The library's coroutines need g++ (clang 14 with libstdc++ 12 fails).
        compiler = shutil.which("g++-12")
        if compiler:
            configure.append(f"-DCMAKE_CXX_COMPILER={compiler}")
        # A generator cannot change once a build folder has one.
        if not (cmake_dir / "CMakeCache.txt").exists() and shutil.which("ninja"):
            configure += ["-G", "Ninja"]
        for lang in ("C", "CXX", "CUDA"):
            launcher = os.environ.get(f"CMAKE_{lang}_COMPILER_LAUNCHER")
            if launcher:
                configure.append(f"-DCMAKE_{lang}_COMPILER_LAUNCHER={launcher}")
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(os.cpu_count() or 1)
        build = [cmake, "--build", str(cmake_dir), "--config", "Release",
                 "--target", self.targets[ext.name], "--parallel", jobs]
        for command in (configure, build):
            print(" ".join(command), flush=True)
            subprocess.run(command, check=True)

        built = cmake_dir / "python" / "dlasync" / Path(self.get_ext_filename(ext.name)).name
        if not built.exists():
            found = sorted(p.name for p in built.parent.glob("_core*"))
            sys.exit(f"setup.py: CMake built no {built.name} for {sys.executable} "
                     f"(EXT_SUFFIX {sysconfig.get_config_var('EXT_SUFFIX')}); "
                     f"{built.parent} holds {found or 'nothing'}")
        destination = Path(self.get_ext_fullpath(ext.name))
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(built, destination)


# setuptools before 70.1 builds wheels with the package wheel; without it pip
# reports only "invalid command 'bdist_wheel'".
if (importlib.util.find_spec("wheel") is None
        and importlib.util.find_spec("setuptools.command.bdist_wheel") is None):
    sys.exit("setup.py: setuptools needs the package 'wheel' to build a wheel, and "
             f"{sys.executable} has none: make the virtual environment with "
             "--system-site-packages (Debian: apt-get install python3-wheel), or install "
             "'wheel' into it")

base = build_base()
setup(
    version=project_version(),
    # Relative to the folder pip runs this from: the repository root, or
    # python/ (whose setup.py runs this one).
    packages=["dlasync"],
    package_dir={"dlasync": os.path.relpath(source_dir / "python" / "dlasync")},
    ext_modules=[Extension("dlasync._core", sources=[])],
    cmdclass={"build_ext": cmake_build_ext},
    options={"build": {"build_base": str(base / "build")},
             "egg_info": {"egg_base": str(base)}},
    zip_safe=False,
)
