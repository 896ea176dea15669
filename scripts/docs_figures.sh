#!/usr/bin/env bash
# docs/quality.md's headline comparisons as figures: every method at 16, 32, 64 and 128 bits, seeds
# 2023-2025, `unimodal`, tie-aware, each method with its own settings; one figure per dataset and score
# (MAP@50, or R@K and rSum, each direction, against code length: one line per method, the seed spread as
# error bars, CCA-ITQ and random codes as references), drawn by `ucmfh grid --plot` from the grid's own
# rows into docs/figures/, and forest plots
# of `ucmfh compare` (the default against JDSH and against DAEH, every cell with its 95% interval). The
# grid is resumable: the same command goes on where it stopped. It runs seed by seed and draws after each
# (seed 2023 alone, then 2023-2024, then all three), so a long one stopped early has figures of its seeds. Last,
# the precision-recall and precision@K curves of every method at 64 bits on one set (`evaluate --codes`).
# Run from the repository root:
#
#   bash scripts/docs_figures.sh small       # mirflickr730 and Wiki: 44 minutes on 2 CPU cores (2026-11-27)
#   bash scripts/docs_figures.sh flickr8k    # full Flickr8k: days on 2 CPU cores; on a GPU:
#   DEVICE=cuda JOBS=8 DATA=gpu-data RESULTS=gpu-data/docs-flickr8k.jsonl bash scripts/docs_figures.sh flickr8k
#   (gpu-data/: scripts/compact_data.py's copy of flickr8k.h5, see docs/benchmarks.md; a device call that
#   ends first brings the results file back in $OUT, and the next call, carrying it, goes on from there)
#
# The grid's rows are kept in the repository, docs/results/SET.jsonl: the figures are drawn from them, the
# grid trains only the cells they lack (a fresh checkout redraws every length figure without training), and a
# comparison longer than a session goes on from the rows committed at its last stop. The forest plots and the
# curves need the runs' checkpoints and per-query files (runs/, not kept): they are drawn where the runs were.
#
# DATA: the folder of the dataset files (default ../shared/data); RESULTS: the results file the grid
# appends to and skips finished cells by (default docs/results/SET.jsonl); JOBS: cells at once (default 2);
# SEEDS: the seeds, in the order of the passes (default 2023,2024,2025; SEEDS=2023 stops after the first);
# PARTS: which figures (default "lengths forest curves": the grid and its length figures, the forest plots,
# the curves; PARTS="forest curves" draws the last two from the runs at hand, training nothing).
set -eu
SET=${1:?usage: bash scripts/docs_figures.sh small|flickr8k}
DATA=${DATA:-../shared/data}
DEVICE=${DEVICE:-auto}
JOBS=${JOBS:-2}
RESULTS=${RESULTS:-docs/results/$SET.jsonl}
SEEDS=${SEEDS:-2023,2024,2025}
PARTS=" ${PARTS:-lengths forest curves} "
METHODS=two-tower,cca-itq,jdsh,djsrh,dgcpn,ucch,cirh,daeh
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
# the length figures docs/ shows: every one of a labelled set (MAP@50 each direction); of a caption set's
# 14 (R@1, R@5, R@10 each direction and rSum, per database), those of its table: R@1 and rSum on `test`
case $SET in
    small) SETS=(-d mirflickr730 -d wiki); PR_SET=mirflickr730; PLOT=docs/figures/quality; KEEP=""
           FOREST="jdsh daeh" ;;
    flickr8k) SETS=(-d flickr8k); PR_SET=flickr8k; PLOT=$WORK/quality; KEEP="r1_i2t_test r1_t2i_test rsum_test"
              FOREST="jdsh cca-itq" ;;
    *) echo "docs_figures.sh: error: unknown set '$SET' (small or flickr8k)" >&2; exit 2 ;;
esac
mkdir -p docs/figures "$(dirname "$RESULTS")"
# seed by seed, each pass drawing the seeds so far: a long grid stopped after its first seed has its figures
passes=() seeds=""
for seed in ${SEEDS//,/ }; do
    seeds=${seeds:+$seeds,}$seed
    passes+=("$seeds")
done
case $PARTS in *" lengths "*) ;; *) passes=() ;; esac
for seeds in "${passes[@]}"; do
    OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} python -m ucmfh grid "${SETS[@]}" --data-dir "$DATA" \
        --protocol unimodal --methods "$METHODS" -b 16 -b 32 -b 64 -b 128 --seeds "$seeds" \
        --jobs "$JOBS" --device "$DEVICE" --results "$RESULTS" --table "runs/docs-$SET" --plot "$PLOT" --quiet
    for name in $KEEP; do
        cp "${PLOT}_${SET}_$name.png" docs/figures/ && echo "kept docs/figures/quality_${SET}_$name.png"
    done
done
# the default against two others (small: the field's two closest to it; flickr8k: the strongest field
# method and the reference): each cell's paired difference and its interval over SEEDS (from the runs'
# per-query files, kept beside their checkpoints in runs/: rows whose runs were elsewhere have no such
# files, and compare says so)
if [[ $PARTS == *" forest "* ]]; then
    for method in $FOREST; do
        python -m ucmfh compare "$method" two-tower "${SETS[@]}" --protocol unimodal --results "$RESULTS" \
            $(printf -- '--seed %s ' ${SEEDS//,/ }) --plot "docs/figures/compare_${SET}_$method.png" ||
            echo "docs_figures.sh: no forest plot of $method" >&2
    done
fi
[[ $PARTS == *" curves "* ]] || exit 0
# precision-recall and precision@K of every method at 64 bits (seed 2023) on one set: its codes, then one figure
CODES=$WORK/codes
mkdir "$CODES"
files=()
for method in ${METHODS//,/ }; do
    checkpoint=$(python -m ucmfh runs --results "$RESULTS" -d "$PR_SET" --method "$method" -b 64 --seed 2023 \
        --protocol unimodal --checkpoint) &&
    python -m ucmfh encode -d "$PR_SET" --data-dir "$DATA" -c "$checkpoint" -o "$CODES/$method.h5" --device "$DEVICE" \
        --quiet > /dev/null && files+=(--codes "$CODES/$method.h5") || echo "docs_figures.sh: no codes of $method" >&2
done
if [ ${#files[@]} -gt 0 ]; then
    python -m ucmfh evaluate "${files[@]}" --results "" --plot "docs/figures/curves_${PR_SET}_64"
fi
