#!/usr/bin/env python3
"""Reads a sweep of the GEMM2 paths against the gate's targets (docs/gemm2-gate.md).

    scripts/analyze_gemm2_gate.py RUN.json [RUN.json ...] [--fit] [--json OUT] [--plot OUT.png]

Each RUN.json is one `unimoe-bench` run (or a file whose "runs" list holds
several, as bench/results keeps a sweep) with `--dev gemm2_path=expert`,
`combine` or `gate` (the file's "dev" field says which) under one
`--routing` distribution (its "routing" field), all from one call on one
GPU. Points are matched by (routing, preset, T). Prints, point by point,
the three times, the faster forced path and the gate's choice, then the
lines the targets are stated in:
  - the gate's layer within 3% of the faster forced path (target: 90% of
    the points);
  - the gated layer against the best host-only choice, the one forced path
    a rule of T alone would take (the faster in geometric mean over the
    distributions at that (preset, T)): geometric mean over the skewed
    points (target < 1) and the worst point (target <= 1.02);
  - at T = 1, the gate's time minus the same path forced (target <= 1.5 us).
With --fit, a least-squares fit of the combine path's time minus the
expert path's over the gate's work counts (the gemm2_work of the gate run),
for the model's constants in src/plan/gemm2_gate.cpp, per preset. --plot
draws, per preset, each path's time against T under each distribution, so
that the crossover shows (needs matplotlib).
Points of files from another GPU than the first's are refused.
"""
import argparse
import json
import math
import sys

WITHIN = 1.03
WORST_BOUND = 1.02
T1_OVERHEAD_US = 1.5
FEATURES = ["tiles", "rows", "active", "chunks"]


def mode_of(doc):
    for item in doc.get("dev", "").split():
        if item.startswith("gemm2_path="):
            return item.split("=", 1)[1]
    return "auto"


def runs_of(path):
    """The runs a file holds: the file itself, or each entry of its "runs"
    list (a sweep kept as one file, as in bench/results)."""
    doc = json.load(open(path))
    if "runs" in doc:
        return [(f"{path} run {i}", run) for i, run in enumerate(doc["runs"])]
    return [(path, doc)]


def load(paths):
    """{(routing, preset, T): {mode: point}} and the device, refusing mixed GPUs."""
    table, device = {}, None
    for path, doc in [r for p in paths for r in runs_of(p)]:
        if device is None:
            device = doc.get("device", "")
        elif doc.get("device", "") != device:
            sys.exit(f"{path}: device {doc.get('device')!r}, not {device!r} as the first file")
        mode = mode_of(doc)
        if mode not in ("expert", "combine", "gate"):
            sys.exit(f"{path}: dev {doc.get('dev')!r} names no gemm2_path (expert, combine, gate)")
        for p in doc["points"]:
            if p.get("failed"):
                print(f"note: {path}: {p['preset']} T={p['T']} failed its reference check; left out")
                continue
            table.setdefault((doc.get("routing", "uniform"), p["preset"], p["T"]), {})[mode] = p
    return table, device


def geomean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def host_only_choice(table):
    """{(preset, T): mode}: the forced path faster in geometric mean over the distributions."""
    logs = {}
    for (routing, preset, t), modes in table.items():
        if "expert" not in modes or "combine" not in modes:
            continue
        acc = logs.setdefault((preset, t), {"expert": [], "combine": []})
        for m in ("expert", "combine"):
            acc[m].append(modes[m]["time_us"])
    return {k: min(v, key=lambda m: geomean(v[m])) for k, v in logs.items()}


def solve(a, b):
    """Least squares a x = b by the normal equations (small, well-posed systems)."""
    n = len(a[0])
    ata = [[sum(r[i] * r[j] for r in a) for j in range(n)] for i in range(n)]
    atb = [sum(r[i] * y for r, y in zip(a, b)) for i in range(n)]
    for i in range(n):  # Gauss-Jordan with partial pivoting
        piv = max(range(i, n), key=lambda k: abs(ata[k][i]))
        ata[i], ata[piv] = ata[piv], ata[i]
        atb[i], atb[piv] = atb[piv], atb[i]
        if abs(ata[i][i]) < 1e-12:
            return None
        for k in range(n):
            if k != i:
                f = ata[k][i] / ata[i][i]
                ata[k] = [x - f * y for x, y in zip(ata[k], ata[i])]
                atb[k] -= f * atb[i]
    return [atb[i] / ata[i][i] for i in range(n)]


