"""The fused decoder's kernels as a Hopper card would run them, measured without one.

`launches(shape)` runs one decoder layer, the final norm and the output head through the
decoder's own code (decoding/fused.py's `layer_pass`) on meta tensors of a model's real
shape, with Triton's launch replaced by a recorder that does what a launch does before it
runs: the same binder specializes the arguments (types, alignment hints, constants) and
parses the options (num_warps, num_stages) that the wrappers in tiles.py pass. So each record
is a production launch: its grid, and what it compiles. `compile_launch` compiles a record
for sm_90 to the end (ptxas), and `resources` reads what the card would need from the
compiled kernel: registers per thread and its stack frame from the cubin (cuobjdump), spill
bytes from ptxas' own report on the same PTX with Triton's flags (its registers checked
against the cubin's), shared memory from Triton's metadata.

Runs with Triton's interpreter off (TRITON_INTERPRET unset): the recorder patches
JITFunction, which the interpreter does not use. bench/gpu_kernels.py writes
docs/gpu-kernels.md from it; tests/test_gpu_kernels.py asserts on it.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

SM90 = 90
SM90_SHARED = 227 * 1024  # the most shared memory a block may use on sm_90 (opt-in)
SMS = {"H100": 132, "H200": 132}  # SXM parts: streaming multiprocessors
CAPACITY = 4096  # cache slots for the attention kernels' grids (chunks fixed by capacity)


@dataclass
class Launch:
    """One kernel launch as the decoder makes it: `op` says which linear or step it is."""

    op: str
    fn: object  # the JITFunction
    grid: tuple[int, ...]
    signature: dict
    constexprs: dict
    attrs: dict
    options: object
    args: dict = field(default_factory=dict)  # the non-tensor arguments by name

    @property
    def kernel(self) -> str:
        return self.fn.__name__

    @property
    def ctas(self) -> int:
        n = 1
        for g in self.grid:
            n *= g
        return n


def _target():
    from triton.backends.compiler import GPUTarget

    return GPUTarget("cuda", SM90, 32)


@contextmanager
def recording(into: list[Launch], op: list[str]):
    """Within: a Triton launch is recorded (not run); `op[0]` names it."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise RuntimeError("offline launches need Triton's interpreter off (TRITON_INTERPRET)")
    from triton.compiler import make_backend
    from triton.runtime.jit import JITFunction, create_function_from_signature

    backend = make_backend(_target())
    original = JITFunction.run

    def run(self, *args, grid, warmup, **kwargs):
        kwargs["debug"] = kwargs.get("debug", self.debug) or False
        binder = create_function_from_signature(self.signature, self.params, backend)
        bound, specialization, options = binder(*args, **kwargs)
        options, signature, constexprs, attrs = self._pack_args(backend, kwargs, bound,
                                                                specialization, options)
        scalars = {k: v for k, v in bound.items() if isinstance(v, (int, float, bool))}
        into.append(Launch(op[0], self, tuple(grid), signature, constexprs, attrs, options,
                           scalars))

    JITFunction.run = run
    try:
        yield
    finally:
        JITFunction.run = original


