#!/usr/bin/env python3
"""Turns `unimoe-bench --routing-sweep` JSON into the routing variant table,
the rule's score and a proposed rule.

    scripts/analyze_routing_sweep.py SWEEP.json [MORE.json ...] [--plot OUT.png] [--merged ALL.json]
                                     [--held-out]

(a SWEEP.json.gz is read as it is.)
Prints, for each point class, where the fused single-block kernel beats the
split chain; how often the layer's rule (the `rule` field the sweep records
from routing_variant_for) is within 5% of the best variant, and its
geometric-mean speedup over "always fused" and "always split"; the routing
targets (DeepSeekV3 E=256 K=8 n_group=8, Renormalize E=128 K=8); and the
rule "fused iff T*K <= R, T <= Tm and T*E <= S" whose limits (a grid
search) are within 5% of the best variant on the most points. Where the
sweep timed the cluster variant (which runs the fused block itself when one
CTA has a warp for every token), it also proposes "cluster iff T*K <= R
(R_deepseek for the DeepSeek policies), T <= Tm and T*E <= S, else split",
and the three-way rule "fused iff T <= Tf (per family), T*K <= Rf and
T*E <= Sf; else cluster iff T*K <= R (per family), T <= Tm and T*E <= S;
else split"; and that rule with every limit fitted per family ("proposed
per family", the form routing_variant_for takes). --held-out also scores
both fittings on points they did not see (refitted without each E value,
and each policy, in turn). --plot draws time against T for the target
configs (needs matplotlib).
"""
import argparse
import gzip
import json
import math
import sys
from collections import defaultdict

DEEPSEEK = {"DeepSeekV3", "MiniMax2"}
TOLERANCE = 1.05


def variant_times(p):
    """{variant: time}; a variant the sweep could not run is absent."""
    times = {"split": p["split_us"]}
    for variant in ("fused", "cluster"):
        if p.get(f"{variant}_us") is not None:
            times[variant] = p[f"{variant}_us"]
    return times


def best(p):
    times = variant_times(p)
    name = min(times, key=times.get)
    return name, times[name]


def time_of(p, variant):
    """The time of `variant`, or split's where the fused kernel cannot serve."""
    return variant_times(p).get(variant, p["split_us"])


def geomean(values):
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def rule_score(points):
    within = sum(time_of(p, p["rule"]) <= TOLERANCE * best(p)[1] for p in points)
    vs_fused = geomean(time_of(p, "fused") / time_of(p, p["rule"]) for p in points)
    vs_split = geomean(p["split_us"] / time_of(p, p["rule"]) for p in points)
    return within / len(points), vs_fused, vs_split


def speedup_over(points, variant):
    """Geometric mean of always-`variant` time over the recorded rule's."""
    return geomean(time_of(p, variant) / time_of(p, p["rule"]) for p in points)


def family(p):
    return "deepseek" if p["policy"] in DEEPSEEK else "other"


ROWS_LIMITS = (128, 192, 256, 320, 384, 448, 512)
TOKEN_LIMITS = (8, 16, 24, 32, 48, 64)
SCORE_LIMITS = (2048, 4096, 6144, 8192, 12288, 16384)


def fused_by(p, rows, tokens, scores):
    """The choice of the rule 'fused iff T*K <= rows, T <= tokens and
    T*E <= scores' (split where the fused kernel cannot serve)."""
    fits = "fused" in variant_times(p)
    return "fused" if fits and p["T"] * p["K"] <= rows and p["T"] <= tokens and p["T"] * p["E"] <= scores \
        else "split"


def propose_rule(points):
    """The (rows, tokens, scores) limits whose rule is within 5% of the best
    variant on the most points (ties: the first in grid order), and that
    share of points."""
    best_limits, best_hits = None, -1
    for rows in ROWS_LIMITS:
        for tokens in TOKEN_LIMITS:
            for scores in SCORE_LIMITS:
                hits = sum(time_of(p, fused_by(p, rows, tokens, scores)) <= TOLERANCE * best(p)[1]
                           for p in points)
                if hits > best_hits:
                    best_limits, best_hits = (rows, tokens, scores), hits
    return best_limits, best_hits / len(points)


CLUSTER_ROWS = (256, 384, 512, 768, 1024, 1536, 2048)
CLUSTER_TOKENS = (32, 64, 128, 256, 512)
CLUSTER_SCORES = (8192, 16384, 32768, 65536, 131072)


