"""The torch switch's host cost a weight-gradient call, on a CPU: its real CUDA hot path with the driver stubbed.

    python bench/host_path.py [--artifacts DIR] [--out FILE.json] [--passes 30] [--paths python,cxx,cxx_launch]

(issue 37 item 3; docs/torch.md#host-cost-a-call-on-a-cpu.) Each call goes through torch's dispatcher to the switch's
override (``enable()``: the Python path; ``native=True``: the C++ kernel; ``cxx_launch``: the C++ kernel with
``$CONVBW_TORCH_NATIVE_LAUNCH=1``), its decision memo, a real ``DirectCall`` built from a real kernel's schedule
(``launch.json`` of the artifacts folder: ResNet-50's sm_90a and EfficientNet-B0's sm_80 kernels at batch 64 in
``.art/host37/ts``), its ``CudaLauncher`` and the driver calls: into ``bench/cuda_stub.c``, a C library with every
driver function the launch calls by cuda.h's prototype, counting calls and doing no GPU work. torch's CUDA streams,
capture check, graphs and the workspace are CPU stand-ins (:func:`stubbed`). What it cannot show: the driver's own
time inside each call (a launch, a tensor-map encoding, a pinned allocation, a graph capture) and the CUDA caching
allocator's; it counts those calls a call instead, for the GPU run to price.

Two memories: ``repeat`` (each layer's x and dy at the same addresses every pass: one model training alone) and
``moving`` (new addresses every call: bench/train_step.py's four models in turns, where the H100 run saw 0.7 tensor-map
encodings a call). Per path and memory: µs a call (median of the passes), the driver calls a call, and cProfile's
Python functions a call. The stub is checked first (:func:`check_signatures`): a prototype of it that differs from
the launcher's ctypes declarations, or a function missing, is an error naming it.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import ctypes
import glob
import hashlib
import io
import json
import os
import pstats
import re
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple

import torch

from convbw_mlir import cuda_launch
from convbw_mlir.torch import entry, native
from convbw_mlir.torch import switch as sw

HERE = Path(__file__).resolve().parent
STUB_SOURCE = HERE / "cuda_stub.c"
STREAM = 0  # the C++ kernel's stream on the CPU (nullptr); the Python launch queues on the same
PATHS = ("python", "cxx", "cxx_launch")
MEMORIES = ("repeat", "moving")
DEFAULT_ARTIFACTS = Path("/work/main/.art/host37/ts")
# the driver functions the C++ kernel is handed by address only (DirectCall.native_launch), not declared by ctypes
ADDRESS_ONLY = ("cuGraphLaunch",)


# -- the stub -----------------------------------------------------------------------------------------
def cuda_header() -> Path | None:
    """cuda.h, where a CUDA toolkit is installed: the stub is then compiled against it (its prototypes checked)."""
    roots = [os.environ.get("CUDA_HOME", ""), "/usr/local/cuda", *sorted(glob.glob("/usr/local/cuda-*"))]
    return next((Path(r) / "include" / "cuda.h" for r in roots if r and (Path(r) / "include" / "cuda.h").is_file()),
                None)  # fmt: skip


def build_stub(folder: Path | None = None) -> ctypes.CDLL:
    """bench/cuda_stub.c compiled (once per source) and loaded.

    Raises:
        RuntimeError: the compiler's error (a stub prototype that cuda.h declares otherwise names the function).
    """
    header = cuda_header()
    flags = ["-DCONVBW_HAVE_CUDA_H", f"-I{header.parent}"] if header else []
    digest = hashlib.sha256(STUB_SOURCE.read_bytes() + " ".join(flags).encode()).hexdigest()[:12]
    folder = Path(folder or tempfile.gettempdir())
    lib = folder / f"libcuda_stub-{digest}.so"
    if not lib.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        tmp = lib.with_suffix(f".{os.getpid()}.tmp")
        cmd = [os.environ.get("CC", "cc"), "-O2", "-shared", "-fPIC", "-Werror=incompatible-pointer-types", *flags,
               "-o", str(tmp), str(STUB_SOURCE)]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"bench/cuda_stub.c did not compile ({' '.join(cmd)}):\n{done.stderr[-3000:]}")
        tmp.replace(lib)
    return ctypes.CDLL(str(lib))


_C_SCALARS = {
    "int": ctypes.c_int, "unsigned int": ctypes.c_uint, "unsigned": ctypes.c_uint, "size_t": ctypes.c_size_t,
    "unsigned char": ctypes.c_ubyte, "unsigned short": ctypes.c_ushort, "CUdeviceptr": ctypes.c_uint64,
    "cuuint32_t": ctypes.c_uint32, "cuuint64_t": ctypes.c_uint64, "CUresult": ctypes.c_int, "CUdevice": ctypes.c_int,
    "char": ctypes.c_char,
}  # fmt: skip
_C_ENUMS = ("CUdevice_attribute", "CUfunction_attribute", "CUstreamCaptureStatus", "CUstreamCaptureMode",
            "CUtensorMapDataType",
            "CUtensorMapInterleave", "CUtensorMapSwizzle", "CUtensorMapL2promotion",
            "CUtensorMapFloatOOBfill")  # fmt: skip
_C_HANDLES = ("CUcontext", "CUmodule", "CUfunction", "CUstream", "CUgraphExec", "CUevent", "void", "CUtensorMap")


def stub_prototypes() -> dict[str, list[str]]:
    """The stub's driver functions: name -> its parameters' C types (``const`` and names dropped)."""
    out = {}
    for line in STUB_SOURCE.read_text().splitlines():
        found = re.match(r"CUresult (\w+)\((.*?)\) \{", line)
        if found:
            params = [re.sub(r"\bconst\b", "", p).strip() for p in found.group(2).split(",")]
            out[found.group(1)] = [re.sub(r"\s*\w+$", "", p).replace(" *", "*").strip() for p in params]
    return out


def _matches(c_type: str, declared: Any) -> bool:
    """Whether ctypes type ``declared`` passes a value of C type ``c_type`` as the C function takes it."""
    stars = c_type.count("*")
    base = c_type.rstrip("*").strip()
    if stars == 0:
        if base in _C_HANDLES:
            return declared is ctypes.c_void_p
        want = ctypes.c_int if base in _C_ENUMS else _C_SCALARS.get(base)
        return want is not None and ctypes.sizeof(want) == ctypes.sizeof(declared) and (
            want(-1).value < 0) == (declared(-1).value < 0)  # fmt: skip
    if declared is ctypes.c_void_p:  # any pointer passes as an address
        return True
    if stars == 1 and base in ("char", "void"):  # bytes passed as a char* (cuModuleLoadData's image)
        return declared is ctypes.c_char_p or (base == "void" and declared is ctypes.c_void_p)
    pointee = getattr(declared, "_type_", None)
    return isinstance(pointee, type) and _matches(c_type[:-1], pointee)


def check_signatures(prototypes: dict[str, list[str]] | None = None) -> None:
    """The stub's prototypes against the launcher's ctypes declarations and the functions the C++ kernel is handed.

    Raises:
        RuntimeError: naming each function missing from the stub or declared otherwise (the stub has drifted).
    """
    prototypes = stub_prototypes() if prototypes is None else prototypes
    wrong = []
    declared = {**cuda_launch.DRIVER_SIGNATURES, **cuda_launch.OPTIONAL_SIGNATURES}
    for name in {*declared, *entry.NATIVE_DRIVER_FUNCTIONS, *ADDRESS_ONLY} - set(prototypes):
        wrong.append(f"{name}: not in bench/cuda_stub.c")
    for name, args in declared.items():
        params = prototypes.get(name)
        if params is None:
            continue
        if len(params) != len(args):
            wrong.append(f"{name}: {len(params)} parameters in the stub, {len(args)} declared in cuda_launch")
            continue
        for i, (c_type, ct) in enumerate(zip(params, args)):
            if not _matches(c_type, ct):
                wrong.append(f"{name}: parameter {i} is {c_type} in the stub, {ct.__name__} in cuda_launch")
    if wrong:
        raise RuntimeError("bench/cuda_stub.c has drifted from the driver calls: " + "; ".join(sorted(wrong)))


class Counters:
    """The stub's calls per driver function."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.lib = lib
        lib.stub_name.restype, lib.stub_calls.restype = ctypes.c_char_p, ctypes.c_longlong
        self.names = [lib.stub_name(i).decode() for i in range(lib.stub_functions())]

    def read(self) -> dict[str, int]:
        return {n: self.lib.stub_calls(i) for i, n in enumerate(self.names)}

    def reset(self) -> None:
        self.lib.stub_reset()


