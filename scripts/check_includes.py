"""The component boundaries, checked on every #include of the C++ sources.

The rules (docs/architecture.md, "Checks that keep the map true"):
- a component includes another one's headers only through its public headers
  (<component>/include/dlasync/...) or through a private header declared in
  cmake/component_interfaces.txt for that pair; a declaration may name a folder
  inside the including component instead (transfer/src/import), and then only the
  files under that folder may include the header;
- no lower layer includes a higher one (runtime < transfer < remote < python);
- no installed header (<component>/include/dlasync/...) includes a private one;
- tests/ may include anything; examples/ and bench/ include public headers, their own
  files and what is declared for them; nothing else includes tests/ or examples/.

Each violation prints as `file:line: includes X, which <component> does not offer to
<component>` and the exit status is 1. Runs with the system Python alone.

    check_includes.py [--root DIR] [--self-test]
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

LAYERS = ["runtime", "transfer", "remote", "python"]
SCANNED = LAYERS + ["tests", "examples", "bench"]
EXTENSIONS = (".cpp", ".hpp", ".cu", ".cuh", ".h", ".cc")
INTERFACES = "cmake/component_interfaces.txt"
INCLUDE = re.compile(r'^\s*#\s*include\s*(["<])([^">]+)[">]')
# The roots that tests/ and examples/ put on the include path for their own files.
OWN_ROOTS = {"support": "tests", "common": "examples"}


def read_interfaces(root):
    """{(including scope, private header)} from the declarations file; a scope is a
    component or a folder inside one."""
    declared = set()
    path = os.path.join(root, INTERFACES)
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            words = line.split("#", 1)[0].split()
            if not words:
                continue
            if len(words) < 3:
                sys.exit(f"{INTERFACES}:{number}: want '<component> <header> <reason>'")
            scope, header = words[0].rstrip("/"), words[1]
            component = scope.split("/", 1)[0]
            owner = header.split("/", 1)[0]
            if component not in SCANNED or owner not in LAYERS or owner == component:
                sys.exit(f"{INTERFACES}:{number}: {component} {header} is not a crossing "
                         "between two components")
            if component in LAYERS and LAYERS.index(owner) > LAYERS.index(component):
                sys.exit(f"{INTERFACES}:{number}: {owner} sits above {component}; "
                         "a lower layer cannot be offered its headers")
            if scope != component and not os.path.isdir(os.path.join(root, scope)):
                sys.exit(f"{INTERFACES}:{number}: {scope} is not a folder; "
                         "name the component or a folder inside it")
            if not os.path.isfile(os.path.join(root, header)):
                sys.exit(f"{INTERFACES}:{number}: {header} does not exist; "
                         "remove the stale declaration")
            declared.add((scope, header))
    return declared


def sources(root):
    for top in SCANNED:
        for directory, subdirs, files in os.walk(os.path.join(root, top)):
            subdirs[:] = sorted(d for d in subdirs if d != "__pycache__")
            for name in sorted(files):
                if name.endswith(EXTENSIONS):
                    yield os.path.relpath(os.path.join(directory, name), root)


def public_owner(root, header):
    """The component whose include/ holds `header` ("dlasync/..."), or None."""
    for component in LAYERS:
        if os.path.isfile(os.path.join(root, component, "include", header)):
            return component
    return None


def classify(root, includer, header, quoted):
    """(owner component, is public) of an included project header, or None when the
    header is not ours (the standard library, asio, absl, ...) or is a file of the
    includer's own folder."""
    first = header.split("/", 1)[0]
    if first == "dlasync":
        owner = public_owner(root, header)
        if owner is None:
            owner = header.split("/")[1] if header.count("/") >= 2 else "transfer"
        return owner, True
    if not quoted:
        return None
    if first in LAYERS and "/" in header:
        return first, header.startswith(f"{first}/include/dlasync/")
    if first in OWN_ROOTS and "/" in header:
        return OWN_ROOTS[first], False
    return None


def scopes_of(declared, component, header):
    """The scopes declared for `header` inside `component`."""
    return sorted(scope for scope, h in declared
                  if h == header and scope.split("/", 1)[0] == component)