def propose_cluster_rule(points):
    """The limits of 'cluster iff T*K <= rows[family], T <= tokens and T*E <=
    scores, else split' within 5% of the best variant on the most points
    (grid search; the row limit per policy family), and that share."""
    pre = []
    for p in points:
        times = variant_times(p)
        pre.append((family(p), p["T"], p["K"], p["E"], times.get("cluster"), p["split_us"], best(p)[1]))
    best_limits, best_hits = None, -1
    for tokens in CLUSTER_TOKENS:
        for scores in CLUSTER_SCORES:
            rows_of, hits = {}, 0
            for fam in ("deepseek", "other"):
                fam_best, fam_hits = None, -1
                for rows in CLUSTER_ROWS:
                    h = 0
                    for f, t, k, e, cluster, split, fastest in pre:
                        if f != fam:
                            continue
                        take = cluster is not None and t * k <= rows and t <= tokens and t * e <= scores
                        h += (cluster if take else split) <= TOLERANCE * fastest
                    if h > fam_hits:
                        fam_best, fam_hits = rows, h
                rows_of[fam] = fam_best
                hits += fam_hits
            if hits > best_hits:
                best_limits, best_hits = (rows_of, tokens, scores), hits
    return best_limits, best_hits / len(points)


def cluster_rule_choice(p, limits):
    """The variant the cluster rule with `limits` (as propose_cluster_rule
    returns them) takes at point p."""
    rows_of, tokens, scores = limits
    take = ("cluster" in variant_times(p) and p["T"] * p["K"] <= rows_of[family(p)]
            and p["T"] <= tokens and p["T"] * p["E"] <= scores)
    return "cluster" if take else "split"


FUSED_TOKENS = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
FUSED_ROWS = (32, 64, 128, 256, 10**9)
FUSED_SCORES = (512, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 16384, 10**9)
THREE_WAY_ROWS = (256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096)
THREE_WAY_TOKENS = (64, 96, 128, 192, 256, 512)
THREE_WAY_SCORES = (8192, 16384, 24576, 32768, 49152, 65536, 131072)


def _first_at_least(grid, value):
    """Index of the first grid value >= value (len(grid) if none)."""
    for i, g in enumerate(grid):
        if g >= value:
            return i
    return len(grid)


def propose_three_way_rule(points):
    """The limits of 'fused iff T <= tokens[family], T*K <= rows and T*E <=
    scores; else cluster iff T*K <= rows[family], T <= tokens and T*E <=
    scores; else split' within 5% of the best variant on the most points,
    and that share. The fused token limit and the cluster row limit are
    fitted per policy family, the rest shared (grid search; a variant a
    point lacks counts as split, as in the layer). Returns ((fused_tokens
    per family, fused_rows, fused_scores, cluster_rows per family,
    cluster_tokens, cluster_scores), share)."""
    # Points that share (family, T, K, E) count together: for each, how
    # many are within 5% when fused, cluster or split is taken.
    groups = defaultdict(lambda: [0, 0, 0])
    for p in points:
        fastest = best(p)[1] * TOLERANCE
        g = groups[(family(p), p["T"], p["K"], p["E"])]
        for i, v in enumerate(("fused", "cluster", "split")):
            g[i] += time_of(p, v) <= fastest
    best_limits, best_hits = None, -1
    n_t, n_r = len(FUSED_TOKENS), len(THREE_WAY_ROWS)
    for f_rows in FUSED_ROWS:
        for f_scores in FUSED_SCORES:
            for c_tokens in THREE_WAY_TOKENS:
                for c_scores in THREE_WAY_SCORES:
                    hits, tokens_of, rows_of = 0, {}, {}
                    for fam in ("deepseek", "other"):
                        # hist[a][b]: the counts of the points that turn
                        # fused from token limit index a and cluster from row
                        # limit index b on (index len: never).
                        hist = [[[0, 0, 0] for _ in range(n_r + 1)] for _ in range(n_t + 1)]
                        for (gf, t, k, e), ok in groups.items():
                            if gf != fam:
                                continue
                            a = _first_at_least(FUSED_TOKENS, t) if t * k <= f_rows and t * e <= f_scores else n_t
                            b = _first_at_least(THREE_WAY_ROWS, t * k) if t <= c_tokens and t * e <= c_scores else n_r
                            cell = hist[a][b]
                            for i in range(3):
                                cell[i] += ok[i]
                        fam_best, fam_hits = None, -1
                        for i in range(n_t):
                            for j in range(n_r):
                                h = 0
                                for a in range(n_t + 1):
                                    for b in range(n_r + 1):
                                        cell = hist[a][b]
                                        h += cell[0] if a <= i else (cell[1] if b <= j else cell[2])
                                if h > fam_hits:
                                    fam_best, fam_hits = (FUSED_TOKENS[i], THREE_WAY_ROWS[j]), h
                        tokens_of[fam], rows_of[fam] = fam_best
                        hits += fam_hits
                    if hits > best_hits:
                        best_limits = (tokens_of, f_rows, f_scores, rows_of, c_tokens, c_scores)
                        best_hits = hits
    return best_limits, best_hits / len(points)