# -- torch's CUDA pieces on the CPU ----------------------------------------------------------------------
class _Graph:
    """torch.cuda.CUDAGraph stood in for: capture runs the launcher into the stub (its calls counted as a capture's),
    replay is one cuGraphLaunch through ctypes (torch's replay() is a C++ call around the same)."""

    launch: Any = None  # the stub's cuGraphLaunch, declared

    def capture_begin(self, capture_error_mode: str = "global") -> None:
        pass

    def capture_end(self) -> None:
        pass

    def replay(self) -> None:
        _Graph.launch(id(self), None)

    def raw_cuda_graph_exec(self) -> int:
        return id(self)


class _Stream:
    def __init__(self, index: int = 0) -> None:
        self.cuda_stream = STREAM


@contextlib.contextmanager
def stubbed(lib: ctypes.CDLL) -> Any:
    """The direct launch's CUDA dependencies pointed at the stub and CPU stand-ins, restored after."""
    graph_launch = lib.cuGraphLaunch
    graph_launch.argtypes, graph_launch.restype = [ctypes.c_void_p, ctypes.c_void_p], ctypes.c_int
    _Graph.launch = graph_launch
    saved_lib = cuda_launch._LIB
    patches = [
        (entry, "_raw_stream", lambda index: STREAM),
        (entry, "_RAW_EXEC", True),
        (entry, "_kept_workspace", lambda index, nbytes, device: torch.empty(nbytes, dtype=torch.uint8)),
        (torch.cuda, "is_current_stream_capturing", lambda: False),
        (torch.cuda, "CUDAGraph", _Graph),
        (torch.cuda, "Stream", _Stream),
        (torch.cuda, "stream", lambda s: contextlib.nullcontext()),
    ]
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    try:
        cuda_launch._LIB = cuda_launch.declare(lib)
        for owner, name, value in patches:
            setattr(owner, name, value)
        yield
    finally:
        cuda_launch._LIB = saved_lib
        for owner, name, value in saved:
            setattr(owner, name, value)
        entry.forget_kernels()


