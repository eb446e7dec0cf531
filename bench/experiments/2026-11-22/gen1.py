"""Experiment 1 (not product code): depthwise formulations and the 1x1 f16 bug, for sm_80."""

import json
import sys
from pathlib import Path

import iree.compiler as ic

OUT = Path(sys.argv[1])
OUT.mkdir(parents=True, exist_ok=True)
import os

FLAGS = ["--iree-hal-target-device=cuda", "--iree-cuda-target=sm_80"] + os.environ.get("XFLAGS", "").split()
SUFFIX = os.environ.get("SUFFIX", "")
manifest = []


def emit(name, text, meta):
    name += SUFFIX
    try:
        vmfb = ic.compile_str(text, extra_args=FLAGS)
    except Exception as e:  # noqa: BLE001
        print("FAIL", name, str(e)[:1500])
        return
    (OUT / f"{name}.vmfb").write_bytes(vmfb)
    (OUT / f"{name}.mlir").write_text(text)
    manifest.append({"name": name, **meta})
    print("ok", name, len(vmfb))


def ci(wg, thread, red, wgsize, extra=""):
    return (
        "attrs = {compilation_info = #iree_codegen.compilation_info<lowering_config = #iree_gpu.lowering_config<{"
        f"workgroup = {wg}, thread = {thread}, reduction = {red}{extra}"
        "}>, translation_info = #iree_codegen.translation_info<pipeline = #iree_gpu.pipeline<TileAndFuse> "
        f"workgroup_size = [{wgsize}, 1, 1] subgroup_size = 32>>}}"
    )


