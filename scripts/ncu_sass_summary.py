#!/usr/bin/env python3
"""Where a kernel's warps wait, per SASS instruction: a summary of Nsight
Compute's source page (warp-state sampling) for short, latency-bound
kernels such as the routing kernels.

  ncu -k regex:KERNEL --launch-skip 10 --launch-count 5 --replay-mode application \\
      --section WarpStateStats --section SourceCounters --warp-sampling-interval 0 \\
      -o prof unimoe-bench --routing-sweep ...
  ncu --import prof.ncu-rep --page source --csv --print-source sass > prof.csv
  scripts/ncu_sass_summary.py prof.csv [--bin 100] [--top 20] [--show FIRST:LAST]

Launches of the same kernel (one section each in the CSV) are added up by
instruction index. Prints the samples by stall reason, then per range of
--bin instructions the instructions executed, the samples, those not at a
barrier, the three main stall reasons other than the barrier and the most
frequent opcodes; then the --top instructions by samples; --show prints
every instruction of an index range with its samples and reasons.
"""
import argparse
import collections
import csv

ADDRESS, SOURCE, SAMPLES, EXECUTED = "Address", "Source", "# Samples", "Instructions Executed"


def number(text):
    return int(text) if text and text.strip().lstrip("-").isdigit() else 0


def load(path):
    """[(source, samples, executed, Counter of stall reason -> samples)] by
    instruction index, the kernel's launches added up; and the count of
    launches."""
    sections = []
    header = None
    with open(path, newline="") as f:
        for rec in csv.reader(f):
            if not rec:
                continue
            if rec[0] == "Kernel Name":
                sections.append([])
                header = None
            elif rec[0] == ADDRESS:
                header = rec
            elif header and rec[0].startswith("0x"):
                if not sections:
                    sections.append([])
                sections[-1].append(dict(zip(header, rec)))
    if not sections or not sections[0]:
        raise SystemExit(f"{path}: no SASS rows (ncu --page source --csv --print-source sass)")
    lengths = {len(s) for s in sections}
    if len(lengths) != 1:
        raise SystemExit(f"{path}: the launches list different code ({sorted(lengths)} instructions)")
    reasons = [h for h in sections[0][0] if h.startswith("stall_") and "Not Issued" not in h]
    rows = []
    for i in range(len(sections[0])):
        source = sections[0][i][SOURCE].strip()
        samples = sum(number(s[i][SAMPLES]) for s in sections)
        executed = sum(number(s[i][EXECUTED]) for s in sections)
        stalls = collections.Counter()
        for s in sections:
            for r in reasons:
                v = number(s[i].get(r, ""))
                if v:
                    stalls[r[len("stall_"):]] += v
        rows.append((source, samples, executed, stalls))
    return rows, len(sections)


def opcode(source):
    words = source.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else "?"


def reasons_text(stalls, skip=("barrier",), n=3):
    kept = [(k, v) for k, v in stalls.most_common() if k not in skip]
    return " ".join(f"{k}={v}" for k, v in kept[:n])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", help="ncu --page source --csv --print-source sass output")
    ap.add_argument("--bin", type=int, default=100, help="instructions a range (default 100)")
    ap.add_argument("--top", type=int, default=20, help="instructions listed by samples (default 20)")
    ap.add_argument("--show", help="FIRST:LAST, every instruction of that index range")
    args = ap.parse_args()
    rows, launches = load(args.csv)
    total = sum(r[1] for r in rows)
    by_reason = collections.Counter()
    for r in rows:
        by_reason.update(r[3])
    print(f"{args.csv}: {launches} launches, {len(rows)} SASS instructions, {total} samples")
    print("by reason: " + " ".join(f"{k}={v}" for k, v in by_reason.most_common()))
    print(f"\nby range of {args.bin} instructions (ranges with no execution and no sample left out):")
    print(f"{'range':>11} {'executed':>9} {'samples':>8} {'no-bar':>7}  reasons (barrier left out) | opcodes")
    for first in range(0, len(rows), args.bin):
        part = rows[first:first + args.bin]
        executed = sum(r[2] for r in part)
        samples = sum(r[1] for r in part)
        if executed == 0 and samples == 0:
            continue
        stalls = collections.Counter()
        ops = collections.Counter()
        for r in part:
            stalls.update(r[3])
            if r[2]:
                ops[opcode(r[0])] += 1
        not_barrier = sum(v for k, v in stalls.items() if k != "barrier")
        print(f"{first:>5}-{first + len(part) - 1:<5} {executed:>9} {samples:>8} {not_barrier:>7}  "
              f"{reasons_text(stalls)} | " + " ".join(f"{k}{v}" for k, v in ops.most_common(5)))
    print(f"\ntop {args.top} instructions by samples:")
    ranked = sorted(range(len(rows)), key=lambda i: -rows[i][1])[:args.top]
    for i in ranked:
        source, samples, executed, stalls = rows[i]
        print(f"{i:>5} {samples:>6} executed {executed:>6}  {source[:60]:<60} "
              f"{reasons_text(stalls, skip=())}")
    if args.show:
        first, last = (int(x) for x in args.show.split(":"))
        print(f"\ninstructions {first}..{last}:")
        for i in range(max(0, first), min(len(rows), last + 1)):
            source, samples, executed, stalls = rows[i]
            print(f"{i:>5} {samples:>6} executed {executed:>6}  {source[:60]:<60} "
                  f"{reasons_text(stalls, skip=())}")


if __name__ == "__main__":
    main()