def three_way_choice(p, limits):
    """The variant the three-way rule with `limits` (as
    propose_three_way_rule returns them) takes at point p."""
    tokens_of, f_rows, f_scores, rows_of, c_tokens, c_scores = limits
    t, k, e = p["T"], p["K"], p["E"]
    if t <= tokens_of[family(p)] and t * k <= f_rows and t * e <= f_scores:
        return "fused"
    if t * k <= rows_of[family(p)] and t <= c_tokens and t * e <= c_scores:
        return "cluster"
    return "split"


def describe_three_way(limits):
    tokens_of, f_rows, f_scores, rows_of, c_tokens, c_scores = limits
    unlimited = lambda v: "any" if v >= 10**9 else str(v)
    cluster = (f"cluster iff T*K <= {rows_of['other']} (DeepSeek policies: {rows_of['deepseek']}), "
               f"T <= {c_tokens} and T*E <= {c_scores}; else split")
    if tokens_of["other"] <= 0 and tokens_of["deepseek"] <= 0:
        return "fused never; " + cluster
    return (f"fused iff T <= {tokens_of['other']} (DeepSeek policies: {tokens_of['deepseek']}), "
            f"T*K <= {unlimited(f_rows)} and T*E <= {unlimited(f_scores)}; else " + cluster)


def propose_family_rule(points):
    """The three-way rule with every limit fitted per policy family: each
    family's limits are propose_three_way_rule's on that family's points
    alone. Returns ({family: limits}, share of all points within 5%)."""
    by_family = {}
    for fam in ("deepseek", "other"):
        sub = [p for p in points if family(p) == fam]
        if sub:
            by_family[fam] = propose_three_way_rule(sub)[0]
    hits = sum(time_of(p, family_rule_choice(p, by_family)) <= TOLERANCE * best(p)[1] for p in points)
    return by_family, hits / len(points)


def family_rule_choice(p, by_family):
    """The variant the per-family rule takes at point p."""
    return three_way_choice(p, by_family[family(p)])


def describe_family_rule(by_family):
    unlimited = lambda v: "any" if v >= 10**9 else str(v)
    parts = []
    for fam, (tokens_of, f_rows, f_scores, rows_of, c_tokens, c_scores) in sorted(by_family.items()):
        cluster = f"cluster iff T*K <= {rows_of[fam]}, T <= {c_tokens} and T*E <= {c_scores}; else split"
        if tokens_of[fam] <= 0:
            parts.append(f"{fam}: fused never; " + cluster)
        else:
            parts.append(f"{fam}: fused iff T <= {tokens_of[fam]}, T*K <= {unlimited(f_rows)} and "
                         f"T*E <= {unlimited(f_scores)}; else " + cluster)
    return "; ".join(parts)


def held_out_score(points, key, propose=None, choose=None):
    """A rule's fitting judged on points it was not fitted to: for each
    value v of key(p), fit `propose` (default propose_three_way_rule) on the
    points with another value and count the points with value v where the
    fitted rule's choice (`choose`, default three_way_choice) is within 5%
    of the best variant. Returns the share over all points and {v: share of
    v's points}; (None, {}) with fewer than two values, where nothing is
    left to fit on."""
    propose = propose or propose_three_way_rule
    choose = choose or three_way_choice
    by_value = defaultdict(list)
    for p in points:
        by_value[key(p)].append(p)
    if len(by_value) < 2:
        return None, {}
    hits, per_value = 0, {}
    for value, held in sorted(by_value.items()):
        fitted = [p for p in points if key(p) != value]
        limits, _ = propose(fitted)
        h = sum(time_of(p, choose(p, limits)) <= TOLERANCE * best(p)[1] for p in held)
        hits += h
        per_value[value] = h / len(held)
    return hits / len(points), per_value


def merge(docs):
    """One sweep from several: a later file's point replaces an earlier one
    at the same (policy, E, K, n_group, topk_group, T)."""
    merged = dict(docs[0])
    points = {}
    for doc in docs:
        for p in doc["points"]:
            points[(p["policy"], p["E"], p["K"], p["n_group"], p["topk_group"], p["T"])] = p
    merged["points"] = list(points.values())
    merged["complete"] = docs[0].get("complete", True) if len(docs) == 1 else None
    return merged