# ---------------- depthwise 3x3 pad 1 stride 1, NHWC (G innermost), f16 -> f16 dw[G,3,3]
def depthwise(name, N, H, W, G, R, cfg1="", cfg2="", rows_parallel=True, B=1, s1only=False):
    OH, OW = H, W
    P = R // 2
    HP, WP = H + 2 * P, W + 2 * P
    if B > 1:
        OB = OH // B
        s1 = f"""
    %dye = tensor.expand_shape %dy [[0], [1, 2], [3], [4]] output_shape [{N}, {OB}, {B}, {OW}, {G}] : tensor<{N}x{OH}x{OW}x{G}xf16> into tensor<{N}x{OB}x{B}x{OW}x{G}xf16>
    %p0 = tensor.empty() : tensor<{N}x{OB}x{R}x{R}x{G}xf32>
    %p1 = linalg.fill ins(%z : f32) outs(%p0 : tensor<{N}x{OB}x{R}x{R}x{G}xf32>) -> tensor<{N}x{OB}x{R}x{R}x{G}xf32>
    %part = linalg.generic {{indexing_maps = [
        affine_map<(n, ob, y, x, g, oi, ow) -> (n, ob * {B} + oi + y, ow + x, g)>,
        affine_map<(n, ob, y, x, g, oi, ow) -> (n, ob, oi, ow, g)>,
        affine_map<(n, ob, y, x, g, oi, ow) -> (n, ob, y, x, g)>],
        iterator_types = ["parallel", "parallel", "parallel", "parallel", "parallel", "reduction", "reduction"]}}
        ins(%xp, %dye : tensor<{N}x{HP}x{WP}x{G}xf16>, tensor<{N}x{OB}x{B}x{OW}x{G}xf16>) outs(%p1 : tensor<{N}x{OB}x{R}x{R}x{G}xf32>) {cfg1} {{
      ^bb0(%a: f16, %b: f16, %acc: f32):
        %ae = arith.extf %a : f16 to f32
        %be = arith.extf %b : f16 to f32
        %m = arith.mulf %ae, %be : f32
        %s = arith.addf %acc, %m : f32
        linalg.yield %s : f32
    }} -> tensor<{N}x{OB}x{R}x{R}x{G}xf32>
    %q0 = tensor.empty() : tensor<{G}x{R}x{R}xf32>
    %q1 = linalg.fill ins(%z : f32) outs(%q0 : tensor<{G}x{R}x{R}xf32>) -> tensor<{G}x{R}x{R}xf32>
    %sum = linalg.generic {{indexing_maps = [
        affine_map<(g, y, x, n, oh) -> (n, oh, y, x, g)>,
        affine_map<(g, y, x, n, oh) -> (g, y, x)>],
        iterator_types = ["parallel", "parallel", "parallel", "reduction", "reduction"]}}
        ins(%part : tensor<{N}x{OB}x{R}x{R}x{G}xf32>) outs(%q1 : tensor<{G}x{R}x{R}xf32>) {cfg2} {{
      ^bb0(%a: f32, %acc: f32):
        %s = arith.addf %acc, %a : f32
        linalg.yield %s : f32
    }} -> tensor<{G}x{R}x{R}xf32>
"""
    elif rows_parallel:
        # stage 1: partial[n, oh, y, x, g] = sum_ow
        s1 = f"""
    %p0 = tensor.empty() : tensor<{N}x{OH}x{R}x{R}x{G}xf32>
    %p1 = linalg.fill ins(%z : f32) outs(%p0 : tensor<{N}x{OH}x{R}x{R}x{G}xf32>) -> tensor<{N}x{OH}x{R}x{R}x{G}xf32>
    %part = linalg.generic {{indexing_maps = [
        affine_map<(n, oh, y, x, g, ow) -> (n, oh + y, ow + x, g)>,
        affine_map<(n, oh, y, x, g, ow) -> (n, oh, ow, g)>,
        affine_map<(n, oh, y, x, g, ow) -> (n, oh, y, x, g)>],
        iterator_types = ["parallel", "parallel", "parallel", "parallel", "parallel", "reduction"]}}
        ins(%xp, %dy : tensor<{N}x{HP}x{WP}x{G}xf16>, tensor<{N}x{OH}x{OW}x{G}xf16>) outs(%p1 : tensor<{N}x{OH}x{R}x{R}x{G}xf32>) {cfg1} {{
      ^bb0(%a: f16, %b: f16, %acc: f32):
        %ae = arith.extf %a : f16 to f32
        %be = arith.extf %b : f16 to f32
        %m = arith.mulf %ae, %be : f32
        %s = arith.addf %acc, %m : f32
        linalg.yield %s : f32
    }} -> tensor<{N}x{OH}x{R}x{R}x{G}xf32>
    %q0 = tensor.empty() : tensor<{G}x{R}x{R}xf32>
    %q1 = linalg.fill ins(%z : f32) outs(%q0 : tensor<{G}x{R}x{R}xf32>) -> tensor<{G}x{R}x{R}xf32>
    %sum = linalg.generic {{indexing_maps = [
        affine_map<(g, y, x, n, oh) -> (n, oh, y, x, g)>,
        affine_map<(g, y, x, n, oh) -> (g, y, x)>],
        iterator_types = ["parallel", "parallel", "parallel", "reduction", "reduction"]}}
        ins(%part : tensor<{N}x{OH}x{R}x{R}x{G}xf32>) outs(%q1 : tensor<{G}x{R}x{R}xf32>) {cfg2} {{
      ^bb0(%a: f32, %acc: f32):
        %s = arith.addf %acc, %a : f32
        linalg.yield %s : f32
    }} -> tensor<{G}x{R}x{R}xf32>
"""
    else:
        s1 = ""
    text = f"""
func.func @conv_bwd_weight(%x: tensor<{N}x{H}x{W}x{G}xf16>, %dy: tensor<{N}x{OH}x{OW}x{G}xf16>) -> tensor<{G}x{R}x{R}xf16> {{
    %z = arith.constant 0.0 : f32
    %zh = arith.constant 0.0 : f16
    %xp = tensor.pad %x low[0, {P}, {P}, 0] high[0, {P}, {P}, 0] {{
      ^bb0(%i0: index, %i1: index, %i2: index, %i3: index):
        tensor.yield %zh : f16
    }} : tensor<{N}x{H}x{W}x{G}xf16> to tensor<{N}x{HP}x{WP}x{G}xf16>
    {s1}
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
    if s1only:
        ptype = f"tensor<{N}x{OH}x{R}x{R}x{G}xf32>"
        text = text.replace(f"-> tensor<{G}x{R}x{R}xf16> {{", f"-> {ptype} {{").replace(
            f"return %out : tensor<{G}x{R}x{R}xf16>", f"return %part : {ptype}"
        )
    emit(name, text, {"kind": "depthwise", "N": N, "H": H, "W": W, "G": G, "R": R})


# ---------------- 1x1: dw[k,c] = sum_p dy[p,k] x[p,c], f16 in, f32 acc, f16 out
def gemm(name, P, K, C, form):
    if form == "direct":
        body = f"""
    %a0 = tensor.empty() : tensor<{K}x{C}xf32>
    %a1 = linalg.fill ins(%z : f32) outs(%a0 : tensor<{K}x{C}xf32>) -> tensor<{K}x{C}xf32>
    %acc = linalg.generic {{indexing_maps = [
        affine_map<(k, c, p) -> (p, c)>, affine_map<(k, c, p) -> (p, k)>, affine_map<(k, c, p) -> (k, c)>],
        iterator_types = ["parallel", "parallel", "reduction"]}}
        ins(%x, %dy : tensor<{P}x{C}xf16>, tensor<{P}x{K}xf16>) outs(%a1 : tensor<{K}x{C}xf32>) {{
      ^bb0(%a: f16, %b: f16, %o: f32):
        %ae = arith.extf %a : f16 to f32
        %be = arith.extf %b : f16 to f32
        %m = arith.mulf %ae, %be : f32
        %s = arith.addf %o, %m : f32
        linalg.yield %s : f32
    }} -> tensor<{K}x{C}xf32>
