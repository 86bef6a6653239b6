"""What the peer scripts of this folder share: the argument parsers, the
expected number of experts a uniform top-K routing hits, and the timing of
one CUDA-graph replay. Imported as a sibling module (a script run from this
folder has it on sys.path); PyTorch is passed in, so that the scripts'
dry runs work without it."""
import argparse
import statistics


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
