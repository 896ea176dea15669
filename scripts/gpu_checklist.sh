#!/usr/bin/env bash
# The GPU checklist: every path that runs on CUDA, on a one-GPU machine, each step under a time cap,
# every figure and log written to $OUT (default gpu-out/). Run from the repository root:
#
#   DATA=../shared/data OUT=gpu-out bash scripts/gpu_checklist.sh   # every step: some 45 minutes, not in a device call
# A device call runs 600 s at most and brings back 8 files: name groups, with PACK=1 and BUDGET=560, and carry
# DATA (gpu-data/: flickr8k compacted and wiki, made as below; gpu-seps/: wiki and mirflickr730_tokens):
#   DATA=gpu-data PACK=1 BUDGET=560 bash scripts/gpu_checklist.sh speed compile graphs   # issue 48's, first
#   DATA=gpu-data PACK=1 BUDGET=560 bash scripts/gpu_checklist.sh speed     # its figures alone
#   DATA=gpu-data PACK=1 BUDGET=560 bash scripts/gpu_checklist.sh compile   # torch.compile: a step, then the main job
#   DATA=gpu-data PACK=1 BUDGET=560 bash scripts/gpu_checklist.sh graphs    # streams, the real-GPU graph tests, TF32
#   DATA=gpu-data PACK=1 BUDGET=560 bash scripts/gpu_checklist.sh comparison   # goal 4's whole comparison
#   (it goes on from gpu-data/comparison.jsonl: copy $OUT's comparison.jsonl there before the next call)
#   DATA=gpu-data PACK=1 BUDGET=560 bash scripts/gpu_checklist.sh checks    # eager main job, evaluation, agreement
#   DATA=gpu-seps PACK=1 BUDGET=560 bash scripts/gpu_checklist.sh extras    # encoding at scale, bf16, SEPS + rerank
#   DATA=gpu-seps PACK=1 BUDGET=560 bash scripts/gpu_checklist.sh suite     # tests, every method, search, torchrun
#   mkdir -p gpu-seps && cp ../shared/data/wiki.h5 ../shared/data/mirflickr730_tokens.h5 gpu-seps/   # 29 MiB
# A step whose file DATA lacks is skipped, said in summary.txt and speed.md.
#
# Several groups run one after another in the order asked (`graphs compile`: graphs' steps first), each group's
# steps in this file's order.
# BUDGET (seconds, default none) is the call's: a step starts while 30 s of it remain (10 more kept for the report), under its
# cap or what remains; the steps it leaves are listed in summary.txt as not started, and speed.md says so. A
# device call of 600 s at most thus brings back every step it had time for; the next call names the groups
# left.
#
# `speed` runs only the steps that measure the speed goals: about 6 minutes on an H200 if nothing is faster
# than the eager figures measured there (main job 105 s, Flickr8k 144 s), under 10 minutes whatever happens
# (the caps add up to 590 s), so that a lease of 15 device-minutes leaves room to run it again: a step of every
# method eager and captured (bench_steps, with each graph path's captures and replays), the main
# job with captured steps (--cuda_graph, 100 epochs: time and MAP) and eager for 20 epochs (the same card's rate),
# bench_train with the captured variant, the default
# on full Flickr8k at 64 bits with captured steps, and the six-cell grid at --jobs 1 and 6 (in processes, then in
# threads: 29.5 and 21.8 s on the H200 in processes, 2026-11-30). Flickr8k does
# not fit the 64-MiB working tree as it is: carry a compact copy made here (features rounded to float16):
#   python scripts/compact_data.py ../shared/data/flickr8k.h5 gpu-data/flickr8k.h5 && cp ../shared/data/wiki.h5 gpu-data/
# Every run ends with $OUT/speed.md: issue 48's goals, measured against the eager H200 figures (scripts/speed_report.py).
# (gpu-data/ and gpu-seps/ are git-ignored; the device call names one in carry). Without $DATA/flickr8k.h5 those
# steps are skipped.
#
# The first step (env) times importing the CLI as the image has it and with Python's bytecode cached; every step
# after it runs with the cache ($PYCACHE), as a normal installation would (the image's imports compile torch's
# sources every time: 4.2 s of the main job's 25.5 on the H200, 2026-11-30).
#
# DATA holds wiki.h5 (the per-method runs and search use it) and mirflickr730_tokens.h5 (SEPS, rerank). Steps: the machine; the C kernels built in
# place; timed one at a time: the main job (both UCMFH stages, 100 epochs each, synthetic MIRFlickr size), eager
# and with --cuda_graph (its MAPs beside the eager run's),
# bench_train, bench_eval and time_metrics on CUDA, device_agreement (each method's model on CUDA against
# the CPU's), bf16, a six-cell grid at --jobs 1 and --jobs 6 (processes, threads; wall seconds, rows equal),
# SEPS and rerank;
# then side by side: the test suite on the GPU machine (CLI tests take
# --device auto = CUDA, the CUDA tests run), one short CUDA run of every method followed by index + search
# on CUDA against the CPU, torchrun with 2 ranks. summary.txt gets one line per step: its exit status and seconds.
set -u
OUT=${OUT:-gpu-out}
DATA=${DATA:-../shared/data}
PY=${PYTHON:-python3}
DEVICE=${DEVICE:-cuda}  # DEVICE=cpu SKIP="tests main-job" walks the list on a machine without a GPU
SKIP=${SKIP:-}
PACK=${PACK:-0}  # PACK=1: OUT ends with summary.txt, speed.md (issue 48's goals) and logs.tgz (every other file)
ASKED=" $* "  # the groups asked for, any of: speed compile graphs comparison (none: every step)
group_steps() {  # the timed steps of a group, in the order they run
    case $1 in
        speed) echo "steps main-graph main-eager20 bench-train flickr8k-graph grid-jobs" ;;
        # torch.compile's fused kernels inside the captured step: one step of the main stages (bench_steps
        # --compile), then the main job so compiled (scripts/compiled_main.py) on an empty inductor cache and again
        # on the filled one (the compile's seconds, then what a second run waits), its MAPs against the captured
        # job's; caps: 490 s
        compile) echo "compile main-compile main-compile-warm" ;;
        # several fits in one process, each on a stream of its own, against the same fits in turn (goal 4's lever?
        # and the same models?), and full Flickr8k's default with its two candidates so (goal 3's lever: its rows
        # should be those of flickr8k-graph, the speed group's); then the captured step on a GPU: the graph path
        # against the eager one for every plan, then TF32 matmuls (--amp tf32): a step of the main stages, and the
        # main job (its MAPs against float32's); caps: 510 s
        graphs) echo "streams flickr8k-side graph-tests steps-tf32 main-tf32" ;;
        # issue 48's goal 4 at full size: every method × 16/32/64/128 bits × 3 seeds on full Flickr8k, JOBS cells at
        # once (in threads of one process, each on a CUDA stream of its own; WORKERS=processes: in worker
        # processes), for 540 s a call; its rows go on from $COMPARISON (default $DATA/comparison.jsonl) and come
        # back in $OUT
        comparison) echo "comparison" ;;
        # the checks that are not issue 48's figures, in three calls of under 560 s: the eager main job, evaluation
        # and the metrics at scale, each method's model on CUDA against the CPU's (caps: 470 s);
        checks) echo "main-job bench-eval metrics agreement" ;;
        # encoding and memory at NUS-WIDE size, bf16 through both stages, SEPS and rerank: DATA must hold
        # wiki.h5 and mirflickr730_tokens.h5, which gpu-data/ (flickr8k's) has no room for (caps: 460 s);
        extras) echo "bench-train-all bf16 seps" ;;
        # side by side: the test suite on the GPU, a short CUDA run of every method then index + search against the
        # CPU's, torchrun with 2 ranks (caps: 290 s at once)
        suite) echo "tests methods search torchrun" ;;
        *) return 1 ;;
    esac
}
ONLY=""
for group in "$@"; do
    steps=$(group_steps "$group") || {
        echo "gpu_checklist.sh: error: unknown group '$group' (speed, compile, graphs, comparison, checks, extras or" \
            "suite)" >&2; exit 2; }
    ONLY="$ONLY $steps"
