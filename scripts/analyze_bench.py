#!/usr/bin/env python3
"""Compares an unimoe-bench JSON with the peer anchors, point by point.

    scripts/analyze_bench.py RESULTS.json bench/peers/h200-bf16-peers.json

(e.g. RESULTS.json = bench/results/h200/layer-bf16.json)

For each (preset, T) in both files: unimoe's time (best backend when several
ran), three floors (the anchor file's; one from this run's measured ceilings;
a strict one with the higher of the two bandwidths and matmul rates), and the
ratio to the best peer. Ends with the geometric means of time over each
floor (the form the BF16 targets take), the points slower than the best peer (with the
active-expert counts where this run's routing hit more experts than the
peer's, which then read fewer weight bytes), the T=1 points against 1.6x
the anchor floor, each point's stage times and, from T=4096 in runs that
carry stage floors, each stage's time against its own floor.
"""
import json
import math
import sys

T1_BOUND = 1.6  # the BF16 target: T=1 at most 1.6x the floor on every shape
STAGES = ["routing", "permute", "gemm1", "gemm2", "finalize"]  # the launch chain's order
LARGE_T = 4096  # from here the points get a stage accounting (the prefill targets' T)


def slower_note(name, t, us, peer_us, active, peer_active):
    """'mixtral-8x7b T=8 (+3.1%)', with the active experts of both runs when they differ."""
    note = f"{name} T={t} (+{100 * (us / peer_us - 1):.1f}%"
    if active is not None and peer_active is not None and round(active) != round(peer_active):
        note += f"; {active:g} active experts here, {peer_active:g} in the peer's run"
    return note + ")"


def stage_accounting(p):
    """Where a point's time over its floor goes, or None without stage floors
    (older runs, CPU runs): [(stage, time_us, floor_us, time - floor_us)]
    in chain order, then the layer's own time, floor and difference. The
    stage floors add up to more than the layer's (they count the
    intermediates act and y), so the stages' differences locate the time
    lost in each kernel, and the layer's gap less their sum is what the
    split chain itself costs."""
    floors = p.get("stage_floors")
    st = p.get("stages_us", {})
    if not floors:
        return None
    rows = [(n, st.get(n, 0.0), floors[n]["floor_us"], st.get(n, 0.0) - floors[n]["floor_us"])
            for n in STAGES if n in floors]
    return rows, (p["time_us"], p["floor_us"], p["time_us"] - p["floor_us"])


def main():
    run = json.load(open(sys.argv[1]))
    anchors = json.load(open(sys.argv[2]))
    anchor_rows = {(r["shape"], r["T"]): r for r in anchors["rows"]}
    best = {}
    for p in run["points"]:
        key = (p["preset"], p["T"])
        if key not in best or p["time_us"] < best[key]["time_us"]:
            best[key] = p
    bw = max(run["ceilings"]["bandwidth_TBps"], anchors["measured_bandwidth_TBps"])
    tf = max(run["ceilings"]["matmul_TFLOPs"], anchors["measured_bf16_matmul_TFLOPs"])
    print(f"strict floor: {bw:.3f} TB/s, {tf:.1f} TFLOP/s")
    print(f"{'preset':16} {'T':>6} {'backend':8} {'time_us':>9} {'t/anchor':>8} {'t/run':>6} {'t/strict':>8} {'peer_us':>9} {'t/peer':>6}")
    logs = {"anchor": [], "run": [], "strict": []}
    slower = []
    t1 = []
    for key, p in sorted(best.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        if key not in anchor_rows:
            continue
        a = anchor_rows[key]
        strict = max(p["bytes"] / (bw * 1e6), p["flops"] / (tf * 1e6))
        peer = min(a["vllm_triton_experts_us"], a["torch_grouped_us"])
        ratios = {"anchor": p["time_us"] / a["floor_us"], "run": p["time_us"] / p["floor_us"],
                  "strict": p["time_us"] / strict}
        for k, v in ratios.items():
            logs[k].append(math.log(v))
        if p["time_us"] > peer:
            slower.append(slower_note(key[0], key[1], p["time_us"], peer, p.get("active_experts"),
                                      a.get("active_experts")))
        if key[1] == 1:
            t1.append((key[0], p["time_us"], ratios["anchor"], T1_BOUND * a["floor_us"]))
        print(f"{key[0]:16} {key[1]:>6} {p['backend']:8} {p['time_us']:9.1f} {ratios['anchor']:8.2f} "
              f"{ratios['run']:6.2f} {ratios['strict']:8.2f} {peer:9.1f} {p['time_us'] / peer:6.2f}")
    for k, v in logs.items():
        if v:
            print(f"geometric mean of time/floor ({k} floor) over {len(v)} points: {math.exp(sum(v) / len(v)):.3f}")
    print(f"points slower than the best peer ({len(slower)}): {', '.join(slower) or 'none'}")
    for name, us, ratio, bound in t1:
        verdict = "ok" if ratio <= T1_BOUND else "MISSED"
        print(f"T=1 {name}: {us:.1f} us = {ratio:.2f}x the anchor floor (bound {T1_BOUND}x = {bound:.1f} us): {verdict}")
    print("stage times (us)" + (", [what served the call]" if any("plan" in p for p in best.values()) else "") + ":")
    for key, p in sorted(best.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        st = p.get("stages_us", {})
        order = [n for n in STAGES if n in st] + sorted(n for n in st if n not in STAGES)
        stages = " ".join(f"{name} {st[name]:.1f}" for name in order)
        plan = f"  [{p['plan']}]" if "plan" in p else ""
        print(f"  {key[0]:16} {key[1]:>6}  {stages}{plan}")
    large = [(key, p) for key, p in sorted(best.items()) if key[1] >= LARGE_T and stage_accounting(p)]
    if large:
        print(f"stage accounting at T >= {LARGE_T} (us: time / the stage's own floor, +time over it):")
    for key, p in large:
        rows, (us, floor, gap) = stage_accounting(p)
        stages = " ".join(f"{n} {t:.1f}/{f:.1f} (+{d:.1f})" for n, t, f, d in rows)
        print(f"  {key[0]:16} {key[1]:>6}  layer {us:.1f}/{floor:.1f} (+{gap:.1f}): {stages}")


if __name__ == "__main__":
    main()