def analyze(table, fit=False):
    rows, within, skewed_ratios, worst, t1 = [], 0, [], (0.0, None), []
    host = host_only_choice(table)
    complete = 0
    for key in sorted(table, key=lambda k: (k[1], k[0], k[2])):
        modes = table[key]
        if not all(m in modes for m in ("expert", "combine", "gate")):
            continue
        complete += 1
        routing, preset, t = key
        e, c, g = (modes[m]["time_us"] for m in ("expert", "combine", "gate"))
        best = min(e, c)
        faster = "combine" if c < e else "expert"
        chose = modes["gate"].get("gemm2_gate", "-")
        ok = g <= WITHIN * best
        within += ok
        host_mode = host.get((preset, t))
        ratio = g / modes[host_mode]["time_us"] if host_mode else float("nan")
        if routing != "uniform" and host_mode:
            skewed_ratios.append(ratio)
        if host_mode and ratio > worst[0]:
            worst = (ratio, key)
        if t == 1 and chose in ("expert", "combine"):
            t1.append((key, g - modes[chose]["time_us"]))
        rows.append(dict(routing=routing, preset=preset, T=t, expert_us=e, combine_us=c, gate_us=g,
                         faster=faster, gate_choice=chose, within_3pct=ok, host_only=host_mode,
                         gate_over_host_only=ratio, work=modes["gate"].get("gemm2_work", {})))
    summary = dict(points=complete, within_3pct=within,
                   within_share=within / complete if complete else float("nan"),
                   skewed_geomean_over_host_only=geomean(skewed_ratios),
                   worst_over_host_only=worst[0], worst_point=list(worst[1]) if worst[1] else None,
                   t1_overhead_us={f"{k[0]} {k[1]}": round(d, 2) for k, d in t1})
    fits = {}
    if fit:
        by_preset = {}
        for r in rows:
            if all(f in r["work"] for f in FEATURES):
                by_preset.setdefault(r["preset"], []).append(r)
        for preset, rs in by_preset.items():
            a = [[1.0] + [float(r["work"][f]) for f in FEATURES] for r in rs]
            b = [1000.0 * (r["combine_us"] - r["expert_us"]) for r in rs]
            coef = solve(a, b) if len(rs) > len(FEATURES) else None
            fits[preset] = (dict(zip(["base"] + FEATURES, coef)) if coef else
                            "too few or degenerate points for the fit")
    return rows, summary, fits


def plot(rows, path):
    try:
        import matplotlib
    except ImportError:
        sys.exit("--plot needs matplotlib (pip install matplotlib)")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    presets = sorted({r["preset"] for r in rows})
    fig, axes = plt.subplots(1, len(presets), figsize=(5 * len(presets), 4), squeeze=False)
    styles = {"uniform": "-", "hot": "--", "zipf": ":"}
    for ax, preset in zip(axes[0], presets):
        for routing in sorted({r["routing"] for r in rows if r["preset"] == preset}):
            sel = sorted((r for r in rows if r["preset"] == preset and r["routing"] == routing),
                         key=lambda r: r["T"])
            style = styles.get(routing.split(":")[0], "-.")
            for mode, color in (("expert", "tab:blue"), ("combine", "tab:orange"), ("gate", "tab:green")):
                ax.plot([r["T"] for r in sel], [r[f"{mode}_us"] for r in sel], style, color=color,
                        marker=".", label=f"{mode} {routing}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(preset)
        ax.set_xlabel("T (tokens)")
        ax.set_ylabel("layer time, us")
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--fit", action="store_true")
    ap.add_argument("--json", help="write the table, the summary and the fit here")
    ap.add_argument("--plot", help="PNG of each path's time against T, per preset (needs matplotlib)")
    args = ap.parse_args(argv)
    table, device = load(args.runs)
    rows, summary, fits = analyze(table, args.fit)
    print(f"GEMM2 paths on {device}: times in us; gate/host: the gated layer over the host-only choice")
    print(f"{'routing':<10} {'preset':<16} {'T':>6} {'expert':>9} {'combine':>9} {'gate':>9} "
          f"{'faster':>8} {'chose':>8} {'<=3%':>5} {'gate/host':>9}")
    for r in rows:
        print(f"{r['routing']:<10} {r['preset']:<16} {r['T']:>6} {r['expert_us']:>9.1f} "
              f"{r['combine_us']:>9.1f} {r['gate_us']:>9.1f} {r['faster']:>8} {r['gate_choice']:>8} "
              f"{'yes' if r['within_3pct'] else 'NO':>5} {r['gate_over_host_only']:>9.3f}")
    s = summary
    print(f"gate within 3% of the faster forced path: {s['within_3pct']} of {s['points']} points "
          f"({100 * s['within_share']:.0f}%; target 90%)")
    print(f"gated over the host-only choice, skewed points: geometric mean "
          f"{s['skewed_geomean_over_host_only']:.3f} (target < 1); worst {s['worst_over_host_only']:.3f} "
          f"at {s['worst_point']} (target <= {WORST_BOUND})")
    for k, d in s["t1_overhead_us"].items():
        print(f"T=1 {k}: gate minus the same path forced {d:+.2f} us (target <= {T1_OVERHEAD_US})")
    for preset, f in fits.items():
        print(f"fit {preset}: combine - expert (ns) = {f}")
    if args.json:
        json.dump(dict(device=device, rows=rows, summary=summary, fit=fits), open(args.json, "w"), indent=1)
        print(f"wrote {args.json}")
    if args.plot:
        plot(rows, args.plot)
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