done
[ -n "$ONLY" ] && ONLY="env build native $ONLY"  # every group's steps after the machine's and the build's
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
WORK=$(mktemp -d)
PYCACHE=${PYTHONPYCACHEPREFIX:-$WORK/pycache}
export OUT DATA PY DEVICE WORK PYCACHE

BUDGET=${BUDGET:-0}  # the call's seconds (0: no limit): a step starts while 30 s remain, its cap cut to them
START=$(date +%s)

wanted() {  # wanted NAME: whether step NAME is to run (not in SKIP; in ONLY, where groups were asked)
    case " $SKIP " in *" $1 "*) return 1 ;; esac
    [ -z "$ONLY" ] || case " $ONLY " in *" $1 "*) ;; *) return 1 ;; esac
}

needs() {  # needs FILE NAME: whether FILE is there for step NAME; where not (and NAME is to run), summary.txt says so
    [ -f "$1" ] && return 0
    wanted "$2" && echo "$2 skipped: no $1" | tee -a "$OUT/summary.txt"
    return 1
}

step() {  # step NAME SECONDS COMMAND...: run COMMAND (or a function below) under a cap, its output in $OUT/NAME.txt
    local name=$1 cap=$2; shift 2
    wanted "$name" || return 0
    if [ "$BUDGET" -gt 0 ]; then  # 10 s kept for the report and the packing
        local left=$(( BUDGET - 10 - $(date +%s) + START ))
        if [ "$left" -lt 30 ]; then
            echo "$name not started: the call's BUDGET of $BUDGET s is spent" | tee -a "$OUT/summary.txt"
            return 0
        fi
        [ "$cap" -gt "$left" ] && cap=$left
    fi
    local t0; t0=$(date +%s%N)
    CAP=$cap timeout --kill-after=10 "$cap" bash -c '"$@"' _ "$@" >"$OUT/$name.txt" 2>&1  # CAP: the command's own
    local rc=$? ms=$(( ($(date +%s%N) - t0) / 1000000 ))
    printf '%-12s rc=%-3s %4d.%03d s\n' "$name" "$rc" $((ms / 1000)) $((ms % 1000)) | tee -a "$OUT/summary.txt"
}