def target(points, policy, e, k, n_group, t_max=None, t_exact=None):
    sel = [p for p in points if p["policy"] == policy and p["E"] == e and p["K"] == k
           and p["n_group"] == n_group
           and (t_max is None or p["T"] <= t_max) and (t_exact is None or p["T"] == t_exact)]
    return max((best(p)[1] for p in sel), default=None)


def speedup_line(points, choose):
    """'  its speedup ...': the geometric mean of each fixed variant's time
    over the time of the variant `choose(p)` picks."""
    chosen = [time_of(p, choose(p)) for p in points]
    over = {v: geomean(time_of(p, v) / c for p, c in zip(points, chosen))
            for v in ("fused", "split", "cluster")}
    return (f"  its speedup, geometric mean: {over['fused']:.3f}x over always-fused, "
            f"{over['split']:.3f}x over always-split, {over['cluster']:.3f}x over always-cluster")


def report(doc, held_out=False):
    points = doc["points"]
    lines = [f"routing sweep on {doc.get('device', '?')}: {len(points)} points, "
             f"{doc.get('calls_per_graph', '?')} calls per graph replay, times in us per call"]
    if doc.get("complete") is False:
        lines.append("INCOMPLETE: the sweep stopped early; figures cover the points it reached")
    bad = [p for p in points if p.get("outputs_match") is False]
    lines.append(f"split/fused output mismatches: {len(bad)}")
    for p in bad[:20]:
        lines.append(f"  MISMATCH {p['policy']} E={p['E']} K={p['K']} T={p['T']}")

    lines.append("")
    lines.append("fused wins (points where it runs), by policy family and T*K:")
    buckets = [1, 8, 32, 64, 128, 256, 512, 1024, 4096]
    header = "family    " + "".join(f"{'<=' + str(b):>10}" for b in buckets)
    lines.append(header)
    for fam in ("deepseek", "other"):
        row = f"{fam:10}"
        for i, b in enumerate(buckets):
            lo = buckets[i - 1] if i else 0
            sel = [p for p in points if family(p) == fam and lo < p["T"] * p["K"] <= b
                   and p.get("fused_us") is not None]
            row += f"{(sum(best(p)[0] == 'fused' for p in sel) / len(sel) if sel else float('nan')):>10.2f}"
        lines.append(row)

    with_cluster = [p for p in points if p.get("cluster_us") is not None]
    if with_cluster:
        lines.append("")
        lines.append("cluster wins (best of the three variants, points where it runs), by policy family and T:")
        t_buckets = [1, 8, 16, 32, 64, 128, 256, 512, 4096]
        lines.append("family    " + "".join(f"{'<=' + str(b):>10}" for b in t_buckets))
        for fam in ("deepseek", "other"):
            row = f"{fam:10}"
            for i, b in enumerate(t_buckets):
                lo = t_buckets[i - 1] if i else 0
                sel = [p for p in with_cluster if family(p) == fam and lo < p["T"] <= b]
                share = sum(best(p)[0] == "cluster" for p in sel) / len(sel) if sel else float("nan")
                row += f"{share:>10.2f}"
            lines.append(row)

    within, vs_fused, vs_split = rule_score(points)
    lines.append("")
    lines.append(f"recorded rule (routing_variant_for of the build that ran the sweep) within 5% of "
                 f"the best variant: {100 * within:.1f}% of points (target >= 95%)")
    lines.append(f"rule speedup, geometric mean: {vs_fused:.3f}x over always-fused, "
                 f"{vs_split:.3f}x over always-split")
    if with_cluster:
        lines.append(f"rule speedup over always-cluster (geometric mean): "
                     f"{speedup_over(points, 'cluster'):.3f}x")

    lines.append("")
    (rows, tokens, scores), share = propose_rule(points)
    lines.append(f"proposed: fused iff T*K <= {rows}, T <= {tokens} and T*E <= {scores} "
                 f"(within 5% of the best variant on {100 * share:.1f}% of points)")
    if with_cluster:
        (rows_of, tokens, scores), share = propose_cluster_rule(points)
        lines.append(f"proposed with the cluster variant: cluster iff T*K <= {rows_of['other']} "
                     f"(DeepSeek policies: {rows_of['deepseek']}), T <= {tokens} and "
                     f"T*E <= {scores}, else split (within 5% of the best variant on "
                     f"{100 * share:.1f}% of points)")
        lines.append(speedup_line(points, lambda p: cluster_rule_choice(p, (rows_of, tokens, scores))))
        limits, share = propose_three_way_rule(points)
        lines.append(f"proposed three-way: {describe_three_way(limits)} (within 5% of the best "
                     f"variant on {100 * share:.1f}% of points)")
        lines.append(speedup_line(points, lambda p: three_way_choice(p, limits)))
        by_family, share = propose_family_rule(points)
        lines.append(f"proposed per family (every limit fitted per policy family): "
                     f"{describe_family_rule(by_family)} (within 5% of the best variant on "
                     f"{100 * share:.1f}% of points)")
        lines.append(speedup_line(points, lambda p: family_rule_choice(p, by_family)))
        if held_out:
            for name, key in (("E", lambda p: p["E"]), ("policy", lambda p: p["policy"])):
                share, per = held_out_score(points, key, propose_family_rule, family_rule_choice)
                if share is None:
                    continue
                worst = min(per, key=per.get)
                lines.append(f"  per-family rule held out by {name}: within 5% on "
                             f"{100 * share:.1f}% of points; worst {name}={worst} at "
                             f"{100 * per[worst]:.1f}%")
            for name, key in (("E", lambda p: p["E"]), ("policy", lambda p: p["policy"])):
                share, per = held_out_score(points, key)
                if share is None:
                    lines.append(f"  held out by {name}: one {name} value only, nothing to hold out")
                    continue
                worst = min(per, key=per.get)
                lines.append(f"  held out by {name} (fitted without each {name} value, scored on "
                             f"it): within 5% on {100 * share:.1f}% of points; worst {name}="
                             f"{worst} at {100 * per[worst]:.1f}%")
    lines.append("")
    ds_small = target(points, "DeepSeekV3", 256, 8, 8, t_max=64)
    ds_large = target(points, "DeepSeekV3", 256, 8, 8, t_exact=16384)
    rn_small = target(points, "Renormalize", 128, 8, 1, t_max=64)
    fmt = lambda v: "not swept" if v is None else f"{v:.2f} us"
    lines.append(f"target DeepSeekV3 E=256 K=8 n_group=8, worst best-variant time T<=64: {fmt(ds_small)} (<= 4)")
    lines.append(f"target DeepSeekV3 E=256 K=8 n_group=8, T=16384: {fmt(ds_large)} (<= 20)")
    lines.append(f"target Renormalize E=128 K=8, worst best-variant time T<=64: {fmt(rn_small)} (<= 3)")
    return "\n".join(lines)