"""
    elif form in ("tdy", "tboth"):
        # explicit transposes: dyT[k,p] (and xT[c,p]) then a row-major matmul
        body = f"""
    %t0 = tensor.empty() : tensor<{K}x{P}xf16>
    %dyt = linalg.transpose ins(%dy : tensor<{P}x{K}xf16>) outs(%t0 : tensor<{K}x{P}xf16>) permutation = [1, 0]
    %a0 = tensor.empty() : tensor<{K}x{C}xf32>
    %a1 = linalg.fill ins(%z : f32) outs(%a0 : tensor<{K}x{C}xf32>) -> tensor<{K}x{C}xf32>
"""
        if form == "tdy":
            body += f"""
    %acc = linalg.generic {{indexing_maps = [
        affine_map<(k, c, p) -> (k, p)>, affine_map<(k, c, p) -> (p, c)>, affine_map<(k, c, p) -> (k, c)>],
        iterator_types = ["parallel", "parallel", "reduction"]}}
        ins(%dyt, %x : tensor<{K}x{P}xf16>, tensor<{P}x{C}xf16>) outs(%a1 : tensor<{K}x{C}xf32>) {{
      ^bb0(%a: f16, %b: f16, %o: f32):
        %ae = arith.extf %a : f16 to f32
        %be = arith.extf %b : f16 to f32
        %m = arith.mulf %ae, %be : f32
        %s = arith.addf %o, %m : f32
        linalg.yield %s : f32
    }} -> tensor<{K}x{C}xf32>
"""
        else:
            body += f"""
    %t1 = tensor.empty() : tensor<{C}x{P}xf16>
    %xt = linalg.transpose ins(%x : tensor<{P}x{C}xf16>) outs(%t1 : tensor<{C}x{P}xf16>) permutation = [1, 0]
    %acc = linalg.generic {{indexing_maps = [
        affine_map<(k, c, p) -> (k, p)>, affine_map<(k, c, p) -> (c, p)>, affine_map<(k, c, p) -> (k, c)>],
        iterator_types = ["parallel", "parallel", "reduction"]}}
        ins(%dyt, %xt : tensor<{K}x{P}xf16>, tensor<{C}x{P}xf16>) outs(%a1 : tensor<{K}x{C}xf32>) {{
      ^bb0(%a: f16, %b: f16, %o: f32):
        %ae = arith.extf %a : f16 to f32
        %be = arith.extf %b : f16 to f32
        %m = arith.mulf %ae, %be : f32
        %s = arith.addf %o, %m : f32
        linalg.yield %s : f32
    }} -> tensor<{K}x{C}xf32>