methods() {  # one short CUDA run of every method on wiki, four at a time (closed-form methods take no epochs);
    # the step fails where one method did
    $PY -c "from ucmfh.methods import METHODS
for name, m in METHODS.items(): print(name if m.closed_form else name + ' --epochs 3')" |  # no trailing blank: xargs -L would join the next line
    xargs -P 4 -L 1 sh -c "$PY -m ucmfh train-hash -d wiki --data-dir $DATA -b 32 --method \$0 \$@ \
        --device $DEVICE --out $WORK/runs --results $OUT/methods.jsonl --quiet > $WORK/method-\$0.txt 2>&1; \
        echo \"\$0 rc=\$?\"; tail -3 $WORK/method-\$0.txt" | tee "$WORK/methods-said.txt"
    ! grep -q '^[a-z0-9-]* rc=[1-9]' "$WORK/methods-said.txt"
}

search() {  # the two-tower checkpoint of methods(): index and search on CUDA and on the CPU, results compared
    local ckpt; ckpt=$(find "$WORK/runs" -path '*two-tower*' -name 'hash32.pt' | head -1)
    [ -n "$ckpt" ] || ckpt=$(find "$WORK/runs" -name 'hash32.pt' | head -1)
    echo "checkpoint: $ckpt"
    for dev in $DEVICE cpu; do
        $PY -m ucmfh index "$DATA/wiki.h5" -c "$ckpt" -o "$WORK/index-$dev" --device "$dev" --quiet || return 1
        $PY -m ucmfh search "$WORK/index-$dev" -q "$DATA/wiki.h5" -k 20 --json --metrics --device "$dev" > "$WORK/search-$dev.json" || return 1
    done
    cmp "$WORK/search-$DEVICE.json" "$WORK/search-cpu.json" && echo "search: $DEVICE and CPU results identical"
}

