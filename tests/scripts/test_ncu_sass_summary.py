#!/usr/bin/env python3
"""scripts/ncu_sass_summary.py on a synthetic ncu source page: two launches
of a 4-instruction kernel, whose samples and reasons add up by index."""
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "scripts", "ncu_sass_summary.py")
sys.path.insert(0, os.path.dirname(SCRIPT))
import ncu_sass_summary as nss  # noqa: E402

HEADER = ('"Address","Source","# Samples","Instructions Executed","stall_barrier",'
          '"stall_barrier (Not Issued)","stall_wait","stall_long_sb"')


def launch(samples):
    """One kernel section; samples[i] = (barrier, wait, long_sb) of instruction i."""
    code = ["LDG.E R2, desc[UR4][R2.64]", "FADD R3, R2, 1", "@!P0  BRA 0x10", "EXIT"]
    lines = ['"Kernel Name","void k(int)",', HEADER]
    for i, (src, (bar, wait, lsb)) in enumerate(zip(code, samples)):
        total = bar + wait + lsb
        lines.append(f'"0x{0x100 + 16 * i:x}","      {src}","{total}","8","{bar}","{bar}","{wait}","{lsb}"')
    return lines


def check(cond, what):
    if not cond:
        print("FAILED:", what)
        sys.exit(1)


def main():
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "prof.csv")
        with open(path, "w") as f:
            f.write("\n".join(launch([(0, 0, 5), (0, 3, 0), (7, 1, 0), (0, 0, 0)]) +
                              launch([(0, 0, 4), (0, 2, 0), (9, 0, 0), (0, 0, 0)])) + "\n")
        rows, launches = nss.load(path)
        check(launches == 2, "two launches")
        check(len(rows) == 4, "four instructions")
        check(rows[0][1] == 9 and rows[0][3]["long_sb"] == 9, "samples and reasons add up over launches")
        check(rows[2][3]["barrier"] == 16 and rows[2][3]["wait"] == 1, "the branch's reasons")
        check(rows[0][2] == 16, "executed adds up")
        check(nss.opcode(rows[2][0]) == "BRA" and nss.opcode(rows[0][0]) == "LDG", "opcodes without predicate")
        out = subprocess.run([sys.executable, SCRIPT, path, "--bin", "2", "--top", "2", "--show", "1:2"],
                             capture_output=True, text=True, check=True).stdout
        check("2 launches, 4 SASS instructions, 31 samples" in out, "the header line:\n" + out)
        check("barrier=16" in out and "long_sb=9" in out, "the reasons line:\n" + out)
        # Range 0-1 has no barrier samples: all 14 are not at a barrier.
        check(any(l.split()[:4] == ["0-1", "32", "14", "14"] for l in out.splitlines()), "range 0-1:\n" + out)
        # Range 2-3: 17 samples, 1 not at a barrier.
        check(any(l.split()[:4] == ["2-3", "32", "17", "1"] for l in out.splitlines()), "range 2-3:\n" + out)
        top = out.split("top 2 instructions by samples:")[1].splitlines()[1:3]
        check(top[0].split()[:2] == ["2", "17"] and top[1].split()[:2] == ["0", "9"], "top by samples:\n" + out)
        check("instructions 1..2:" in out, "--show")
        # Launches of different code are refused.
        bad = os.path.join(d, "bad.csv")
        with open(bad, "w") as f:
            f.write("\n".join(launch([(0, 0, 1)] * 4) + launch([(0, 0, 1)] * 4)[:-1]) + "\n")
        r = subprocess.run([sys.executable, SCRIPT, bad], capture_output=True, text=True)
        check(r.returncode != 0 and "different code" in r.stderr, "different code refused: " + r.stderr)
    print("ok")


if __name__ == "__main__":
    main()
