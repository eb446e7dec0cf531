#!/bin/sh
# Rewrites the lane-map tables here from AMD's matrix instruction calculator (not part of this project):
#   git clone https://github.com/ROCm/amd_matrix_instruction_calculator  (tables made at 2ef91896, v1.3.2)
#   pip install tabulate; sh regenerate.sh /path/to/amd_matrix_instruction_calculator/matrix_calculator.py
# Each file is the calculator's --matrix-layout CSV for one matrix, under a first line with its command.
set -eu
calc=${1:?path to matrix_calculator.py}
py=${PYTHON:-python3}
cd "$(dirname "$0")"
table() {  # arch instruction matrix [extra options] -> arch/instruction.matrix[.opselN].csv
    arch=$1 inst=$2 m=$3
    shift 3
    out="$arch/$inst.$m$(echo "$*" | sed -n 's/.*--opsel \([0-9]\).*/.opsel\1/p').csv"
    mkdir -p "$arch"
    cmd="python matrix_calculator.py --architecture $arch --instruction $inst --matrix-layout -$m --csv${*:+ $*}"
    { echo "# $cmd"; $py "$calc" --architecture "$arch" --instruction "$inst" --matrix-layout "-$m" --csv "$@"; } >"$out"
}
for inst in v_mfma_f32_16x16x16f16 v_mfma_f32_32x32x8f16 v_mfma_f32_16x16x16bf16_1k v_mfma_f32_32x32x8bf16_1k; do
    for m in A B C D; do table cdna2 $inst $m; done
done
for inst in v_mfma_f32_16x16x16_f16 v_mfma_f32_32x32x8_f16 v_mfma_f32_16x16x16_bf16 v_mfma_f32_32x32x8_bf16; do
    for m in A B C D; do table cdna3 $inst $m; done
done
for arch in rdna3 rdna4; do
    for inst in v_wmma_f32_16x16x16_f16 v_wmma_f32_16x16x16_bf16; do
        for m in A B C D; do table $arch $inst $m --wavefront 32; done
    done
done
# the f16 result's half selection: OPSEL[2] picks the low (0) or high (4) 16 bits of each D register on RDNA 3
table rdna3 v_wmma_f16_16x16x16_f16 D --wavefront 32 --opsel 0
table rdna3 v_wmma_f16_16x16x16_f16 D --wavefront 32 --opsel 4
table rdna4 v_wmma_f16_16x16x16_f16 D --wavefront 32
