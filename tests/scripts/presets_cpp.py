"""The model presets of tools/bench/support/presets.cpp as the peer scripts'
tests read them: name -> (E, H, I, K)."""
import os
import re

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def presets_from_cpp():
    """name -> (E, H, I, K) from tools/bench/support/presets.cpp."""
    text = open(os.path.join(ROOT, "tools", "bench", "support", "presets.cpp")).read()
    found = {}
    for m in re.finditer(r'\{"([\w.-]+)", "[^"]*",[^{]*?make\(P::\w+, (\d+), (\d+), (\d+), (\d+)\)', text):
        name, e, h, i, k = m.group(1), *map(int, m.groups()[1:])
        found[name] = (e, h, i, k)
    return found