seps() {  # SEPS trained on tokens, then ucmfh rerank (Hamming, cosine and SEPS re-ranking) on $DEVICE
    $PY -m ucmfh train-hash -d mirflickr730_tokens --data-dir "$DATA" -b 32 --epochs 3 --device $DEVICE \
        --out "$WORK/seps-runs" --results "$OUT/seps.jsonl" --quiet || return 1
    $PY -m ucmfh train-seps -d mirflickr730_tokens --data-dir "$DATA" --epochs 2 --device $DEVICE \
        --out "$WORK/seps-runs" --results "$OUT/seps.jsonl" --quiet || return 1
    $PY -m ucmfh rerank -d mirflickr730_tokens --data-dir "$DATA" --device $DEVICE --results "$OUT/seps.jsonl" \
        -c "$(find "$WORK/seps-runs" -name 'hash32.pt' | head -1)" --seps "$(find "$WORK/seps-runs" -name 'seps.pt' | head -1)" \
        -m 50 --full --quiet
}

comparison() {  # the whole Flickr8k comparison on this GPU (goal 4), resumable: a call stopped by its cap keeps
    # the cells it finished (a cell cut short trains again at the next call); the wall of the whole is the sum of
    # the calls' `comparison` seconds. Unimodal protocol, tie-aware, as docs/quality.md's comparison. The rows
    # are written in $OUT as they come (what a device call brings back), after those of the calls before
    local results=${COMPARISON:-$DATA/comparison.jsonl}
    [ -f "$results" ] && cp "$results" "$OUT/comparison.jsonl"
    # Ctrl-C's signal at 17/18 of the step's cap (510 s of 540): the grid stops its cells and exits in time
    timeout -s INT $(( ${CAP:-540} * 17 / 18 )) $PY -m ucmfh grid -d flickr8k --data-dir "$DATA" --protocol unimodal \
        --methods two-tower,distill,cca-itq,ucmfh,djsrh,jdsh,ucch,dgcpn,cirh,daeh -b 16 -b 32 -b 64 -b 128 \
        --seeds 2023,2024,2025 --jobs "${JOBS:-8}" --workers "${WORKERS:-threads}" --device "$DEVICE" \
        --results "$OUT/comparison.jsonl" \
        --table "$OUT/comparison" --out "$WORK/comparison-runs" --quiet
}

finish() {  # the goals' table; with PACK=1 every log but the summary and the table packed into one file, as a
    # device call brings back 8 files at most
    $PY scripts/speed_report.py "$OUT" > "$OUT/speed.md" 2>&1
    if [ "$PACK" = 1 ]; then
        (cd "$OUT" && tar czf "$WORK/logs.tgz" --exclude summary.txt --exclude speed.md --exclude comparison.jsonl . &&
            find . -mindepth 1 ! -name summary.txt ! -name speed.md ! -name comparison.jsonl -delete &&
            mv "$WORK/logs.tgz" .)
    fi
    rm -rf "$WORK"
}

imports() {  # seconds to import the CLI: as the image has it (its site-packages hold no bytecode and
    # PYTHONDONTWRITEBYTECODE is set, so each import compiles torch's sources: 4.2 s on the H200's, 2026-11-30),
    # then with Python's bytecode written to and read from $PYCACHE (filled by the first of two runs), as a
    # normal installation has it (pip compiles the bytecode as it installs)
    local i t0
    for i in as-is cached-fill cached; do
        t0=$(date +%s%N)
        if [ "$i" = as-is ]; then $PY -c 'import ucmfh.app.hashing_cli'
        else env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX="$PYCACHE" $PY -c 'import ucmfh.app.hashing_cli'; fi
        echo "import ucmfh.app.hashing_cli, $i: $(( ($(date +%s%N) - t0) / 1000000 )) ms"
    done
}

