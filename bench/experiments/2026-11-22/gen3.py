"""Experiment 3: ways to pad x (N x H x W x C f16, 1 each side of H and W) on sm_80."""

import json
import sys
from pathlib import Path

import iree.compiler as ic

OUT = Path(sys.argv[1])
OUT.mkdir(parents=True, exist_ok=True)
FLAGS = ["--iree-hal-target-device=cuda", "--iree-cuda-target=sm_80"]
man = []


def emit(name, text, meta):
    try:
        (OUT / f"{name}.vmfb").write_bytes(ic.compile_str(text, extra_args=FLAGS))
        man.append({"name": name, **meta})
        print("ok", name)
    except Exception as e:
        print("FAIL", name, str(e)[:800])


for N, H, C in ((32, 56, 144), (64, 56, 256)):
    T = f"tensor<{N}x{H}x{H}x{C}xf16>"
    TP = f"tensor<{N}x{H + 2}x{H + 2}x{C}xf16>"
    meta = {"kind": "pad", "N": N, "H": H, "C": C}
    emit(
        f"pad_tensorpad_{C}",
        f"""
func.func @conv_bwd_weight(%x: {T}, %unused: {T}) -> {TP} {{
  %z = arith.constant 0.0 : f16
  %p = tensor.pad %x low[0, 1, 1, 0] high[0, 1, 1, 0] {{
    ^bb0(%a: index, %b: index, %c: index, %d: index):
      tensor.yield %z : f16
  }} : {T} to {TP}
  return %p : {TP}
}}""",
        meta,
    )
    emit(
        f"pad_insert_{C}",
        f"""
func.func @conv_bwd_weight(%x: {T}, %unused: {T}) -> {TP} {{
  %z = arith.constant 0.0 : f16
  %e = tensor.empty() : {TP}
  %f = linalg.fill ins(%z : f16) outs(%e : {TP}) -> {TP}
  %p = tensor.insert_slice %x into %f[0, 1, 1, 0] [{N}, {H}, {H}, {C}] [1, 1, 1, 1] : {T} into {TP}
  return %p : {TP}
}}""",
        meta,
    )
    emit(
        f"pad_gather_{C}",
        f"""
func.func @conv_bwd_weight(%x: {T}, %unused: {T}) -> {TP} {{
  %z = arith.constant 0.0 : f16
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %cH = arith.constant {H} : index
  %e = tensor.empty() : {TP}
  %p = linalg.generic {{indexing_maps = [affine_map<(n, h, w, c) -> (n, h, w, c)>], iterator_types = ["parallel", "parallel", "parallel", "parallel"]}} outs(%e : {TP}) {{
    ^bb0(%o: f16):
      %n = linalg.index 0 : index
      %h = linalg.index 1 : index
      %w = linalg.index 2 : index
      %c = linalg.index 3 : index
      %hs = arith.subi %h, %c1 : index
      %ws = arith.subi %w, %c1 : index
      %h0 = arith.cmpi sge, %hs, %c0 : index
      %h1 = arith.cmpi slt, %hs, %cH : index
      %w0 = arith.cmpi sge, %ws, %c0 : index
      %w1 = arith.cmpi slt, %ws, %cH : index
      %a = arith.andi %h0, %h1 : i1
      %b = arith.andi %w0, %w1 : i1
      %in = arith.andi %a, %b : i1
      %hc = arith.maxsi %hs, %c0 : index
      %hc2 = arith.minsi %hc, %cH : index
      %wc = arith.maxsi %ws, %c0 : index
      %wc2 = arith.minsi %wc, %cH : index
      %hc3 = arith.select %h1, %hc2, %c0 : index
      %wc3 = arith.select %w1, %wc2, %c0 : index
      %v = tensor.extract %x[%n, %hc3, %wc3, %c] : {T}
      %r = arith.select %in, %v, %z : f16
      linalg.yield %r : f16
  }} -> {TP}
  return %p : {TP}
}}""",
        meta,
    )
(OUT / "manifest_pad.json").write_text(json.dumps(man))