# -- the layers --------------------------------------------------------------------------------------------
class Layer(NamedTuple):
    name: str
    launch: cuda_launch.Launch
    x_shape: tuple[int, ...]
    dy_shape: tuple[int, ...]
    w_shape: tuple[int, ...]
    conf: tuple  # convolution_backward's stride, padding, dilation, transposed, output_padding, groups


def layers(folder: Path, limit: int | None = None) -> list[Layer]:
    """Every kernel of an artifacts folder (``<problem>/op.json``, its ``launch.json``) with a launch schedule,
    as the switch's call sees it: channels-last x, dy and weight shapes, 2-d problems (torch's 4-d tensors)."""
    out = []
    for op_file in sorted(Path(folder).glob("*/op.json")):
        op = json.loads(op_file.read_text())
        files = op_file.parent / op.get("files", "")
        if not op.get("launch") or not (files / cuda_launch.LAUNCH_FILE).is_file():
            continue
        launch = cuda_launch.Launch.from_files(lambda n, files=files: (files / n).read_bytes())
        p = op["problem"]
        if launch.refused or len(p["input_size"]) != 2:
            continue
        g, n = p["groups"], p["batch"]
        c, k = g * p["in_channels"], g * p["out_channels"]
        out_size = tuple((i + lo + hi - d * (f - 1) - 1) // s + 1 for i, f, s, d, lo, hi in
                         zip(p["input_size"], p["filter_size"], p["stride"], p["dilation"], p["pad_low"],
                             p["pad_high"]))  # fmt: skip
        conf = (list(p["stride"]), list(p["pad_low"]), list(p["dilation"]), False, [0, 0], g)
        out.append(Layer(op_file.parent.name, launch, (n, c, *p["input_size"]), (n, k, *out_size),
                         (k, p["in_channels"], *p["filter_size"]), conf))  # fmt: skip
    return out[:limit]


def _channels_last(pool: torch.Tensor, offset: int, shape: tuple[int, ...]) -> torch.Tensor:
    """A channels-last bf16 tensor of ``shape`` at byte ``offset`` of ``pool`` (a view: no copy, no touch)."""
    n, c, h, w = shape
    return pool[offset : offset + 2 * n * c * h * w].view(torch.bfloat16).view(n, h, w, c).permute(0, 3, 1, 2)