def violations(root):
    declared = read_interfaces(root)
    used = set()
    found = []
    for path in sources(root):
        component = path.split(os.sep, 1)[0]
        installed = path.startswith(f"{component}/include/dlasync/")
        with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
            lines = f.readlines()
        for number, line in enumerate(lines, 1):
            match = INCLUDE.match(line)
            if not match:
                continue
            header = match.group(2)
            owner_public = classify(root, component, header, match.group(1) == '"')
            if owner_public is None:
                continue
            owner, public = owner_public
            why = None
            if installed and not public:
                why = f"which {owner} does not offer to {component}'s installed headers"
            elif component == "tests" or owner == component:
                continue
            elif (component in LAYERS and owner in LAYERS
                  and LAYERS.index(owner) > LAYERS.index(component)):
                why = f"which {owner} does not offer to {component} ({owner} sits above it)"
            elif not public:
                scopes = scopes_of(declared, component, header)
                inside = [s for s in scopes
                          if s == component or path.startswith(s + os.sep)]
                if inside:
                    used.add((inside[0], header))
                elif scopes:
                    why = (f"which {owner} offers only to {', '.join(scopes)} "
                           f"({INTERFACES}): reach it through the services those lend")
                else:
                    why = (f"which {owner} does not offer to {component} (declare it in "
                           f"{INTERFACES} with a reason, or use a public header)")
            if why:
                found.append(f"{path}:{number}: includes {header}, {why}")
    for scope, header in sorted(declared - used):
        found.append(f"{INTERFACES}: {scope} no longer includes {header}; "
                     "remove its declaration")
    return found


def check(root):
    found = violations(root)
    for line in found:
        print(line)
    if found:
        print(f"check-includes: {len(found)} finding(s) against the component boundaries")
        return 1
    print("check-includes: every include keeps to the component boundaries")
    return 0


# Each planted line must be refused, with the words that name the broken rule.
PLANTS = [
    ("transfer/src/import/import.cpp", '#include "runtime/src/releaser.hpp"',
     "includes runtime/src/releaser.hpp, which runtime does not offer to transfer"),
    ("transfer/src/copy/host_copy.cpp", '#include "runtime/src/runtime_core.hpp"',
     "includes runtime/src/runtime_core.hpp, which runtime offers only to transfer/src/import"),
    ("runtime/src/releaser.cpp", '#include "dlasync/tensor.hpp"',
     "includes dlasync/tensor.hpp, which transfer does not offer to runtime"),
    ("transfer/src/import/import.cpp", '#include "remote/src/protocol.hpp"',
     "includes remote/src/protocol.hpp, which remote does not offer to transfer"),
    ("remote/src/node.cpp", '#include "python/src/py_errors.hpp"',
     "includes python/src/py_errors.hpp, which python does not offer to remote"),
    ("runtime/include/dlasync/runtime.hpp", '#include "runtime/src/releaser.hpp"',
     "includes runtime/src/releaser.hpp, which runtime does not offer to runtime's installed"),
    ("python/src/module.cpp", '#include "remote/src/protocol.hpp"',
     "includes remote/src/protocol.hpp, which remote does not offer to python"),
    ("examples/pipeline/pipeline.cpp", '#include "runtime/src/runtime_core.hpp"',
     "includes runtime/src/runtime_core.hpp, which runtime does not offer to examples"),
    ("bench/bench_host.cpp", '#include "support/test_tensors.hpp"',
     "includes support/test_tensors.hpp, which tests does not offer to bench"),
]


def self_test(root):
    """Copies the sources to a temporary tree, checks that it passes, then plants one
    crossing at a time and checks that each is refused with its message."""
    me = os.path.abspath(__file__)
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for path in list(sources(root)) + [INTERFACES]:
            os.makedirs(os.path.join(tmp, os.path.dirname(path)), exist_ok=True)
            shutil.copyfile(os.path.join(root, path), os.path.join(tmp, path))

        def run():
            return subprocess.run([sys.executable, me, "--root", tmp],
                                  capture_output=True, text=True)

        clean = run()
        if clean.returncode != 0:
            print("self-test: the unchanged copy fails:\n" + clean.stdout + clean.stderr)
            return 1
        for path, line, expected in PLANTS:
            target = os.path.join(tmp, path)
            with open(target, encoding="utf-8") as f:
                original = f.read()
            with open(target, "w", encoding="utf-8") as f:
                f.write(line + "\n" + original)
            result = run()
            with open(target, "w", encoding="utf-8") as f:
                f.write(original)
            want = f"{path}:1: {expected}"
            if result.returncode != 1 or want not in result.stdout:
                failures += 1
                print(f"self-test: planting {line} in {path} was not refused as "
                      f"'{want}' (exit {result.returncode}):\n{result.stdout}{result.stderr}")
    if failures:
        return 1
    print(f"check-includes self-test: all {len(PLANTS)} planted crossings refused")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=os.path.join(os.path.dirname(__file__), ".."))
    parser.add_argument("--self-test", action="store_true")
    args = parser.parse_args()
    root = os.path.abspath(args.root)
    return self_test(root) if args.self_test else check(root)


if __name__ == "__main__":
    sys.exit(main())