"""
    elif form == "swap":
        body = f"""
    %a0 = tensor.empty() : tensor<{K}x{C}xf32>
    %a1 = linalg.fill ins(%z : f32) outs(%a0 : tensor<{K}x{C}xf32>) -> tensor<{K}x{C}xf32>
    %acc = linalg.generic {{indexing_maps = [
        affine_map<(k, c, p) -> (p, k)>, affine_map<(k, c, p) -> (p, c)>, affine_map<(k, c, p) -> (k, c)>],
        iterator_types = ["parallel", "parallel", "reduction"]}}
        ins(%dy, %x : tensor<{P}x{K}xf16>, tensor<{P}x{C}xf16>) outs(%a1 : tensor<{K}x{C}xf32>) {{
      ^bb0(%a: f16, %b: f16, %o: f32):
        %ae = arith.extf %a : f16 to f32
        %be = arith.extf %b : f16 to f32
        %m = arith.mulf %ae, %be : f32
        %s = arith.addf %o, %m : f32
        linalg.yield %s : f32
    }} -> tensor<{K}x{C}xf32>
"""
    elif form == "outT":
        body = f"""
    %a0 = tensor.empty() : tensor<{C}x{K}xf32>
    %a1 = linalg.fill ins(%z : f32) outs(%a0 : tensor<{C}x{K}xf32>) -> tensor<{C}x{K}xf32>
    %acct = linalg.generic {{indexing_maps = [
        affine_map<(c, k, p) -> (p, c)>, affine_map<(c, k, p) -> (p, k)>, affine_map<(c, k, p) -> (c, k)>],
        iterator_types = ["parallel", "parallel", "reduction"]}}
        ins(%x, %dy : tensor<{P}x{C}xf16>, tensor<{P}x{K}xf16>) outs(%a1 : tensor<{C}x{K}xf32>) {{
      ^bb0(%a: f16, %b: f16, %o: f32):
        %ae = arith.extf %a : f16 to f32
        %be = arith.extf %b : f16 to f32
        %m = arith.mulf %ae, %be : f32
        %s = arith.addf %o, %m : f32
        linalg.yield %s : f32
    }} -> tensor<{C}x{K}xf32>
    %a2 = tensor.empty() : tensor<{K}x{C}xf32>
    %acc = linalg.transpose ins(%acct : tensor<{C}x{K}xf32>) outs(%a2 : tensor<{K}x{C}xf32>) permutation = [1, 0]
