#!/usr/bin/env python3
"""scripts/analyze_routing_sweep.py on a synthetic sweep whose answers are
known: fused wins up to T*K = 64 for DeepSeek policies and up to 256 for the
others; the recorded rule is right except at one point."""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "scripts", "analyze_routing_sweep.py")
sys.path.insert(0, os.path.dirname(SCRIPT))
import analyze_routing_sweep as ars  # noqa: E402


def point(policy, e, k, n_group, t, fused_wins, rule, fused_fits=True):
    split = 10.0 + t * k / 100.0
    fused = split * (0.5 if fused_wins else 2.0)
    return {"policy": policy, "E": e, "K": k, "n_group": n_group, "topk_group": 4 if n_group > 1 else 1,
            "T": t, "rule": rule, "split_us": split, "fused_us": fused if fused_fits else None,
            "outputs_match": True}


def synthetic():
    pts = []
    for t in (1, 2, 4, 8, 16, 32, 64, 128):
        rows = t * 8
        pts.append(point("DeepSeekV3", 256, 8, 8, t, rows <= 64, "fused" if rows <= 64 else "split"))
        pts.append(point("Renormalize", 128, 8, 1, t, rows <= 256, "fused" if rows <= 256 else "split"))
    # One wrong rule choice, and one point the fused kernel cannot serve.
    pts.append(point("Renormalize", 128, 8, 1, 4096, False, "fused", fused_fits=False))
    pts[0]["rule"] = "split"  # DeepSeekV3 T=1: fused wins 2x, the rule says split
    return {"device": "test", "calls_per_graph": 8, "points": pts}


def check(cond, what):
    if not cond:
        print("FAILED:", what)
        sys.exit(1)


