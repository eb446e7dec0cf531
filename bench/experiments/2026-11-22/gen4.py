"""Experiment 4: depthwise stage 1 reading x with bounds-checked tensor.extract (no pad)."""

import json
import sys
from pathlib import Path

import iree.compiler as ic

sys.path.insert(0, ".exp")
OUT = Path(sys.argv[1])
OUT.mkdir(parents=True, exist_ok=True)
FLAGS = ["--iree-hal-target-device=cuda", "--iree-cuda-target=sm_80"]
man = []


def emit(name, text, meta):
    try:
        (OUT / f"{name}.vmfb").write_bytes(ic.compile_str(text, extra_args=FLAGS))
        man.append({"name": name, **meta})
        print("ok", name)
        (OUT / f"{name}.mlir").write_text(text)
    except Exception as e:
        print("FAIL", name, str(e)[:3000])


def ci(wg, thread, red, wgsize):
    return (
        "attrs = {compilation_info = #iree_codegen.compilation_info<lowering_config = #iree_gpu.lowering_config<{"
        f"workgroup = {wg}, thread = {thread}, reduction = {red}"
        "}>, translation_info = #iree_codegen.translation_info<pipeline = #iree_gpu.pipeline<TileAndFuse> "
        f"workgroup_size = [{wgsize}, 1, 1] subgroup_size = 32>>}}"
    )


def dw(name, N, H, G, R, cfg1=""):
    P = R // 2
    OH = H
    T = f"tensor<{N}x{H}x{H}x{G}xf16>"
    PT = f"tensor<{N}x{OH}x{R}x{R}x{G}xf32>"
    text = f"""
func.func @conv_bwd_weight(%x: {T}, %dy: {T}) -> tensor<{G}x{R}x{R}xf16> {{
    %z = arith.constant 0.0 : f32
    %zh = arith.constant 0.0 : f16
    %c0 = arith.constant 0 : index
    %cP = arith.constant {P} : index
    %cH = arith.constant {H} : index
    %p0 = tensor.empty() : {PT}
    %p1 = linalg.fill ins(%z : f32) outs(%p0 : {PT}) -> {PT}
    %part = linalg.generic {{indexing_maps = [
        affine_map<(n, oh, y, x, g, ow) -> (n, oh, ow, g)>,
        affine_map<(n, oh, y, x, g, ow) -> (n, oh, y, x, g)>],
        iterator_types = ["parallel", "parallel", "parallel", "parallel", "parallel", "reduction"]}}
        ins(%dy : {T}) outs(%p1 : {PT}) {cfg1} {{
      ^bb0(%b: f16, %acc: f32):
        %n = linalg.index 0 : index
        %oh = linalg.index 1 : index
        %y = linalg.index 2 : index
        %xx = linalg.index 3 : index
        %g = linalg.index 4 : index
        %ow = linalg.index 5 : index
        %h0 = arith.addi %oh, %y : index
        %h = arith.subi %h0, %cP : index
        %w0 = arith.addi %ow, %xx : index
        %w = arith.subi %w0, %cP : index
        %hu = arith.index_castui %h : index to i64
        %wu = arith.index_castui %w : index to i64
        %cHi = arith.index_castui %cH : index to i64
        %hin = arith.cmpi ult, %hu, %cHi : i64
        %win = arith.cmpi ult, %wu, %cHi : i64
        %in = arith.andi %hin, %win : i1
        %hs = arith.select %in, %h, %c0 : index
        %ws = arith.select %in, %w, %c0 : index
        %v = tensor.extract %x[%n, %hs, %ws, %g] : {T}
        %a = arith.select %in, %v, %zh : f16
        %ae = arith.extf %a : f16 to f32
        %be = arith.extf %b : f16 to f32
        %m = arith.mulf %ae, %be : f32
        %s = arith.addf %acc, %m : f32
        linalg.yield %s : f32
    }} -> {PT}
    %q0 = tensor.empty() : tensor<{G}x{R}x{R}xf32>
    %q1 = linalg.fill ins(%z : f32) outs(%q0 : tensor<{G}x{R}x{R}xf32>) -> tensor<{G}x{R}x{R}xf32>
    %sum = linalg.generic {{indexing_maps = [
        affine_map<(g, y, x, n, oh) -> (n, oh, y, x, g)>,
        affine_map<(g, y, x, n, oh) -> (g, y, x)>],
        iterator_types = ["parallel", "parallel", "parallel", "reduction", "reduction"]}}
        ins(%part : {PT}) outs(%q1 : tensor<{G}x{R}x{R}xf32>) {{
      ^bb0(%a: f32, %acc: f32):
        %s = arith.addf %acc, %a : f32
        linalg.yield %s : f32
    }} -> tensor<{G}x{R}x{R}xf32>
    %o0 = tensor.empty() : tensor<{G}x{R}x{R}xf16>
    %out = linalg.generic {{indexing_maps = [affine_map<(a, b, c) -> (a, b, c)>, affine_map<(a, b, c) -> (a, b, c)>],
        iterator_types = ["parallel", "parallel", "parallel"]}} ins(%sum : tensor<{G}x{R}x{R}xf32>) outs(%o0 : tensor<{G}x{R}x{R}xf16>) {{
      ^bb0(%a: f32, %o: f16):
        %t = arith.truncf %a : f32 to f16
        linalg.yield %t : f16
    }} -> tensor<{G}x{R}x{R}xf16>
    return %out : tensor<{G}x{R}x{R}xf16>
}}
"""
    emit(name, text, {"kind": "depthwise", "N": N, "H": H, "W": H, "G": G, "R": R})


N, H, G = 32, 56, 144
dw("dwg_default", N, H, G, 3)
dw("dwg_t5", N, H, G, 3, ci("[1, 8, 3, 3, 16, 0]", "[1, 1, 3, 3, 1, 0]", "[0, 0, 0, 0, 0, 1]", 128))
dw("dwg_t1", N, H, G, 3, ci("[1, 2, 3, 3, 48, 0]", "[1, 1, 3, 3, 1, 0]", "[0, 0, 0, 0, 0, 1]", 96))
dw("dwg_t6", N, H, G, 3, ci("[1, 4, 3, 3, 16, 0]", "[1, 1, 1, 1, 1, 0]", "[0, 0, 0, 0, 0, 1]", 576))
dw("dwg_t7", N, H, G, 3, ci("[1, 1, 3, 3, 48, 0]", "[1, 1, 3, 1, 1, 0]", "[0, 0, 0, 0, 0, 1]", 144))
(OUT / "manifest_dw.json").write_text(json.dumps(man))