export -f methods search seps imports comparison
step env 40 bash -c "nvidia-smi -L && $PY -c 'import torch; print(torch.__version__, torch.cuda.is_available(), \
    torch.cuda.get_device_name(0))' && imports"
# every step after this one reads Python's bytecode from $PYCACHE, as on a machine whose installation wrote it
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=$PYCACHE
step build 30 $PY setup.py -q build_ext --inplace
step native 20 $PY -c "import ucmfh; print(ucmfh.native_kernels())"
timed() {  # the timed steps, one at a time, in this order (those of ONLY, where groups were asked): the speed
    # goals first. Each method's step eager and captured comes first: its captures and replays say whether every
    # plan was captured at all (a capture PyTorch refuses leaves that plan eager, said on its row), before the runs
    # that depend on them
    step steps 45 $PY scripts/bench_steps.py --device $DEVICE --steps 20 --repeats 1 --only daeh --only jdsh \
        --only dgcpn --only djsrh --only cirh --only two-tower --only ucch  # the slowest comparison cells first
        # (a step cut short keeps the stages it finished)
    step main-graph 110 $PY demo.py --task 1 --dataset synthetic --hash_lens 64 --epoch 100 --cuda_graph \
        --out "$WORK/graph" --results "$OUT/main-graph.jsonl"  # the main job, each full batch's step a CUDA graph replay
    step main-eager20 40 $PY demo.py --task 1 --dataset synthetic --hash_lens 64 --epoch 20 --no_cuda_graph \
        --out "$WORK/eager20" --results "$OUT/main-eager20.jsonl"  # eager, 20 epochs: this card's rate beside the graph's
    step bench-train 80 $PY scripts/bench_train.py --device $DEVICE --only throughput --cuda-graph --amp none \
        --n-train 5120 --repeats 3 --epochs 5  # whole fits, and items/s after each fit's first epoch (goal 2's)
    needs "$DATA/flickr8k.h5" flickr8k-graph && step flickr8k-graph 130 $PY -m ucmfh train-hash -d flickr8k --data-dir "$DATA" -b 64 \
        --cuda-graph --device $DEVICE --out "$WORK/flickr8k" --results "$OUT/flickr8k.jsonl"  # the default, both temperatures
    step grid-jobs 115 $PY scripts/bench_grid_jobs.py --jobs 1 --jobs 6 --threads 6 -- -d wiki --data-dir "$DATA" \
        --methods two-tower,ucmfh --seeds 1,2,3 -b 32 --epochs 10 --device $DEVICE  # six cells one by one, then at
        # once in worker processes, then at once in threads of one process (each cell on a CUDA stream of its own)
    # asked for alone (`comparison`): every method × length × seed, JOBS at once, for 540 s
    case $ASKED in *" comparison "*) needs "$DATA/flickr8k.h5" comparison && step comparison 540 comparison ;; esac
    step compile 170 env TORCHINDUCTOR_CACHE_DIR="$WORK/inductor-steps" $PY scripts/bench_steps.py --device $DEVICE \
        --steps 40 --repeats 1 --compile --only two-tower --only fusion --only ucmfh  # each stage's loss compiled in
        # the warm-up, then captured: fewer, larger kernels? (its own cache: the main job's below starts empty)
    # the main job compiled, twice with one cache: empty for the first run, filled for the second
    COMPILED_MAIN="env TORCHINDUCTOR_CACHE_DIR=$WORK/inductor-main $PY scripts/compiled_main.py --task 1 \
        --dataset synthetic --hash_lens 64 --epoch 100"
    step main-compile 220 $COMPILED_MAIN --out "$WORK/main-compile" --results "$OUT/main-compile.jsonl"
    step main-compile-warm 100 $COMPILED_MAIN --out "$WORK/main-compile-warm" --results "$OUT/main-compile-warm.jsonl"
    step streams 120 $PY scripts/bench_streams.py --device $DEVICE --runs 4 --steps 100 --epochs 5 --only two-tower \
        --only jdsh --only fusion  # 4 captured fits in turn, then at once in processes, then in threads (own streams)
    needs "$DATA/flickr8k.h5" flickr8k-side && step flickr8k-side 130 $PY -m ucmfh train-hash -d flickr8k --data-dir "$DATA" -b 64 \
        --cuda-graph --candidates-side-by-side --device $DEVICE --out "$WORK/flickr8k-side" \
        --results "$OUT/flickr8k-side.jsonl"  # the default, its two temperatures at once (streams of their own)
    step graph-tests 90 $PY -m pytest tests/test_captured_step.py -k real -q -rf -p no:cacheprovider -n 8  # each plan
    step steps-tf32 60 $PY scripts/bench_steps.py --device $DEVICE --steps 40 --repeats 1 --tf32 --only fusion \
        --only ucmfh --only two-tower  # the captured step with its float32 matmuls in TF32, against float32's
    step main-tf32 110 $PY demo.py --task 1 --dataset synthetic --hash_lens 64 --epoch 100 --amp tf32 \
        --out "$WORK/tf32" --results "$OUT/main-tf32.jsonl"  # the main job, captured, TF32: its wall and its MAPs
}