def main():
    doc = synthetic()
    # Fused wins up to T = 8 for DeepSeekV3 (T*E <= 2048) and T = 32 for
    # Renormalize (T*K <= 256, T*E = 4096): no single limit set gets all;
    # the best gets all but one of the 16 T <= 128 points.
    (rows, tokens, scores), share = ars.propose_rule(doc["points"])
    check(ars.fused_by(doc["points"][1], rows, tokens, scores) == "fused", "Renormalize T=1 fused")
    check(abs(share - 16 / 17) < 1e-12, f"proposed rule share {share} with {(rows, tokens, scores)}")
    # A rule that gets every point exists for a sweep of one policy.
    ds_only = [p for p in doc["points"] if p["policy"] == "DeepSeekV3"]
    check(ars.propose_rule(ds_only)[1] == 1.0, "DeepSeekV3 alone: a perfect rule")
    # Merging: a later file's point replaces an earlier one's.
    later = dict(doc, points=[dict(doc["points"][0], split_us=1.0)])
    merged = ars.merge([doc, later])
    check(len(merged["points"]) == len(doc["points"]), "merge keeps one point per key")
    check(min(p["split_us"] for p in merged["points"]) == 1.0, "merge takes the later point")
    within, vs_fused, vs_split = ars.rule_score(doc["points"])
    n = len(doc["points"])
    check(abs(within - (n - 1) / n) < 1e-12, f"rule within 5% on {within}")
    check(vs_split > 1.0 and vs_fused > 1.0, "the rule beats both fixed choices")
    # A point the fused kernel cannot serve counts as split for "always fused".
    check(ars.time_of(doc["points"][-1], "fused") == doc["points"][-1]["split_us"], "fallback")
    check(ars.target(doc["points"], "DeepSeekV3", 256, 8, 8, t_max=64) is not None, "target found")
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "sweep.json")
        with open(path, "w") as f:
            json.dump(doc, f)
        out = subprocess.run([sys.executable, SCRIPT, path], capture_output=True, text=True, check=True).stdout
        check("proposed: fused iff T*K <= " in out, out)
        check("split/fused output mismatches: 0" in out, out)
    # A cluster time joins the variants where present, and its table appears.
    with_cluster = dict(doc, points=[dict(p, cluster_us=p["split_us"] * 0.1) for p in doc["points"]
                                     if p.get("fused_us") is not None])
    check(ars.best(with_cluster["points"][0])[0] == "cluster", "cluster wins when fastest")
    check("cluster wins (best of the three" in ars.report(with_cluster), "cluster table")
    check("cluster wins" not in ars.report(doc), "no cluster table without cluster times")
    # The cluster rule: cluster wins up to T*K = 256 for DeepSeekV3 and at
    # every T*K (up to 1024) for Renormalize; the first grid limits that get
    # every point: rows 256 and 1024, T <= 128, T*E <= 16384.
    def cluster_time(p):
        limit = 256 if p["policy"] == "DeepSeekV3" else 1024
        return p["split_us"] * (0.5 if p["T"] * p["K"] <= limit else 2.0)
    split_or_cluster = dict(doc, points=[dict(p, cluster_us=cluster_time(p) if p.get("fused_us") else None)
                                         for p in doc["points"]])
    limits, share = ars.propose_cluster_rule(split_or_cluster["points"])
    check(limits == ({"deepseek": 256, "other": 1024}, 128, 16384), f"cluster rule limits {limits}")
    check(share == 1.0, f"cluster rule share {share}")
    check(ars.cluster_rule_choice(split_or_cluster["points"][-1], limits) == "split",
          "split where the cluster kernel cannot serve")
    check("proposed with the cluster variant: cluster iff T*K <= 1024 (DeepSeek policies: 256)"
          in ars.report(split_or_cluster), "cluster proposal printed")
    # Held out: E=64 and E=128 share one optimum (cluster up to T = 64), so
    # a rule fitted on either one serves the other; when E=128's cluster
    # wins only up to T = 8, the rule fitted on E=64 alone misses it.
    def e_sweep(limit_of):
        pts = []
        for e in (64, 128):
            for t in (1, 2, 4, 8, 16, 32, 64, 128, 256):
                p = point("Renormalize", e, 8, 1, t, False, "split")
                p["cluster_us"] = p["split_us"] * (0.5 if t <= limit_of[e] else 2.0)
                pts.append(p)
        return pts
    share, per = ars.held_out_score(e_sweep({64: 64, 128: 64}), lambda p: p["E"])
    check(share == 1.0 and sorted(per) == [64, 128], f"held out, one optimum: {share} {per}")
    share, per = ars.held_out_score(e_sweep({64: 64, 128: 8}), lambda p: p["E"])
    check(per[128] < 1.0 and share < 1.0, f"held out, two optima: {share} {per}")
    check("held out by E" in ars.report({"points": e_sweep({64: 64, 128: 64})}, held_out=True),
          "held-out lines printed")
    # The three-way rule: fused wins up to T = 2 for DeepSeekV3 and T = 8
    # for Renormalize, cluster above that up to T*K = 512, split beyond.
    # The first grid limits that get every point: fused T <= 2 and 8 (T*K
    # and T*E unlimited from the first grid value that allows T*K = 64 and
    # T*E = 1024), cluster T*K <= 512 for both, T <= 128, T*E <= 32768.
    def three_way(p):
        t, fused_max = p["T"], 2 if p["policy"] == "DeepSeekV3" else 8
        times = {"fused": 1.0 if t <= fused_max else 4.0,
                 "cluster": 2.0 if t * p["K"] <= 512 else 4.0,
                 "split": 3.0}
        return dict(p, fused_us=times["fused"], cluster_us=times["cluster"], split_us=times["split"])
    pts = [three_way(p) for p in doc["points"] if p["T"] <= 128]
    limits, share = ars.propose_three_way_rule(pts)
    check(share == 1.0, f"three-way share {share} with {limits}")
    tokens_of, _, _, rows_of, _, _ = limits
    check(tokens_of == {"deepseek": 2, "other": 8}, f"three-way fused tokens {tokens_of}")
    check(rows_of == {"deepseek": 512, "other": 512}, f"three-way cluster rows {rows_of}")
    chosen = [ars.three_way_choice(p, limits) for p in pts]
    check(chosen.count("fused") == 6 and chosen.count("split") == 2, f"three-way choices {chosen}")
    check("proposed three-way: fused iff T <= 8 (DeepSeek policies: 2)" in ars.report({"points": pts}),
          "three-way proposal printed")
    # Per family: the DeepSeek policies' cluster wins up to T = 64, the
    # others' up to T = 128 (E = 8, K = 1: only the token limit separates
    # them, and the shared form shares it); fused never wins.
    def per_family(policy, t):
        p = point(policy, 8, 1, 1, t, False, "split")
        cluster_max = 64 if policy == "DeepSeekV3" else 128
        return dict(p, fused_us=4.0, cluster_us=2.0 if t <= cluster_max else 4.0, split_us=3.0)
    pts = [per_family(policy, t) for policy in ("DeepSeekV3", "Renormalize")
           for t in (1, 16, 32, 64, 96, 128, 192, 256)]
    check(ars.propose_three_way_rule(pts)[1] < 1.0, "shared limits cannot split the families")
    by_family, share = ars.propose_family_rule(pts)
    check(share == 1.0, f"per-family share {share} with {by_family}")
    check(by_family["deepseek"][4] == 64 and by_family["other"][4] == 128,
          f"per-family cluster token limits {by_family}")
    check([ars.family_rule_choice(p, by_family) for p in pts[:8]] == ["cluster"] * 4 + ["split"] * 4,
          "per-family choices")
    check("proposed per family" in ars.report({"points": pts}), "per-family proposal printed")
    # Fused never wins there: the proposals say so rather than "T <= 0".
    report = ars.report({"points": pts})
    check("deepseek: fused never; cluster iff" in report and "other: fused never; cluster iff" in report,
          "per-family rule without a fused limit printed as such")
    check("proposed three-way: fused never" in report, "three-way rule without a fused limit printed as such")
    print("analyze_routing_sweep: ok")


if __name__ == "__main__":
    main()
