"""Ahead-of-time cubins (convbw_mlir/build/cubin.py, opt-in ``CONVBW_PTXAS``): ptxas gets each kernel's PTX and the
target's arch, its output replaces the PTX in the vmfb's executable and in the direct launch, the artifact says
which it holds, a launch file of cubins loads through the driver path, cubins are cached apart from PTX, and a
missing ptxas is one error naming the variable. A stand-in ptxas (a script) stands for NVIDIA's where none is."""

from __future__ import annotations

import shutil
import stat
import subprocess
import sys

import pytest

from convbw_mlir.build import cubin
from convbw_mlir.build.iree import CompileError
from convbw_mlir.cuda_launch import Launch, image_kind
from convbw_mlir.problem import ConvBwdWeightProblem

pytest.importorskip("iree.compiler")

TINY = ConvBwdWeightProblem.from_ck("2 1 2 64 64 3 3 6 6 1 1 1 1 1 1 1 1")  # one explicit sm_90a kernel
# An ELF header of a cubin (e_machine 190, EM_CUDA), then what the stand-in was asked: arch and the PTX itself
FAKE_PTXAS = """#!{python}
import os
import sys
if sys.argv[1] == "--version":
    print("Cuda compilation tools, release 0.0, stand-in")
    sys.exit(0)
arch, src, out = sys.argv[1].split("=")[1], sys.argv[2], sys.argv[4]
ptx = open(src, "rb").read()
if b"REFUSE" in ptx or os.environ.get("STANDIN_REFUSES"):
    sys.stderr.write("ptxas fatal   : stand-in refuses this PTX\\n")
    sys.exit(255)
header = b"\\x7fELF" + bytes(14) + (190).to_bytes(2, "little") + bytes(44)
open(out, "wb").write(header + b"arch=" + arch.encode() + b"\\n" + ptx)
"""


def _fake_cubin(ptx: bytes, arch: str) -> bytes:
    return b"\x7fELF" + bytes(14) + (190).to_bytes(2, "little") + bytes(44) + f"arch={arch}\n".encode() + ptx


