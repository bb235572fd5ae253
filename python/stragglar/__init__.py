"""stragglar: where the installed library, CLI and headers are.

    import stragglar
    stragglar.library_path()   # the libstragglar shared object, for LD_PRELOAD
    stragglar.include_path()   # nccl.h and stragglar.h, for C and C++ builds
    stragglar.cli_path()       # the `stragglar` command (`stragglar run -- torchrun ...`)
"""

import glob
import os
import shutil
import sys

__all__ = ["library_path", "include_path", "cli_path"]

_HERE = os.path.dirname(os.path.abspath(__file__))


def library_path():
    """The absolute path of the installed libstragglar shared object."""
    found = sorted(glob.glob(os.path.join(_HERE, "libstragglar*.so")))
    if not found:
        raise FileNotFoundError("no libstragglar*.so in " + _HERE)
    return found[0]


def include_path():
    """The folder holding nccl.h and stragglar.h."""
    return os.path.join(_HERE, "include")


def cli_path():
    """The `stragglar` command installed with this package (in the environment's `bin/`), else
    the one on PATH, else None."""
    beside = os.path.join(sys.prefix, "bin", "stragglar")
    if os.access(beside, os.X_OK):
        return beside
    return shutil.which("stragglar")
