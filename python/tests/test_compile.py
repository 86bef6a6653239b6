"""The custom op unimoe::moe_forward: its fake implementation, the checks
torch.library.opcheck makes of a custom op, and torch.compile(fullgraph=True)
of a module that calls the layer, on the CPU reference (the GPU version is in
test_gpu.py). Compiled with the "aot_eager" backend (AOTAutograd over the
fake implementation, then eager kernels) and with "inductor", which on the
CPU generates and compiles C++ with the machine's g++.
"""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import unimoe

E, K, H, I = 8, 2, 64, 32


def make_layer(device="cpu"):
    g = torch.Generator().manual_seed(7)
    layer = unimoe.MoELayer(f"policy=Renormalize E={E} K={K} H={H} I={I}", 16, device=device)
    layer.set_weights((torch.randn(E, 2 * I, H, generator=g) * 0.1).bfloat16().to(device),
                      (torch.randn(E, H, I, generator=g) * 0.1).bfloat16().to(device))
    return layer


class Block(torch.nn.Module):
    """A model's MoE block: the gate Linear makes the logits, the layer the rest."""

    def __init__(self, layer):
        super().__init__()
        g = torch.Generator().manual_seed(8)
        self.gate = torch.nn.Linear(H, E, bias=False)
        with torch.no_grad():
            self.gate.weight.copy_(torch.randn(E, H, generator=g))
        self.layer = layer

    def forward(self, x):
        logits = self.gate(x)
        return x + self.layer(x.bfloat16(), logits).float()


def test_fake_impl_gives_the_output_shape_and_dtype():
    layer = make_layer()
    with FakeTensorMode():
        x = torch.empty(5, H, dtype=torch.bfloat16)
        logits = torch.empty(5, E)
        out = torch.ops.unimoe.moe_forward(layer.handle, x, logits, None, None, None)
        assert out.shape == (5, H) and out.dtype == torch.bfloat16
        assert isinstance(out, torch._subclasses.fake_tensor.FakeTensor)


def test_opcheck():
    layer = make_layer()
    x = torch.randn(5, H).bfloat16()
    logits = torch.randn(5, E)
    torch.library.opcheck(torch.ops.unimoe.moe_forward.default,
                          (layer.handle, x, logits, None, None, None))


def test_the_op_and_the_eager_call_agree():
    layer = make_layer()
    x, logits = torch.randn(5, H).bfloat16(), torch.randn(5, E)
    via_op = torch.ops.unimoe.moe_forward(layer.handle, x, logits, None, None, None)
    assert torch.equal(via_op, layer(x, logits))


def test_a_destroyed_layer_handle_is_refused():
    layer = make_layer()
    handle = layer.handle
    del layer
    with pytest.raises(RuntimeError, match=f"handle {handle}"):
        torch.ops.unimoe.moe_forward(handle, torch.randn(2, H).bfloat16(), torch.randn(2, E),
                                     None, None, None)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile_fullgraph(backend):
    torch._dynamo.reset()
    block = Block(make_layer())
    graphs = []

    def recording(gm, example_inputs):
        graphs.append(gm)
        if backend == "inductor":
            from torch._inductor.compile_fx import compile_fx
            return compile_fx(gm, example_inputs)
        from torch._dynamo.backends.debugging import aot_eager
        return aot_eager(gm, example_inputs)

    compiled = torch.compile(block, backend=recording, fullgraph=True, dynamic=True)
    for t in (3, 7, 3):
        x = torch.randn(t, H)
        with torch.no_grad():
            assert torch.equal(compiled(x), block(x))
    assert len(graphs) == 1  # one graph for every T: no break, no recompile
    ops = [n.target for n in graphs[0].graph.nodes if n.op == "call_function"]
    op = torch.ops.unimoe.moe_forward
    assert op in ops or op.default in ops
