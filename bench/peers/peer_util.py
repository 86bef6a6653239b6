"""What the peer scripts of this folder share: the preset shapes, the
argument parsers, the expected number of experts a uniform top-K routing
hits, the timing of one CUDA-graph replay, and the JSON lines and results
file they write. Imported as a sibling module (a script run from this
folder has it on sys.path); PyTorch is passed in, so that the scripts'
dry runs work without it."""
import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import NamedTuple


class Shape(NamedTuple):
    experts: int       # E
    hidden: int        # H
    intermediate: int  # I
    top_k: int         # K
    activation: str    # "swiglu_oai" (gpt-oss: interleaved gate/up, biases) or "silu"


# unimoe-bench's presets (tools/bench/support/presets.cpp), routed experts only;
# the peers' tests check them against presets.cpp.
SHAPES = {
    "mixtral-8x7b": Shape(8, 4096, 14336, 2, "silu"),
    "qwen3-30b-a3b": Shape(128, 2048, 768, 8, "silu"),
    "qwen3-235b-a22b": Shape(128, 4096, 1536, 8, "silu"),
    "deepseek-v3": Shape(256, 7168, 2048, 8, "silu"),
    "dsv3-tp8": Shape(256, 7168, 256, 8, "silu"),
    "gpt-oss-120b": Shape(128, 2880, 2880, 4, "swiglu_oai"),
    "kimi-k2": Shape(384, 7168, 2048, 8, "silu"),
    "llama4-maverick": Shape(128, 5120, 8192, 1, "silu"),  # weights on GEMM2, as for the others
    "minimax-m2": Shape(256, 3072, 1536, 8, "silu"),
}


def round_up(x, m):
    return (x + m - 1) // m * m


def parse_tokens(text):
    """"1,8,64" -> [1, 8, 64]; positive integers only."""
    try:
        counts = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"token counts must be positive integers, comma-separated: {text!r}")
    return counts


def parse_names(text, known, what):
    """"a,b" -> ["a", "b"], each one of `known`; `what` names them in the error."""
    names = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [n for n in names if n not in known]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"unknown {what} {unknown or text!r}; known: {', '.join(known)}")
    return names


def expected_hit_experts(shape, tokens):
    """Experts hit by `tokens` tokens of uniform top-K routing, on average."""
    e, k = shape.experts, shape.top_k
    return e * (1.0 - (1.0 - k / e) ** tokens)


def time_graph(torch, body, replays, warmup):
    """Median ms of one replay of a CUDA graph of body()."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            body()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        body()
    for _ in range(warmup):
        graph.replay()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(replays)]
    for start, end in events:
        start.record()
        graph.replay()
        end.record()
    torch.cuda.synchronize()
    ms = statistics.median(s.elapsed_time(e) for s, e in events)
    del graph
    return ms


def add_timing_arguments(ap, reference="the fp32 reference"):
    """The options both Triton peers take: replays, warm-up, checked tokens,
    seed, weight copies and their memory, the JSON file, the dry run's L2
    size and tracebacks. check_timing_arguments validates them."""
    ap.add_argument("--replays", type=int, default=50,
                    help="timed graph replays per figure; the median is kept (default 50)")
    ap.add_argument("--warmup", type=int, default=5, help="untimed replays first (default 5)")
    ap.add_argument("--check-tokens", type=int, default=16,
                    help=f"tokens compared with {reference} (default 16)")
    ap.add_argument("--seed", type=int, default=0, help="seed of weights, inputs and routing (default 0)")
    ap.add_argument("--max-copies", type=int, default=16, help="most weight copies rotated through L2 (default 16)")
    ap.add_argument("--weight-budget-gib", type=float, default=0.0,
                    help="GPU memory the weight copies may take (default: half the free memory)")
    ap.add_argument("--json", metavar="FILE", help="also write all points, with provenance, to FILE")
    ap.add_argument("--l2-mib", type=float, default=50.0, help="L2 size the dry run assumes (default 50, an H100)")
    ap.add_argument("--verbose", action="store_true", help="print a failing point's traceback to stderr")


def check_timing_arguments(ap, args):
    if min(args.replays, args.check_tokens, args.max_copies) < 1 or args.warmup < 0:
        ap.error("--replays, --check-tokens and --max-copies must be >= 1, --warmup >= 0")


TIMING_NOTE = "CUDA-graph replay, median of --replays, weight copies rotated through L2"


def emitter(rows):
    """emit(row): keeps the row and prints it as one JSON line, flushed."""
    def emit(row):
        rows.append(row)
        print(json.dumps(row), flush=True)
    return emit


def write_results(path, peer, source, rows, argv, torch, triton, extra=None):
    """The --json file: provenance (the peer, its source, the device, then
    `extra`'s fields, the versions, the timing, the command) and the rows."""
    provenance = {"peer": peer, "source": source, "device": torch.cuda.get_device_name(), **(extra or {}),
                  "torch": torch.__version__, "triton": triton.__version__, "timing": TIMING_NOTE,
                  "command": " ".join([Path(sys.argv[0]).name] + list(argv))}
    Path(path).write_text(json.dumps({"provenance": provenance, "points": rows}, indent=1) + "\n")
