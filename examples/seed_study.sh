#!/usr/bin/env bash
# A seed study from the command line: how similar are networks that differ only in their random seed?
#
# Captures one architecture under SEEDS model seeds, all on the same data (--data-seed stays 0 while
# --seed changes, so every cache holds the same samples), then studies the caches together: a
# model × model table per measure (study.csv), the embedding and dendrogram, and report.html.
#
#   bash examples/seed_study.sh [OUT] [SEEDS] [N]      # default: runs/seed-study 4 512
#   SIMKIT=".venv/bin/simkit" MODEL=torchvision:resnet18 DATA=synthetic:3x64x64 bash examples/seed_study.sh
#
# Tiny by default (simkit:cnn1d at random init on MNIST-1D, a few seconds per seed on one CPU core).
set -euo pipefail
OUT=${1:-runs/seed-study}
SEEDS=${2:-4}
N=${3:-512}
SIMKIT=${SIMKIT:-simkit}
MODEL=${MODEL:-simkit:cnn1d}
DATA=${DATA:-mnist1d}

caches=()
names=()
for ((seed = 0; seed < SEEDS; seed++)); do
    $SIMKIT capture "$MODEL" --data "$DATA" --n "$N" --seed "$seed" --data-seed 0 --out "$OUT/cache-s$seed"
    caches+=("$OUT/cache-s$seed")
    names+=("seed$seed")
done
$SIMKIT compare "${caches[@]}" --names "$(IFS=,; echo "${names[*]}")" --pairing last --out "$OUT/study"