@pytest.fixture(scope="module")
def fake_ptxas(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("ptxas") / "ptxas"
    path.write_text(FAKE_PTXAS.format(python=sys.executable))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def _build(env: dict[str, str]):
    from convbw_mlir.build.compile import build_op
    from convbw_mlir.targets import get_target

    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            mp.setenv(key, value)
        if not env:
            mp.delenv(cubin.PTXAS_ENV, raising=False)
        return build_op(TINY, get_target("sm_90a"), output_arg=True)


@pytest.fixture(scope="module")
def ptx_op():
    return _build({})


@pytest.fixture(scope="module")
def cubin_op(fake_ptxas):
    return _build({cubin.PTXAS_ENV: fake_ptxas})


def test_kernels_are_ptx_unless_cubins_are_asked_for(ptx_op) -> None:
    assert ptx_op.launch.refused is None and ptx_op.launch.image_kinds == ["ptx"]
    assert cubin.kernel_image(ptx_op.vmfb) == "ptx"


def test_ptxas_gets_each_kernels_ptx_and_the_targets_arch_and_its_cubin_replaces_them(ptx_op, cubin_op) -> None:
    assert cubin_op.launch.refused is None and cubin_op.launch.image_kinds == ["cubin"]
    # what the stand-in wrote from what it was given: the same PTX as the default build's, for sm_90a
    assert cubin_op.launch.ptx == [_fake_cubin(ptx_op.launch.ptx[0].rstrip(b"\0"), "sm_90a")]
    assert cubin.kernel_image(cubin_op.vmfb) == "cubin"  # the vmfb's executable holds it too (IREE's runtime loads it)
    assert [e.name for e in cubin_op.launch.exports.values()] == [e.name for e in ptx_op.launch.exports.values()]


def test_the_executables_cubin_is_what_its_reader_finds(fake_ptxas, ptx_op) -> None:
    from convbw_mlir.build.cuda_schedule import read_cuda_executable
    from convbw_mlir.build.iree import compile_module

    hal = compile_module(ptx_op.stages["linalg"], "sm_90a", ["--compile-to=hal"])
    new = cubin.assemble_hal(hal, _target(), fake_ptxas)
    vmfb = compile_module(new, "sm_90a", ["--compile-from=hal"])
    assert cubin.kernel_image(vmfb) == "cubin"
    # the flatbuffer rewrite on its own: exports kept, each module's image the cubin
    from convbw_mlir.ir_imports import ir, new_context

    with new_context() as ctx:
        for op in ir.Module.parse(new, ctx).body.operations:
            if op.operation.name == "hal.executable":
                (binary,) = [o for o in op.regions[0].blocks[0].operations if o.operation.name != "hal.executable_end"]
                data = bytes(memoryview(ir.DenseIntElementsAttr(binary.attributes["data"])).cast("B"))
                exports, images = read_cuda_executable(data)
                assert [image_kind(i) for i in images] == ["cubin"] and exports


def _target():
    from convbw_mlir.targets import get_target

    return get_target("sm_90a")


def test_a_saved_launch_names_its_cubins_and_loads_them_through_the_driver(cubin_op, monkeypatch) -> None:
    from convbw_mlir import cuda_launch

    files = cubin_op.launch.files()
    assert "launch-0.cubin" in files and not any(n.endswith(".ptx") for n in files)
    assert b'"images": [\n  "cubin"\n ]' in files["launch.json"]
    launch = Launch.from_files(files.__getitem__)
    assert launch.ptx == cubin_op.launch.ptx

    from test_sm90_product import _FakeContext

    loaded = []

    class Driver(_FakeContext):  # enough of libcuda for a launcher on a cc-9.0 device, the images it loads kept
        def cuModuleLoadData(self, ref, image):  # noqa: N802
            loaded.append(bytes(image))
            return super().cuModuleLoadData(ref, image)

    monkeypatch.setattr(cuda_launch, "_libcuda", lambda: Driver())
    cuda_launch.CudaLauncher(launch, 0)
    assert loaded == [cubin_op.launch.ptx[0] + b"\0"]  # the cubin itself, not refused as PTX of another target


def test_image_kind_tells_cubins_from_ptx_and_other_code_objects() -> None:
    assert image_kind(b"//\n.version 8.0\n.target sm_90a\n") == "ptx"
    assert image_kind(_fake_cubin(b"", "sm_90a")) == "cubin"
    assert image_kind(b"\x7fELF" + bytes(14) + (224).to_bytes(2, "little") + bytes(44)) == "elf"  # an AMD code object


def test_cubins_are_cached_apart_from_ptx(fake_ptxas, monkeypatch) -> None:
    from convbw_mlir.dispatch.variants import Variant, variant_request

    v = Variant("iree_direct")
    monkeypatch.delenv(cubin.PTXAS_ENV, raising=False)
    plain = variant_request(TINY, "sm_90a", v, "3.13")
    monkeypatch.setenv(cubin.PTXAS_ENV, fake_ptxas)
    asked = variant_request(TINY, "sm_90a", v, "3.13")
    assert "kernel_image" not in plain
    assert asked["kernel_image"] == "cubin: Cuda compilation tools, release 0.0, stand-in"
    assert "kernel_image" not in variant_request(TINY, "host", v, "3.13")  # CPU kernels are not PTX


def test_a_missing_ptxas_is_one_error_naming_the_variable_and_its_value(monkeypatch, tmp_path) -> None:
    with pytest.raises(ValueError, match=r"CONVBW_PTXAS='/nowhere/ptxas': not an executable file"):
        cubin.ptxas("/nowhere/ptxas")
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setattr(cubin, "_wheel_ptxas", lambda: None)
    with pytest.raises(ValueError, match=r"CONVBW_PTXAS='1': no ptxas on PATH nor in the nvidia-cuda-nvcc wheel"):
        cubin.ptxas("1")
    monkeypatch.setenv(cubin.PTXAS_ENV, "1")
    with pytest.raises(ValueError, match="CONVBW_PTXAS='1'"):  # the build says so before IREE runs
        _build({cubin.PTXAS_ENV: "1"})


def test_ptxas_refusing_a_kernel_is_a_compile_error_with_its_message(fake_ptxas, ptx_op, monkeypatch) -> None:
    from convbw_mlir.build.iree import compile_module

    with pytest.raises(cubin.PtxasError, match="ptxas -arch=sm_90a failed .*stand-in refuses this PTX"):
        cubin.assemble(b"REFUSE", "sm_90a", fake_ptxas)
    monkeypatch.setenv(cubin.PTXAS_ENV, fake_ptxas)
    monkeypatch.setenv("STANDIN_REFUSES", "1")
    with pytest.raises(CompileError, match="stand-in refuses this PTX"):  # what the build's callers catch
        compile_module(ptx_op.stages["linalg"], "sm_90a")


def test_a_compile_outside_the_launch_split_holds_cubins_too(fake_ptxas, ptx_op, monkeypatch) -> None:
    """compile_module on its own (the GPU reference's, IREE's intermediates' path): split at hal, assembled."""
    from convbw_mlir.build.iree import compile_module, executable_intermediates

    monkeypatch.setenv(cubin.PTXAS_ENV, fake_ptxas)
    assert cubin.kernel_image(compile_module(ptx_op.stages["linalg"], "sm_90a")) == "cubin"
    inter = executable_intermediates(ptx_op.stages["linalg"], "sm_90a")
    assert cubin.kernel_image(inter.vmfb) == "cubin" and inter.isa  # the dumps come from the first half


def test_convbw_tune_cubin_without_ptxas_is_one_line_and_builds_nothing(tmp_path) -> None:
    out = tmp_path / "out"
    env = {"PATH": str(tmp_path), cubin.PTXAS_ENV: "/nowhere/ptxas"}
    cmd = [sys.executable, "-m", "convbw_mlir", "tune", "--problems", "x", "--target", "sm_90a", "--compile-only",
           "--out", str(out), "--cubin"]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert r.returncode == 1 and "CONVBW_PTXAS='/nowhere/ptxas'" in r.stderr and not out.exists()
    r = subprocess.run([*cmd[:7], "host", *cmd[8:]], capture_output=True, text=True, env=env)
    assert r.returncode == 1 and "--cubin: cubins are CUDA kernels" in r.stderr


@pytest.mark.skipif(not (shutil.which("ptxas") or cubin._wheel_ptxas()), reason="no ptxas here (pip install .[cubin])")
def test_nvidias_ptxas_assembles_an_sm90a_kernel_into_a_cubin(ptx_op) -> None:
    image = cubin.assemble(ptx_op.launch.ptx[0], "sm_90a", cubin.ptxas("1"))
    assert image_kind(image) == "cubin"
    assert "release" in cubin.version(cubin.ptxas("1"))


def test_the_load_bench_finds_each_vmfbs_kernel_images_ptx_or_cubin(ptx_op, cubin_op, tmp_path) -> None:
    """bench/kernel_load.py (the GPU pack's first step) reads the executables out of the vmfbs themselves."""
    from conftest import bench_script

    kernel_load = bench_script("kernel_load")
    for name, op in (("ptx", ptx_op), ("cubin", cubin_op)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "k.vmfb").write_bytes(op.vmfb)
    ptx, cub = (kernel_load.images(tmp_path / n) for n in ("ptx", "cubin"))
    assert [r["kind"] for r in ptx] == ["ptx"] and [r["kind"] for r in cub] == ["cubin"]
    assert ptx[0]["kernels"] == cub[0]["kernels"] and cub[0]["image"] == cubin_op.launch.ptx[0]