def _layer(hidden: int, inter: int, heads: int, kv_heads: int, head_dim: int, int4: bool,
           bias: bool):
    from specgen.decoding.fused import FusedLayer
    from specgen.kernels import gpu

    def weight(n: int, k: int, with_bias: bool = False) -> gpu.Weight:
        b = torch.empty(n, dtype=torch.bfloat16, device="meta") if with_bias else None
        if int4:
            return gpu.Weight(torch.empty(n, k // 8, dtype=torch.int32, device="meta"), n, k,
                              torch.empty(n, k // gpu.GROUP, 2, dtype=torch.bfloat16,
                                          device="meta"), b)
        return gpu.Weight(torch.empty(n, k, dtype=torch.bfloat16, device="meta"), n, k, None, b)

    norm = torch.empty(hidden, dtype=torch.bfloat16, device="meta")
    return FusedLayer(weight((heads + 2 * kv_heads) * head_dim, hidden, bias),
                      weight(hidden, heads * head_dim), weight(2 * inter, hidden),
                      weight(hidden, inter), norm, 1e-6, norm, 1e-6, head_dim ** -0.5)


def launches(shape: tuple, m: int, int4: bool = False, tree: bool = False,
             capacity: int = CAPACITY) -> list[Launch]:
    """The launches of one layer, the final norm and the output head for a pass of m rows of a
    model of `shape` (bench/gpu.py's: family, hidden, intermediate, layers, heads, kv heads,
    head_dim or None, vocab), in the order the decoder makes them; bf16, or int4-gpu linears
    (the output head stays bf16, as in an int4-gpu model)."""
    from specgen.decoding.fused import layer_pass
    from specgen.kernels import gpu

    family, hidden, inter, _, heads, kv_heads, head_dim, vocab = shape
    head_dim = head_dim or hidden // heads
    layer = _layer(hidden, inter, heads, kv_heads, head_dim, int4, family == "qwen2")
    meta = dict(dtype=torch.bfloat16, device="meta")
    x = torch.empty(m, hidden, **meta)
    kv = torch.empty(2, kv_heads, capacity, head_dim, **meta)
    cos = torch.empty(capacity, head_dim, **meta)
    pos = torch.empty(1, dtype=torch.int64, device="meta")
    from specgen.decoding.cuda import MAX_TREE_ROWS  # the decoder's one table, every width

    table = (torch.empty(MAX_TREE_ROWS, MAX_TREE_ROWS + 1, dtype=torch.int32, device="meta")
             if tree else None)
    head = gpu.Weight(torch.empty(vocab, hidden, **meta), vocab, hidden)
    out: list[Launch] = []
    op = ["layer"]
    names = iter(["qkv", "attention", "o", "gate_up", "down"])  # the norms in the loads

    class Named(list):  # name each launch as it is appended
        def append(self, launch):
            launch.op = next(names, launch.op)
            super().append(launch)

    layer_launches: list[Launch] = Named()
    with recording(layer_launches, op):
        pending, residual = layer_pass(layer, x, x, kv, cos, cos, pos, heads, kv_heads, table)
    out += layer_launches
    with recording(out, op):
        op[0] = "final norm"
        x, _ = gpu.add_rms_norm(pending, residual, layer.norm_1, 1e-6)
        op[0] = "head"
        gpu.linear(x, head)
    return out


@dataclass
class Compiled:
    launch: Launch
    hash: str
    regs: int
    spills: int  # spill stores + loads, bytes (ptxas)
    stack: int  # stack frame per thread, bytes (cubin): where spills go
    shared: int  # bytes (Triton's metadata)
    num_warps: int
    num_stages: int
    cubin: bytes
    sass: str = ""


def compile_launch(launch: Launch):
    """The launch's kernel compiled for sm_90 as Triton would compile it for the card."""
    import triton
    from triton.compiler import ASTSource

    return triton.compile(ASTSource(launch.fn, launch.signature, launch.constexprs, launch.attrs),
                          target=_target(), options=launch.options.__dict__)


def _tool(name: str) -> str:
    from triton.backends.nvidia.compiler import get_ptxas

    if name == "ptxas":
        return get_ptxas(SM90).path
    return os.path.join(os.path.dirname(get_ptxas(SM90).path), name)


def cubin_resources(cubin: bytes) -> dict[str, int]:
    """REG, STACK, SHARED, LOCAL of the one kernel in a cubin, as cuobjdump reads them."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([_tool("cuobjdump"), "--dump-resource-usage", f.name],
                              capture_output=True, text=True, check=True).stdout
    found = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", text)
    if found is None:
        raise RuntimeError(f"no resource usage in cuobjdump's output:\n{text}")
    return dict(zip(("regs", "stack", "shared", "local"), map(int, found.groups())))


def ptxas_report(ptx: str) -> dict[str, int]:
    """ptxas -v on the kernel's PTX with Triton's own flags (backends/nvidia/compiler.py):
    registers and spill bytes as ptxas reports them."""
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        run = subprocess.run([_tool("ptxas"), "-lineinfo", "-v", "--regAllocOptLevel=2",
                              "--gpu-name=sm_90a", src, "-o", os.path.join(tmp, "k.o")],
                             capture_output=True, text=True, check=True)
    log = run.stderr + run.stdout
    regs = re.search(r"Used (\d+) registers", log)
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    if regs is None or spills is None:
        raise RuntimeError(f"ptxas said nothing of registers or spills:\n{log}")
    return dict(regs=int(regs.group(1)), spills=int(spills.group(1)) + int(spills.group(2)))


def sass(cubin: bytes) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([_tool("cuobjdump"), "-sass", f.name], capture_output=True,
                              text=True, check=True).stdout


def measure(launch: Launch, with_sass: bool = False) -> Compiled:
    kernel = compile_launch(launch)
    cubin = kernel.asm["cubin"]
    found = cubin_resources(cubin)
    report = ptxas_report(kernel.asm["ptx"])
    if report["regs"] != found["regs"]:
        raise RuntimeError(f"{launch.kernel}: ptxas reports {report['regs']} registers, the "
                           f"cubin holds {found['regs']}: not the same compile")
    return Compiled(launch, kernel.hash, found["regs"], report["spills"], found["stack"],
                    kernel.metadata.shared, kernel.metadata.num_warps,
                    kernel.metadata.num_stages, cubin, sass(cubin) if with_sass else "")


def _instructions(text: str) -> list[tuple[int, str]]:
    """(address, instruction) of each SASS line of cuobjdump -sass."""
    out = []
    for line in text.splitlines():
        found = re.search(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line)
        if found:
            out.append((int(found.group(1), 16), found.group(2)))
    return out


def main_loop(text: str) -> tuple[list[str], int]:
    """The loop that holds the tensor-core instructions (HMMA), and the fewest instructions
    one trip through it executes: its shortest path from head to back edge, every forward
    branch inside it taken or not (a pass of one row tile skips the other tiles' products).
    Returns (the loop's instructions, that count)."""
    ins = _instructions(text)
    index = {a: i for i, (a, _) in enumerate(ins)}
    loops = []
    for i, (a, s) in enumerate(ins):
        back = re.search(r"BRA\s+(0x[0-9a-f]+)", s)
        if back and int(back.group(1), 16) <= a and int(back.group(1), 16) in index:
            loops.append((index[int(back.group(1), 16)], i))
    loops = [(h, t) for h, t in loops if any("MMA" in ins[j][1] for j in range(h, t + 1))]
    if not loops:
        raise LookupError("no loop with tensor-core instructions")
    head, tail = max(loops, key=lambda ht: ht[1] - ht[0])
    # shortest path over the body's forward edges (a DAG): fall through, or jump ahead
    inf = float("inf")
    cost = [inf] * (tail + 2)
    cost[head] = 0
    for j in range(head, tail + 1):
        if cost[j] == inf:
            continue
        s = ins[j][1]
        here = cost[j] + 1
        jump = re.search(r"BRA\s+(0x[0-9a-f]+)", s)
        target = index.get(int(jump.group(1), 16)) if jump else None
        if j == tail:
            cost[tail + 1] = min(cost[tail + 1], here)
            continue
        if target is not None and head < target <= tail:
            cost[target] = min(cost[target], here)
        if target is None or s.startswith("@"):  # a predicated branch may fall through
            cost[j + 1] = min(cost[j + 1], here)
        elif target is not None and target > tail:
            pass  # an unconditional exit from the loop
    return [s for _, s in ins[head:tail + 1]], int(cost[tail + 1])


def instructions_per_weight(compiled: Compiled) -> tuple[float, float]:
    """SASS instructions a thread issues per int4 weight it streams, in one trip of the
    int4 linear's main loop (one group of GROUP inputs for BLOCK_N outputs, spread over the
    program's threads): (a pass of one row tile, the loop's every instruction: three tiles)."""
    launch = compiled.launch
    names = [p.name for p in launch.fn.params]
    const = {names[i[0]]: v for i, v in launch.constexprs.items()}
    weights = const["BLOCK_N"] * const["GROUP"] / (32 * compiled.num_warps)
    body, shortest = main_loop(compiled.sass)
    return shortest / weights, len(body) / weights