rest() {  # the checks that are not issue 48's figures (groups checks, extras and suite)
    step main-job 120 $PY demo.py --task 1 --dataset synthetic --hash_lens 64 --epoch 100
    step bench-train-all 160 $PY scripts/bench_train.py --device $DEVICE --only encode --only memory --encode-n 190000
    step bench-eval 100 $PY scripts/bench_eval.py --device $DEVICE --bits 16 64 128 --ref-queries 20 --json "$OUT/bench_eval.json"
    step metrics 100 $PY scripts/time_metrics.py --device $DEVICE --bits 64  # MAP@all, tie-aware, cosine, PR, at NUS-WIDE scale
    step agreement 150 $PY scripts/device_agreement.py --device $DEVICE --seeds 2  # same model as on the CPU? dropout's stream or arithmetic
    step bf16 100 $PY -m ucmfh train-hash -d wiki --data-dir "$DATA" -b 32 --method ucmfh --epochs 3 --amp bf16 \
        --device $DEVICE --out "$WORK/bf16" --results "$OUT/bf16.jsonl" --quiet  # both stages, bf16 through the model
    needs "$DATA/mirflickr730_tokens.h5" seps && step seps 200 seps
    # not timed, side by side: the suite, every method then search, torchrun
    step tests 240 $PY -m pytest tests -q -rf -p no:cacheprovider -n 6 --timeout 150 &
    { step methods 170 methods; step search 120 search; } &
    # 2 ranks: NCCL on two GPUs where they exist; on one GPU, gloo (--device cpu: NCCL refuses two ranks on one GPU)
    wanted torchrun && NGPU=$($PY -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
    DDP_DEVICE=$([ "$DEVICE" = cuda ] && [ "${NGPU:-0}" -ge 2 ] && echo cuda || echo cpu)
    step torchrun 60 $PY -m torch.distributed.run --nproc-per-node 2 --master-addr 127.0.0.1 -m ucmfh train-hash \
        -d wiki --data-dir "$DATA" -b 32 --epochs 2 --device $DDP_DEVICE --out "$WORK/ddp" --results "$OUT/ddp.jsonl" --quiet &
    wait
}

if [ $# -eq 0 ]; then  # every step: some 45 minutes, more than a device call's 600 s (there, name the groups)
    timed
    rest
else  # the groups one after another, in the order asked
    for group in "$@"; do ONLY=" $(group_steps "$group") "; timed; rest; done
fi
finish