def plot(doc, path):
    import matplotlib  # noqa: F401  (optional dependency)
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 5))
    for policy, e, k, g in (("DeepSeekV3", 256, 8, 8), ("Renormalize", 128, 8, 1)):
        sel = sorted((p for p in doc["points"] if p["policy"] == policy and p["E"] == e
                      and p["K"] == k and p["n_group"] == g), key=lambda p: p["T"])
        for variant in ("split", "fused", "cluster"):
            xs = [p["T"] for p in sel if variant in variant_times(p)]
            ys = [variant_times(p)[variant] for p in sel if variant in variant_times(p)]
            ax.plot(xs, ys, marker=".", label=f"{policy} E={e} K={k} {variant}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("T (tokens)")
    ax.set_ylabel("routing + permute, us per call")
    ax.legend()
    fig.savefig(path, dpi=120)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweep", nargs="+", help="sweep JSON files (several are merged: a later "
                    "file's point replaces an earlier one's)")
    ap.add_argument("--plot", help="PNG of time against T for the target configs (needs matplotlib)")
    ap.add_argument("--merged", help="also write the merged sweep JSON here")
    ap.add_argument("--held-out", action="store_true",
                    help="also score the cluster rule's fitting out of sample: refitted without "
                    "each E value and each policy in turn, scored on the points left out "
                    "(a few minutes on the full sweep)")
    args = ap.parse_args(argv)
    docs = []
    for path in args.sweep:
        with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
            docs.append(json.load(f))
    doc = merge(docs)
    if not doc.get("points"):
        print(f"{', '.join(args.sweep)}: no points", file=sys.stderr)
        return 1
    if args.merged:
        with open(args.merged, "w") as f:
            json.dump(doc, f, indent=1)
    print(report(doc, held_out=args.held_out))
    if args.plot:
        try:
            plot(doc, args.plot)
            print(f"wrote {args.plot}")
        except ImportError:
            print("no plot: matplotlib is not installed (pip install matplotlib)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
