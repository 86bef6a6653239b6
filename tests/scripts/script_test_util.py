"""What the scripts' tests share: a check that stops the test, writing a
JSON input file, and running a script's main() with its printed lines
captured."""
import contextlib
import io
import json
import os
import sys


def check(cond, what):
    """Stops the test with FAILED and `what` unless cond holds."""
    if not cond:
        print("FAILED:", what)
        sys.exit(1)


def write_json(folder, name, doc):
    """Writes doc as JSON to folder/name; returns the path."""
    path = os.path.join(folder, name)
    with open(path, "w") as f:
        json.dump(doc, f)
    return path


def run_main(main, argv):
    """(exit code, stdout) of main(argv)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(argv)
    return code, out.getvalue()
