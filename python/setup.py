"""`pip install ./python`: the repository root's setup.py, run from here.

The module is built from the whole repository (the library it links is
there), so this folder installs only inside a checkout.
"""

import runpy
from pathlib import Path

runpy.run_path(str(Path(__file__).resolve().parent.parent / "setup.py"), run_name="__main__")
