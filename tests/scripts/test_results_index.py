#!/usr/bin/env python3
"""bench/results and bench/peers keep their promises: every result file is
listed in bench/results/README.md and says inside how it was made (a
provenance object in JSON, a '#' header with the date in text); file names
say what they hold; the peer files hold their provenance; the PyTorch
peer's command line answers --help without a GPU or PyTorch."""
import gzip
import json
import os
import re
import subprocess
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
RESULTS = os.path.join(ROOT, "bench", "results")
PEERS = os.path.join(ROOT, "bench", "peers")
DATE = re.compile(r"date:\s*\d{4}-\d{2}-\d{2}", re.IGNORECASE)
NAME = re.compile(r"^[a-z][a-z0-9-]*\.(json|json\.gz|txt|png)$")
DATED = re.compile(r"\d{4}-\d{2}-\d{2}")


def result_files():
    for folder, _, names in os.walk(RESULTS):
        for name in names:
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, RESULTS)
            if rel != "README.md":
                yield rel, path


def load_json(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def check_results(errors):
    with open(os.path.join(RESULTS, "README.md")) as f:
        index = f.read()
    files = sorted(result_files())
    if not files:
        errors.append("bench/results holds no result")
    if len(files) > 30:
        errors.append(f"bench/results holds {len(files)} files; keep the current baselines only (at most 30)")
    for rel, path in files:
        name = os.path.basename(rel)
        if f"`{name}`" not in index:
            errors.append(f"{rel}: not listed in bench/results/README.md")
        if not NAME.match(name) or DATED.search(name):
            errors.append(f"{rel}: name it by what it holds (lower case, dashes, no date)")
        if name.endswith((".json", ".json.gz")):
            prov = load_json(path).get("provenance")
            missing = [k for k in ("command", "commit", "device", "date") if not (prov or {}).get(k)]
            if missing:
                errors.append(f"{rel}: provenance lacks {', '.join(missing)}")
        elif name.endswith(".txt"):
            with open(path) as f:
                head = [line for line in f.read().split("\n")[:12] if line.startswith("#")]
            if not any(DATE.search(line) for line in head):
                errors.append(f"{rel}: no '# ... date: YYYY-MM-DD' header line")


def check_peers(errors):
    for name in ("h200-bf16-peers.json", "h100-peers.json"):
        prov = load_json(os.path.join(PEERS, name)).get("provenance")
        missing = [k for k in ("device", "date", "command", "caveat") if not (prov or {}).get(k)]
        if missing:
            errors.append(f"bench/peers/{name}: provenance lacks {', '.join(missing)}")
    # unimoe-bench --anchors reads the rows of the H200 file.
    rows = load_json(os.path.join(PEERS, "h200-bf16-peers.json")).get("rows", [])
    if len(rows) != 30 or not all({"shape", "T", "torch_grouped_us", "vllm_triton_experts_us"} <= set(r) for r in rows):
        errors.append("bench/peers/h200-bf16-peers.json: expected 30 rows with shape, T and both peers' times")
    script = os.path.join(PEERS, "torch_peer.py")
    done = subprocess.run([sys.executable, script, "--help"], capture_output=True, text=True)
    if done.returncode != 0 or "--shape" not in done.stdout or "--tokens" not in done.stdout:
        errors.append(f"bench/peers/torch_peer.py --help: rc {done.returncode}: {done.stdout}{done.stderr}")


def main():
    errors = []
    check_results(errors)
    check_peers(errors)
    for e in errors:
        print("FAIL:", e)
    if errors:
        return 1
    print("results_index: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