class Workload:
    """The layers' tensors: per layer a pool of x and of dy, read at one offset (repeat) or a new one a call
    (moving: 16-byte steps through ``period`` offsets, so an address pair comes back only after ``period`` calls)."""

    def __init__(self, layers_: list[Layer], period: int = 4096) -> None:
        self.layers, self.period = layers_, period
        self.pools = []
        for layer in layers_:
            nbytes = [2 * int(torch.tensor(s).prod()) for s in (layer.x_shape, layer.dy_shape)]
            # never touched: the kernels are stubbed, so the pages stay unmapped (virtual memory only)
            self.pools.append([torch.empty(b + 16 * period, dtype=torch.uint8) for b in nbytes])
        self.weights = [torch.empty(layer.w_shape, dtype=torch.bfloat16).to(memory_format=torch.channels_last)
                        for layer in layers_]  # fmt: skip
        self.calls = 0

    def tensors(self, i: int, moving: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        offset = 16 * (self.calls % self.period) if moving else 0
        self.calls += 1
        layer = self.layers[i]
        x = _channels_last(self.pools[i][0], offset, layer.x_shape)
        dy = _channels_last(self.pools[i][1], offset, layer.dy_shape)
        return dy, x, self.weights[i]


# -- the measurement -----------------------------------------------------------------------------------------
aten = torch.ops.aten.convolution_backward.default
_DW_ONLY = [False, True, False]  # dx is torch's kernel, timed by torch's own side on the GPU: dW alone here


@contextlib.contextmanager
def switch_on(path: str, work: Workload) -> Any:
    """The switch on for ``path``, its decisions our direct launch on fresh ``DirectCall`` s of the layers (no graphs
    or maps from an earlier path), yielding them."""
    calls = {}
    for layer in work.layers:
        calls[layer.name] = entry.DirectCall(layer.launch, 0, "cuda")
    by_shape = {(layer.x_shape, layer.w_shape, tuple(layer.conf[0])): layer for layer in work.layers}
    real_decide = sw._decide

    def decide(go: torch.Tensor, x: torch.Tensor, w: torch.Tensor, conf: tuple, config: Any) -> sw.Decision:
        layer = by_shape[(tuple(x.shape), tuple(w.shape), tuple(conf[0]))]
        layout = (layer.w_shape, tuple(sw._out_strides(list(layer.w_shape), "channels_last")))
        return sw.Decision(True, direct=(calls[layer.name], layout))

    before = os.environ.get(entry.NATIVE_LAUNCH_ENV)
    os.environ[entry.NATIVE_LAUNCH_ENV] = "1" if path == "cxx_launch" else "0"
    sw._decide = decide
    try:
        sw.enable(benchmark=False, native=path != "python")
        if path != "python" and not sw._STATE["active"].native:
            raise RuntimeError(f"{path}: the C++ hot path did not build here")
        yield calls
    finally:
        sw.disable()
        sw._decide = real_decide
        if before is None:
            os.environ.pop(entry.NATIVE_LAUNCH_ENV, None)
        else:
            os.environ[entry.NATIVE_LAUNCH_ENV] = before


def measure(path: str, memory: str, work: Workload, counters: Counters, passes: int, profile: bool = True) -> dict:
    """µs a call of ``path`` on ``memory`` (median over ``passes`` passes over the layers, after 3 warm-up passes:
    the decisions, the workspace, graphs where the memory repeats), driver calls a call, cProfile's top functions."""
    moving = memory == "moving"
    n = len(work.layers)

    def one_pass(mask: list[bool] = _DW_ONLY, prof: cProfile.Profile | None = None) -> float:
        args = [(*work.tensors(i, moving), None, *work.layers[i].conf, mask) for i in range(n)]  # views: not timed
        if prof is not None:
            prof.enable()
        start = time.perf_counter()
        for a in args:
            aten(*a)
        elapsed = time.perf_counter() - start
        if prof is not None:
            prof.disable()
        return elapsed / n * 1e6

    cxx_slots, cxx_waits = native.map_slots()
    with switch_on(path, work) as calls:
        for _ in range(3):
            one_pass()
        counters.reset()
        sw.reset_stats()
        native.reset_counts()
        graphs = sum(len(c._graphs) for c in calls.values())
        times = [one_pass() for _ in range(passes)]
        captures = sum(len(c._graphs) for c in calls.values()) - graphs  # each a capture + instantiation on a GPU
        total = passes * n
        driver = {k: round(v / total, 3) for k, v in counters.read().items() if v}
        stats = sw.stats()
        out = {
            "path": path, "memory": memory, "layers": n, "calls": total,
            "us_per_call_median": statistics.median(times), "us_per_call_quartiles": statistics.quantiles(times, n=4),
            "driver_calls_per_call": driver, "ours": stats.get("ours", 0) / total,
            "cxx_graph_launches_per_call": native.graph_launches() / total,
            "cxx_plain_launches_per_call": native.plain_launches() / total,
            "graph_captures_per_call": captures / total,
            # the floor: the same calls asking no gradient (the dispatcher, the override's entry, torch's empty call)
            "floor_us_per_call": statistics.median(one_pass([False, False, False]) for _ in range(passes)),
            "cxx_kernel_registered": native.loaded() is not None,  # then the Python path is reached through it
            "graphs_held": sum(len(c._graphs) for c in calls.values()),
            # the tensor-map slots held after the run (device + pinned, 256 bytes each; bounded since issue 37's
            # slots fix: a cap a kernel, cuda_launch.MapSlots): the Python launchers' and the C++ plans' (those
            # allocated during this measurement), and reuses that had to wait for the GPU
            "maps_held": sum(len(c.launcher.slots.device) for c in calls.values()),
            "maps_held_cxx": native.map_slots()[0] - cxx_slots,
            "map_waits": sum(c.launcher.slots.waits for c in calls.values()) + native.map_slots()[1] - cxx_waits,
        }  # fmt: skip
        if profile:  # each pass profiled alone, a function's median over the passes: a preempted pass does not count
            profiles = []
            for _ in range(max(passes // 2, 3)):
                prof = cProfile.Profile()
                one_pass(prof=prof)
                profiles.append(_profile_rows(prof, n))
            out["profile_us_per_call"] = _median_rows(profiles)
    return out


def _profile_rows(prof: cProfile.Profile, calls: int) -> dict[str, tuple[float, float, float]]:
    """cProfile's functions: function -> (own µs a call, with callees µs a call, calls a call)."""
    stats = pstats.Stats(prof, stream=io.StringIO())
    rows = {}
    for (file, line, name), (_, ncalls, tottime, cumtime, _) in stats.stats.items():
        where = f"{Path(file).name}:{line}({name})" if file != "~" else name
        rows[where] = (1e6 * tottime / calls, 1e6 * cumtime / calls, ncalls / calls)
    return rows


def _median_rows(profiles: list[dict], top: int = 18) -> list[tuple[str, float, float, float]]:
    """Per function the median over the profiled passes of each figure (0 where a pass lacks it), by own time."""
    names = {k for p in profiles for k in p}
    rows = []
    for k in names:
        values = [p.get(k, (0.0, 0.0, 0.0)) for p in profiles]
        rows.append((k, *(round(statistics.median(v[i] for v in values), 2) for i in range(3))))
    rows.sort(key=lambda r: -r[1])
    return rows[:top]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--artifacts", type=Path, default=Path(os.environ.get("CONVBW_ARTIFACTS", DEFAULT_ARTIFACTS)))
    p.add_argument("--targets", default="sm_90a,sm_80", help="subfolders of --artifacts (ResNet-50's, EfficientNet's)")
    p.add_argument("--passes", type=int, default=30)
    p.add_argument("--paths", default=",".join(PATHS))
    p.add_argument("--memories", default=",".join(MEMORIES))
    p.add_argument("--out", type=Path)
    p.add_argument("--no-profile", action="store_true")
    ns = p.parse_args()
    torch.set_num_threads(1)
    check_signatures()
    lib = build_stub()
    counters = Counters(lib)
    results = []
    with stubbed(lib):
        works = {}
        for target in ns.targets.split(","):
            found = layers(ns.artifacts / target)
            if not found:
                print(f"{ns.artifacts / target}: no kernels with a launch schedule")
                continue
            works[target] = Workload(found)
        # the Python path first: once registered, the C++ kernel stays for the process (native=False then goes
        # through it to the Python switch: one more hop)
        for path in ns.paths.split(","):
            for target, work in works.items():
                for memory in ns.memories.split(","):
                    r = measure(path, memory, work, counters, ns.passes, not ns.no_profile) | {"target": target}
                    results.append(r)
                    driver = ", ".join(f"{k} {v:g}" for k, v in r["driver_calls_per_call"].items())
                    print(f"{target:7s} {path:10s} {memory:6s} {r['us_per_call_median']:7.1f} us/call (floor "
                          f"{r['floor_us_per_call']:.1f}; {r['layers']} layers; ours {r['ours']:.2f}, C++ graphs "
                          f"{r['cxx_graph_launches_per_call']:.2f}, C++ plain {r['cxx_plain_launches_per_call']:.2f}; "
                          f"map slots {r['maps_held']} + C++ {r['maps_held_cxx']}) driver/call: {driver}")  # fmt: skip
                    for where, own, cum, k in r.get("profile_us_per_call", [])[:10]:
                        print(f"      {own:7.2f} own {cum:7.2f} cum {k:5.2f}x  {where}")
    if ns.out:
        ns.out.parent.mkdir(parents=True, exist_ok=True)
        ns.out.write_text(json.dumps({"torch": torch.__version__, "results": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