"""
    elif form == "split":
        # batch split S=32 with a second stage (as our split-K does)
        S = 32
        body = f"""
    %dye = tensor.expand_shape %dy [[0, 1], [2]] output_shape [{S}, {P // S}, {K}] : tensor<{P}x{K}xf16> into tensor<{S}x{P // S}x{K}xf16>
    %xe = tensor.expand_shape %x [[0, 1], [2]] output_shape [{S}, {P // S}, {C}] : tensor<{P}x{C}xf16> into tensor<{S}x{P // S}x{C}xf16>
    %a0 = tensor.empty() : tensor<{S}x{K}x{C}xf32>
    %a1 = linalg.fill ins(%z : f32) outs(%a0 : tensor<{S}x{K}x{C}xf32>) -> tensor<{S}x{K}x{C}xf32>
    %part = linalg.generic {{indexing_maps = [
        affine_map<(s, k, c, p) -> (s, p, k)>, affine_map<(s, k, c, p) -> (s, p, c)>, affine_map<(s, k, c, p) -> (s, k, c)>],
        iterator_types = ["parallel", "parallel", "parallel", "reduction"]}}
        ins(%dye, %xe : tensor<{S}x{P // S}x{K}xf16>, tensor<{S}x{P // S}x{C}xf16>) outs(%a1 : tensor<{S}x{K}x{C}xf32>) {{
      ^bb0(%a: f16, %b: f16, %o: f32):
        %ae = arith.extf %a : f16 to f32
        %be = arith.extf %b : f16 to f32
        %m = arith.mulf %ae, %be : f32
        %s = arith.addf %o, %m : f32
        linalg.yield %s : f32
    }} -> tensor<{S}x{K}x{C}xf32>
    %b0 = tensor.empty() : tensor<{K}x{C}xf32>
    %b1 = linalg.fill ins(%z : f32) outs(%b0 : tensor<{K}x{C}xf32>) -> tensor<{K}x{C}xf32>
    %acc = linalg.generic {{indexing_maps = [affine_map<(k, c, s) -> (s, k, c)>, affine_map<(k, c, s) -> (k, c)>],
        iterator_types = ["parallel", "parallel", "reduction"]}} ins(%part : tensor<{S}x{K}x{C}xf32>) outs(%b1 : tensor<{K}x{C}xf32>) {{
      ^bb0(%a: f32, %o: f32):
        %s = arith.addf %o, %a : f32
        linalg.yield %s : f32
    }} -> tensor<{K}x{C}xf32>
"""
    text = f"""
func.func @conv_bwd_weight(%x: tensor<{P}x{C}xf16>, %dy: tensor<{P}x{K}xf16>) -> tensor<{K}x{C}xf16> {{
    %z = arith.constant 0.0 : f32
    {body}
    %o0 = tensor.empty() : tensor<{K}x{C}xf16>
    %out = linalg.generic {{indexing_maps = [affine_map<(a, b) -> (a, b)>, affine_map<(a, b) -> (a, b)>],
        iterator_types = ["parallel", "parallel"]}} ins(%acc : tensor<{K}x{C}xf32>) outs(%o0 : tensor<{K}x{C}xf16>) {{
      ^bb0(%a: f32, %o: f16):
        %t = arith.truncf %a : f32 to f16
        linalg.yield %t : f16
    }} -> tensor<{K}x{C}xf16>
    return %out : tensor<{K}x{C}xf16>
}}
"""
    emit(name, text, {"kind": "gemm", "P": P, "K": K, "C": C})


if __name__ == "__main__":
    which = sys.argv[2] if len(sys.argv) > 2 else "all"
    if which in ("all", "dw"):
        N, H, G = 32, 56, 144
        depthwise("dw_rows_default", N, H, H, G, 3)
        depthwise(
            "dw_rows_t1", N, H, H, G, 3, cfg1=ci("[1, 2, 3, 3, 48, 0]", "[1, 1, 3, 3, 1, 0]", "[0, 0, 0, 0, 0, 1]", 96)
        )
        depthwise(
            "dw_rows_t2",
            N,
            H,
            H,
            G,
            3,
            cfg1=ci("[1, 1, 3, 3, 144, 0]", "[1, 1, 1, 1, 1, 0]", "[0, 0, 0, 0, 0, 1]", 1296),
        )
        depthwise(
            "dw_rows_t3", N, H, H, G, 3, cfg1=ci("[1, 4, 1, 3, 48, 0]", "[1, 1, 1, 1, 1, 0]", "[0, 0, 0, 0, 0, 1]", 576)
        )
        depthwise("dw_s1only_default", N, H, H, G, 3, s1only=True)
        depthwise(
            "dw_s1only_t1",
            N,
            H,
            H,
            G,
            3,
            s1only=True,
            cfg1=ci("[1, 2, 3, 3, 48, 0]", "[1, 1, 3, 3, 1, 0]", "[0, 0, 0, 0, 0, 1]", 96),
        )
        depthwise(
            "dw_rows_t5", N, H, H, G, 3, cfg1=ci("[1, 8, 3, 3, 16, 0]", "[1, 1, 3, 3, 1, 0]", "[0, 0, 0, 0, 0, 1]", 128)
        )
        # Row blocks of 4 (dy expanded to [N, OH/4, 4, OW, G]) segfault IREE 3.13 at compile time:
        # depthwise("dw_rows4_default", N, H, H, G, 3, B=4)
        # depthwise("dw_rows4_t1", N, H, H, G, 3, B=4, cfg1=ci("[1, 2, 3, 3, 48, 0, 0]", "[1, 1, 3, 3, 1, 0, 0]", "[0, 0, 0, 0, 0, 1, 1]", 96))
        # depthwise("dw_rows4_t2", N, H, H, G, 3, B=4, cfg1=ci("[1, 1, 3, 3, 144, 0, 0]", "[1, 1, 1, 1, 1, 0, 0]", "[0, 0, 0, 0, 0, 1, 1]", 1296))
        depthwise(
            "dw_rows_t4", N, H, H, G, 3, cfg1=ci("[1, 2, 3, 3, 48, 0]", "[1, 1, 3, 3, 1, 0]", "[0, 0, 0, 0, 0, 4]", 96)
        )
    if which in ("all", "gemm"):
        for P, K, C, tag in ((196 * 4, 1024, 1024, "s"), (25088, 128, 128, "m")):
            for form in ("direct", "tdy", "tboth", "swap", "outT", "split"):
                gemm(f"g{tag}_{form}", P, K, C, form)
    (OUT / f"manifest_{which}.json").write_text(json.dumps(manifest, indent=1))
