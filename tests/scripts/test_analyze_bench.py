#!/usr/bin/env python3
"""scripts/analyze_bench.py's slower-than-peer note on known inputs."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "scripts"))
import analyze_bench as ab  # noqa: E402


def check(cond, what):
    if not cond:
        print("FAILED:", what)
        sys.exit(1)


def main():
    same = ab.slower_note("p", 64, 103.0, 100.0, 8.0, 8)
    check(same == "p T=64 (+3.0%)", same)
    more = ab.slower_note("p", 8, 102.0, 100.0, 7.0, 6)
    check(more == "p T=8 (+2.0%; 7 active experts here, 6 in the peer's run)", more)
    unknown = ab.slower_note("p", 8, 110.0, 100.0, None, 6)
    check(unknown == "p T=8 (+10.0%)", unknown)
    print("analyze_bench: ok")


if __name__ == "__main__":
    main()
