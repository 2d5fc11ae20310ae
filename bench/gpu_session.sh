#!/usr/bin/env bash
# Every GPU result of the README, in parts that each fit in 10 minutes of GPU time:
#   PYTHONPATH=. bash bench/gpu_session.sh PART [ARGS...]   (results under $OUT/PART, or bench/results/PART;
#   ARGS go to the part's bench.run command, e.g. --budget 280; the per_check parts of different models can
#   run side by side on a 2-GPU machine, one CUDA_VISIBLE_DEVICES each)
# then merge the per_check parts: python -m bench.plot bench/results/h200/per_check.json OUT/*/per_check.json
# (except ablation parts such as min_spill, whose runs use other options: keep those in files of their own)
# Budget note (H200): an Inductor compile of a real shape takes 25-85 s; per_check marks N and the prefix
# dynamic, so one model's full per_check took 146-267 s (N = 13 and the plain graph the
# backend compiles alongside the folded one for few-branch calls). $OUT sub-folder names: letters,
# digits, '.', '_', '-' only (the device tool drops other names).
set -euo pipefail
part=${1:?usage: bash bench/gpu_session.sh check|per_check_1.5b|per_check_7b|per_check_nld|per_check_split|gate|unfused|fold_head|writes|memory|end_to_end|breakdown|kernels|attention_sweep|split_sweep|per_check_2048|one_pass_sweep|one_pass|kernels_linear|gate_flags|min_spill|dense_fraction|logit_positions|launched|launch|decode_loop|batched|batched_rows|batched_loop|gate_kernel|baseline_ab|packed_attention|shipped|trace_driven|grid|boundaries|budgets|heads|cli [ARGS...]}
shift
export OUT="${OUT:-bench/results}/$part"
mkdir -p "$OUT"
# COMPILE_CACHE=FILE.tgz (an ignored file carried to the GPU machine, e.g. .traces/compile_cache.tgz; it need not
# exist yet): Inductor's and Triton's caches unpacked from it before the part runs, and packed after it into
# $OUT/compile_cache.tgz (bring that back and carry it next time), so that a fresh machine may skip the
# compiles an earlier one made (within one machine a warm cache cut SpecFold's warm-up at 1.5B from 123 s to
# 24 s; carried to a fresh H100, a cache made on another H100 cut NLD-3B's from 84 s to 54 s). One shape's
# compiled modes pack to about 13 MB (NLD-3B); a file comes back from the device at 16 MiB at most, so keep
# one cache a shape.
if [ -n "${COMPILE_CACHE:-}" ]; then
  cache_dir=/tmp/specfold_compile_cache
  export TORCHINDUCTOR_CACHE_DIR="$cache_dir/inductor" TRITON_CACHE_DIR="$cache_dir/triton"
  mkdir -p "$cache_dir"
  if [ -f "$COMPILE_CACHE" ]; then tar xzf "$COMPILE_CACHE" -C "$cache_dir"; fi
  trap 'tar czf "$OUT/compile_cache.tgz" -C "$cache_dir" .' EXIT
fi
extra=("$@")
run() { python -m bench.run "$@" "${extra[@]}" 2>&1 | tee -a "$OUT/log.txt"; }
case "$part" in
  check)          run --suite check
                  run --suite breakdown --breakdown-modes dense,specfold,specfold_no_inductor --models fast-dllm-v2-1.5b,fast-dllm-v2-7b ;;
  per_check_1.5b) run --suite per_check --models fast-dllm-v2-1.5b --budget 540 ;;
  per_check_7b)   run --suite per_check --models fast-dllm-v2-7b --budget 540 ;;
  per_check_nld)  run --suite per_check --models nld-3b --budget 540 ;;
  per_check_split) # the per_check points that split the prefix and predate the split (a run out of
                  # device time): 1.5B, prefix 2048, N = 5 and 9 (~250 s, mostly Inductor compiles)
                  run --suite per_check --models fast-dllm-v2-1.5b --prefixes 2048 --ns 5,9 --budget 540 ;;
  unfused)        # ablation: q/k/v and gate/up as separate GEMMs (the models fuse them by default), prefix 512,
                  # one shape per call or two side by side: bash bench/gpu_session.sh unfused --models NAME
                  run --suite per_check --prefixes 512 --ns 1,5,13,17,33 --ratios 0.1,0.25 --no-fuse-projections --budget 540 ;;
  fold_head)      # options["fold_head"]=True (folded rows take their origin's logits; lossy, off by default), prefix
                  # 512, one shape per call or two side by side: bash bench/gpu_session.sh fold_head --models NAME
                  run --suite per_check --prefixes 512 --ns 9,17,33 --ratios 0.1,0.25 --fold-head --no-inductor --budget 300 ;;
  writes)         # block-write latency, eager and Inductor (~90 s a model, the compile); merge into per_check.json
                  run --suite writes --budget 540 ;;
  memory)         run --suite memory ;;
  breakdown)      # where one forward's kernel time goes at the current defaults: N = 1 and 17, dense eager,
                  # dense under Inductor, SpecFold
                  run --suite breakdown --breakdown-modes dense,dense_compiled,specfold --ns 1,17 --models fast-dllm-v2-1.5b ;;
  launched)       # CUDA-graph and launched latency (plain calls each waited for, as generate runs them;
                  # SpecFold's launched calls run the plain graph unless ARGS add --fold-launched)
                  # at the decode loop's share of logits (59-62%), every N it decodes with, and the block writes: the
                  # table bench.project replays both ways (~7 min a shape): bash bench/gpu_session.sh launched --models NAME
                  run --suite per_check --prefixes 512 --ns 1,5,9,13,17 --ratios 0.1,0.25,0.5,0.6 --logit-fraction 0.6 \
                    --budget 330
                  run --suite writes --prefixes 512 --budget 150 ;;
  launch)         # where a launched call's host time goes (dense under Inductor and SpecFold, N = 1 and 17, ~3 min a shape)
                  run --suite launch --logit-fraction 0.6 ;;
  decode_loop)    # generate() with CUDA-graph verification calls against launched ones: the trained model's
                  # task suite (~2.5 min) or one decode step's call at real shapes (~3.5 min a shape):
                  # bash bench/gpu_session.sh decode_loop --decode-parts trained --limit 20 --repeats 3
                  # bash bench/gpu_session.sh decode_loop --decode-parts shape --models fast-dllm-v2-1.5b,fast-dllm-v2-7b
                  # block writes, dynamic cache vs static in place, launched vs replayed (~1.5 min a shape):
                  # bash bench/gpu_session.sh decode_loop --decode-parts writes --models fast-dllm-v2-1.5b,fast-dllm-v2-7b,nld-3b
                  # attention windows vs the whole capacity of a 4096-key cache (~3 min a shape):
                  # bash bench/gpu_session.sh decode_loop --decode-parts windows --models fast-dllm-v2-1.5b
                  run --suite decode_loop --draft-budget 16 ;;
  end_to_end)     run --suite end_to_end --limit 20 --draft-budget 16 --latencies bench/results/h200/per_check.json --budget 300 ;;
  kernels)        for k in gate attention; do
                    python bench/kernels/bench_$k.py --out "$OUT/bench_$k.json" 2>&1 | tail -n 3 | tee -a "$OUT/log.txt"
                  done
                  python bench/kernels/check_all.py --out "$OUT/check_all.json" 2>&1 | tail -n 5 | tee -a "$OUT/log.txt" ;;
  gate)           # the fold gate: its launches timed alone (bench_gate; --flag-sweep: the flag launch's configs),
                  # then whole folded calls with them one way or another (bench.gate_calls, one process a model;
                  # GATE_MODELS, default the 1.5B shape: ~4 min with the kernels on an H100)
                  python -m bench.kernels.bench_gate --ns 5,9,17,33 --out "$OUT/bench_gate.json" 2>&1 | tail -n 4 | tee -a "$OUT/log.txt"
                  python -m bench.kernels.bench_gate --flag-sweep --ns 17,33 --out "$OUT/bench_gate_flag_sweep.json" 2>&1 \
                    | grep "^flag_sweep" | tee -a "$OUT/log.txt"
                  for m in ${GATE_MODELS:-fast-dllm-v2-1.5b}; do
                    python -m bench.gate_calls --models "$m" --out "$OUT/gate_calls_$m.json" 2>&1 | tail -n 12 | tee -a "$OUT/log.txt"
                  done ;;
  attention_sweep) # the prefix kernel over a grid of tile configs against its default and the earlier default's
                  # (~400 timings a model, ~4 min; one model per call or per GPU: --models fastdllm-1.5b)
                  python bench/kernels/bench_attention.py --sweep --ns 1,5,17,33 --out "$OUT/bench_attention_sweep.json" \
                    "${extra[@]}" 2>&1 | grep --line-buffered "^best" | tee -a "$OUT/log.txt" ;;
  split_sweep)    # the prefix split count: prefix + block kernels at every S of SPLIT_CHOICES, all rows and 19% computed,
                  # against prefix_splits' pick (~6 min, both shapes)
                  python bench/kernels/bench_attention.py --split-sweep --prefixes 1024,2048,4096 --ns 1,5,9,17,33 \
                    --out "$OUT/bench_attention_split_sweep.json" "${extra[@]}" 2>&1 | grep --line-buffered "^split" \
                    | tee -a "$OUT/log.txt" ;;
  per_check_2048) # what the split count does to a forward: prefix 2048 only, no dense Inductor (~2 min a shape;
                  # bash bench/gpu_session.sh per_check_2048 --models NAME)
                  run --suite per_check --prefixes 2048 --ns 1,5,9,17,33 --ratios 0.1,0.25,0.5 --no-inductor --budget 280 ;;
  one_pass_sweep) # one-pass attention against the two kernels at 24 tile configs, both shapes (~5 min)
                  python bench/kernels/bench_attention.py --one-pass-sweep --prefixes 512,1024 --ns 1,5,9,17,33 \
                    --out "$OUT/bench_attention_one_pass_sweep.json" "${extra[@]}" 2>&1 \
                    | { grep --line-buffered "^one_pass" || true; } | tee -a "$OUT/log.txt" ;;
  one_pass)       # per_check with one-pass attention on (the default) and off, prefix 512, N = 1, 5, 9 (~3 min a
                  # shape): bash bench/gpu_session.sh one_pass --models NAME
                  for v in 1024 -1; do
                    OUT="$OUT/max_prefix_$v" python -m bench.run --suite per_check --prefixes 512 --ns 1,5,9 \
                      --ratios 0.25 --no-inductor --one-pass-max-prefix $v --budget 150 "${extra[@]}" 2>&1 | tee -a "$OUT/log.txt"
                    rm -f "$OUT/max_prefix_$v/per_check.png"
                  done ;;
  kernels_linear) for m in fastdllm-7b fastdllm-1.5b; do  # ~200 s a model (autotuning + 4 timings a point)
                    python bench/kernels/bench_packed_linear.py --models $m --out "$OUT/bench_packed_linear_$m.json" \
                      2>&1 | grep "layer=all" | tee -a "$OUT/log.txt"
                  done ;;
  gate_flags)     # options["gate_flags"]="graph" against the default: where the gate's time goes, and latency
                  run --suite breakdown --breakdown-modes dense,specfold,specfold_graph_flags --models fast-dllm-v2-1.5b
                  run --suite per_check --models fast-dllm-v2-1.5b --ns 5,17,33 --prefixes 512 --no-inductor \
                    --specfold-graph-flags --ratios 0.25 --budget 240 ;;
  min_spill)      # options["min_spill_us"]=2 (no spill launch where cuBLAS on every row is estimated to cost
                  # < 2 us more) against the default 0, per check at 1.5B / 7B (~7 min); the tiny model end to
                  # end with it: the end_to_end part with --min-spill-us 2 (on the other GPU of an x2 machine)
                  for m in fast-dllm-v2-1.5b fast-dllm-v2-7b; do for us in 0 2; do
                    OUT="$OUT/${m}_us$us" python -m bench.run --suite per_check --models $m --prefixes 512 \
                      --ns 5,9,17,33 --no-inductor --min-spill-us $us --budget 150 "${extra[@]}" 2>&1 | tee -a "$OUT/log.txt"
                    rm -f "$OUT/${m}_us$us/per_check.png"
                  done; done ;;
  dense_fraction) # options["dense_fraction"] 0.2 (a 128-row cuBLAS head up to N = 17, 256 at N = 33) against the
                  # default 0.45 (256 / 512 rows), prefix 512, folded calls, back to back (~5-6 min a shape;
                  # --budget 120 stops 7B and NLD-3B at 0.45 before N = 33):
                  # bash bench/gpu_session.sh dense_fraction --models NAME
                  for f in 0.45 0.2; do
                    OUT="$OUT/frac_$f" python -m bench.run --suite per_check --prefixes 512 --ns 9,13,17,33 \
                      --ratios 0.1,0.25,0.3,0.5 --no-inductor --dense-fraction $f --budget 180 "${extra[@]}" 2>&1 \
                      | tee -a "$OUT/log.txt"
                    rm -f "$OUT/frac_$f/per_check.png"
                  done ;;
  logit_positions) # per_check at prefix 512 with every position's logits and with half of them (--logit-fraction
                  # 0.5; the decode loop asks for the masked positions' only, 59-62% of a multi-branch call's rows),
                  # back to back, every mode (~4-5 min a variant): bash bench/gpu_session.sh
                  # logit_positions --models NAME [--ratios ...]
                  for f in all 0.5; do
                    flag=(); [ "$f" = all ] || flag=(--logit-fraction "$f")
                    OUT="$OUT/logits_$f" python -m bench.run --suite per_check --prefixes 512 --budget 255 \
                      "${flag[@]}" "${extra[@]}" 2>&1 | tee -a "$OUT/log.txt"
                    rm -f "$OUT/logits_$f/per_check.png"
                  done ;;
  batched)        # the serving engine trace-driven (bench/batched.py, docs/serving.md): the record on the CPU, then
                  # each shape at concurrency 1, 4, 16, 64: vanilla, Spiffy (eager and Inductor) and SpecFold on the
                  # ragged attention path, 2 timed runs a point, at 7B 4096 positions a slot (~2-3 min a shape); ARGS go to
                  # the replays (e.g. --cuda-graphs on: the engine's passes from CUDA graphs, ~45 s a mode at 1.5B and
                  # ~75 s at 7B); one shape per call: BATCHED_MODELS=fast-dllm-v2-7b bash ... batched; other modes:
                  # BATCHED_MODES=specfold,specfold_compiled ... batched --cuda-graphs on --fold-capacity 0.5,record
                  [ -f "$OUT/batched_trace.pt" ] || python -m bench.batched record --out "$OUT/batched_trace.pt" 2>&1 \
                    | tee -a "$OUT/log.txt"
                  for m in ${BATCHED_MODELS:-fast-dllm-v2-1.5b fast-dllm-v2-7b}; do
                    pool=(); [ "$m" = fast-dllm-v2-7b ] && pool=(--pool-tokens 4096)
                    python -m bench.batched replay --trace "$OUT/batched_trace.pt" --device cuda --models "$m" \
                      --attention ragged --modes "${BATCHED_MODES:-vanilla,spiffy,spiffy_compiled,specfold}" --repeats 2 "${pool[@]}" \
                      --out "$OUT/batched_$m.json" "${extra[@]}" 2>&1 | tee -a "$OUT/log.txt"
                  done
                  python -m bench.plot "$OUT/batched.json" "$OUT"/batched_fast-dllm-v2-*.json ;;
  batched_loop)   # Engine(loop="host") against Engine(loop="device") (each step's bookkeeping as batched tensor ops on
                  # the GPU), compiled modes from CUDA graphs, trace-driven (.traces/batched_trace.pt: python -m
                  # bench.batched record --out .traces/batched_trace.pt, ~1 min on the CPU); the three modes, both loops
                  # at 1.5B took 5 min with ARGS --concurrency 1,16,64 --repeats 1 (H100, the step compiles included);
                  # one shape per call: BATCHED_MODELS=...; ARGS --loop device --eager-step: the step uncompiled
                  for m in ${BATCHED_MODELS:-fast-dllm-v2-1.5b}; do
                    pool=(); [ "$m" = fast-dllm-v2-7b ] && pool=(--pool-tokens 4096)
                    python -m bench.batched replay --trace "${BATCHED_TRACE:-.traces/batched_trace.pt}" --device cuda \
                      --models "$m" --attention ragged --cuda-graphs on --fold-capacity record --loop host,device \
                      --modes "${BATCHED_MODES:-vanilla_compiled,spiffy_compiled,specfold_compiled}" --repeats 2 \
                      "${pool[@]}" --out "$OUT/loop_$m.json" "${extra[@]}" 2>&1 | tee -a "$OUT/log.txt"
                  done ;;
  batched_rows)   # Engine(max_verify_rows=R), drafts cut under load (docs/serving.md): a record a concurrency, each
                  # made on the CPU as its replay serves it (max(16, 4 C) requests on C slots; ~2 min for the four),
                  # then Spiffy and SpecFold under Inductor from CUDA graphs, each record at its own concurrency
                  # (~1-2 min a concurrency at 7B); R: BATCHED_ROWS (16); one shape per call: BATCHED_MODELS=...;
                  # ARGS --loop host,device: Engine(loop="device") too, its calls cut to the same shares
                  rows=${BATCHED_ROWS:-16}
                  for c in 1 4 16 64; do
                    [ -f "$OUT/rows${rows}_c$c.pt" ] || python -m bench.batched record --modes spiffy,specfold \
                      --max-verify-rows "$rows" --record-slots "$c" --record-requests $(( c * 4 > 16 ? c * 4 : 16 )) \
                      --out "$OUT/rows${rows}_c$c.pt" 2>&1 | tee -a "$OUT/log.txt"
                  done
                  for m in ${BATCHED_MODELS:-fast-dllm-v2-1.5b fast-dllm-v2-7b}; do
                    pool=(); [ "$m" = fast-dllm-v2-7b ] && pool=(--pool-tokens 4096)
                    for c in 1 4 16 64; do
                      python -m bench.batched replay --trace "$OUT/rows${rows}_c$c.pt" --device cuda --models "$m" \
                        --attention ragged --cuda-graphs on --fold-capacity record --modes spiffy_compiled,specfold_compiled \
                        --concurrency "$c" --repeats 2 "${pool[@]}" --out "$OUT/rows${rows}_${m}_c$c.json" "${extra[@]}" \
                        2>&1 | tee -a "$OUT/log.txt"
                    done
                  done
                  python -m bench.plot "$OUT/batched.json" "$OUT"/rows"${rows}"_fast-dllm-v2-*.json ;;
  gate_kernel)    # the engine's replayed SpecFold gates resolved by the Triton kernel (the default) against tensor
                  # ops (--gate-kernel off), one process each, alternating twice, the default record
                  # (.traces/batched_trace.pt, as batched_loop); 1.5-2.5 min a process at 1.5B on an H100, the
                  # compiles included; one shape per call: BATCHED_MODELS=...; first one gate alone by rows,
                  # both paths, and its flags (bench_gate --serving, both shapes)
                  python -m bench.kernels.bench_gate --serving --out "$OUT/bench_gate_serving.json" 2>&1 \
                    | grep "^model=" | tee -a "$OUT/log.txt"
                  for m in ${BATCHED_MODELS:-fast-dllm-v2-1.5b}; do
                    pool=(); [ "$m" = fast-dllm-v2-7b ] && pool=(--pool-tokens 4096)
                    for r in 1 2; do for gk in off auto; do
                      python -m bench.batched replay --trace "${BATCHED_TRACE:-.traces/batched_trace.pt}" --device cuda \
                        --models "$m" --attention ragged --cuda-graphs on --fold-capacity record --gate-kernel $gk \
                        --modes specfold_compiled --concurrency 1,4,16,64 --repeats 3 "${pool[@]}" \
                        --out "$OUT/gate_kernel_${m}_${gk}_$r.json" "${extra[@]}" 2>&1 | tee -a "$OUT/log.txt"
                    done; done
                  done ;;
  baseline_ab)    # the engine's replayed SpecFold under Inductor from this tree against a baseline package tree, one
                  # process each, alternating twice (as gate_kernel): BASELINE=DIR holds the baseline's package, made
                  # on the CPU with git archive REV specfold_compile | tar -x -C DIR (an ignored folder carried to the
                  # GPU machine, e.g. .traces/baseline); first the compiled engine's captured graphs against its
                  # launched passes (graphs_check --only compiled); one shape per call: BATCHED_MODELS=...;
                  # BATCHED_CONCURRENCY (1,4,16); ~1.5 min a process at 1.5B on an H100 with warm compiles
                  base=${BASELINE:?BASELINE=DIR: a folder holding the baseline package specfold_compile/}
                  [ -d "$base/specfold_compile" ] || { echo "BASELINE=$base: no specfold_compile/ in it" >&2; exit 2; }
                  ln -sfn "$PWD/bench" "$base/bench"  # the baseline runs this tree's benchmark
                  python bench/graphs_check.py --device cuda --only compiled 2>&1 | tail -n 8 | tee -a "$OUT/log.txt"
                  trace=$(realpath "${BATCHED_TRACE:-.traces/batched_trace.pt}") out=$(realpath "$OUT")
                  for m in ${BATCHED_MODELS:-fast-dllm-v2-1.5b}; do
                    pool=(); [ "$m" = fast-dllm-v2-7b ] && pool=(--pool-tokens 4096)
                    for r in 1 2; do for tree in . "$base"; do
                      tag=$([ "$tree" = . ] && echo tree || echo baseline)
                      (cd "$tree" && python -m bench.batched replay --trace "$trace" --device cuda --models "$m" \
                        --attention ragged --cuda-graphs on --fold-capacity record --modes specfold_compiled \
                        --concurrency "${BATCHED_CONCURRENCY:-1,4,16}" --repeats 3 "${pool[@]}" \
                        --out "$out/ab_${m}_${tag}_$r.json" "${extra[@]}") 2>&1 | tee -a "$OUT/log.txt"
                    done; done
                  done ;;
  packed_attention) # SpecFold's attention over the packed rows (--packed-attention on) against every position's (off):
                  # the kernels alone (bench_folded_ragged_attention: prefixes 512 / 2048, 1-64 requests, ratios
                  # 0.2 / 0.5), the compiled engine's graphs with it against its launched passes (graphs_check
                  # --only packed-attention), then the engine, one process each way, alternating twice, the default
                  # record; one shape per call: BATCHED_MODELS=...; BATCHED_CONCURRENCY (1,4,16)
                  python -m bench.kernels.bench_folded_ragged_attention --out "$OUT/bench_folded_ragged_attention.json" \
                    2>&1 | grep "^folded ragged" | tee -a "$OUT/log.txt"
                  python bench/graphs_check.py --device cuda --only "packed attention" 2>&1 | tail -n 8 | tee -a "$OUT/log.txt"
                  for m in ${BATCHED_MODELS:-fast-dllm-v2-1.5b}; do
                    pool=(); [ "$m" = fast-dllm-v2-7b ] && pool=(--pool-tokens 4096)
                    for r in 1 2; do for pa in off on; do
                      python -m bench.batched replay --trace "${BATCHED_TRACE:-.traces/batched_trace.pt}" --device cuda \
                        --models "$m" --attention ragged --cuda-graphs on --fold-capacity record --packed-attention $pa \
                        --modes specfold_compiled --concurrency "${BATCHED_CONCURRENCY:-1,4,16}" --repeats 3 "${pool[@]}" \
                        --out "$OUT/packed_attention_${m}_${pa}_$r.json" "${extra[@]}" 2>&1 | tee -a "$OUT/log.txt"
                    done; done
                  done ;;
  shipped)        # whole decodes of the shipped model, every mode in one process (~2.5 min on an H100): the Python
                  # loop with its prefill launched (generate(cuda_graphs=True) before prefills replayed), the Python
                  # and device loops, block boundaries fused; ARGS go to bench.end_to_end (e.g. --compile-writes)
                  modes=vanilla,spiffy_compiled_launched_prefill,specfold_launched_prefill,spiffy_compiled,specfold
                  modes+=,spiffy_compiled_device,specfold_device,spiffy_compiled_device_fused,specfold_device_fused
                  python -m bench.end_to_end --device cuda --limit 6 --repeats 3 --modes "$modes" \
                    --out "$OUT/end_to_end.json" "${extra[@]}" 2>&1 | tee -a "$OUT/log.txt" ;;
  trace_driven)   # whole decodes at the real shapes, trace-driven (.traces/trace_fused.pt: python -m bench.trace_driven
                  # record --device cpu --limit 4 --fuse-boundaries --out .traces/trace_fused.pt, ~30 s on the CPU;
                  # TRACE=... for another record); ~2.5 min at 1.5B, ~4 min at 7B on an H100; one shape per call or
                  # TRACE_MODELS=...; ARGS go to the replay (e.g. --compile-writes, --freeze-gc, --all-logits, --profile "$OUT")
                  for m in ${TRACE_MODELS:-fast-dllm-v2-1.5b}; do
                    python -m bench.trace_driven replay --trace "${TRACE:-.traces/trace_fused.pt}" --device cuda --models "$m" \
                      --repeats 3 --out "$OUT/trace_$m.json" "${extra[@]}" 2>&1 | tee -a "$OUT/log.txt"
                  done ;;
  grid)           # the README headline: the --grid record's decodes (made on this machine's CPU if .traces/trace_grid.pt
                  # is missing, ~15 s) at the three shapes, one process a shape, all four modes (~1.5 min a shape with a
                  # warm compile cache on an H200, 3-5 min cold); ARGS go to the replays (a later --modes wins, e.g.
                  # --modes spiffy_compiled,specfold --compile-writes, or --modes spiffy_compiled,specfold,specfold_heads
                  # --dense-fraction 0.2: the single head at 0.2 against the default); one shape per call: TRACE_MODELS=...
                  [ -f .traces/trace_grid.pt ] || python -m bench.trace_driven record --device cpu --limit 4 --grid \
                    --out .traces/trace_grid.pt 2>&1 | tee -a "$OUT/log.txt"
                  for m in ${TRACE_MODELS:-fast-dllm-v2-1.5b fast-dllm-v2-7b nld-3b}; do
                    python -m bench.trace_driven replay --trace .traces/trace_grid.pt --device cuda --models "$m" --repeats 3 \
                      --modes vanilla,spiffy,spiffy_compiled,specfold --out "$OUT/grid_$m.json" "${extra[@]}" 2>&1 \
                      | tee -a "$OUT/log.txt"
                  done ;;
  boundaries)     # block boundaries separate against fused (fuse_boundaries=True), Spiffy under Inductor and SpecFold,
                  # from records of the Fast-dLLM v2 prompt layout (made on this machine's CPU if missing, ~15 s each),
                  # each replayed twice, alternating, one process a replay (~6 min at 1.5B on an H100, ~9 at 7B);
                  # one shape per call: TRACE_MODELS=...; merge the runs into bench/results/<gpu>/fused_boundaries_repeat.json
                  # (their rows tagged with the run, --tag-repeat, so that the merge keeps both runs)
                  for f in sep fused; do
                    flag=(); [ $f = fused ] && flag=(--fuse-boundaries)
                    [ -f .traces/trace_$f.pt ] || python -m bench.trace_driven record --device cpu --limit 4 "${flag[@]}" \
                      --out .traces/trace_$f.pt 2>&1 | tee -a "$OUT/log.txt"
                  done
                  for m in ${TRACE_MODELS:-fast-dllm-v2-1.5b}; do for r in 1 2; do for f in sep fused; do
                    python -m bench.trace_driven replay --trace .traces/trace_$f.pt --device cuda --models "$m" --repeats 3 \
                      --modes spiffy_compiled,specfold --tag-repeat $r --out "$OUT/boundaries_${m}_${f}_$r.json" \
                      "${extra[@]}" 2>&1 | tee -a "$OUT/log.txt"
                  done; done; done ;;
  budgets)        # Spiffy under Inductor and SpecFold at draft budgets 4, 8, 12 and 16, each from a --grid record of
                  # its own (made on this machine's CPU if missing, ~15 s each), one process a record (~1.5 min each
                  # on a warm H100 at 1.5B, 3 min cold); one shape per call: TRACE_MODELS=...
                  for b in ${BUDGETS:-4 8 12 16}; do
                    [ -f .traces/trace_grid_b$b.pt ] || python -m bench.trace_driven record --device cpu --limit 4 --grid \
                      --draft-budget $b --out .traces/trace_grid_b$b.pt 2>&1 | tee -a "$OUT/log.txt"
                    for m in ${TRACE_MODELS:-fast-dllm-v2-1.5b}; do
                      python -m bench.trace_driven replay --trace .traces/trace_grid_b$b.pt --device cuda --models "$m" \
                        --repeats 3 --modes spiffy_compiled,specfold --out "$OUT/budget_${m}_b$b.json" "${extra[@]}" 2>&1 \
                        | tee -a "$OUT/log.txt"
                    done
                  done ;;
  heads)          # SpecFold with a cuBLAS head a layer (Tuning.dense_fraction as a profile, measured on a train-split
                  # record) against the single default head, trace-driven (~5 min at 7B on an H100, eager writes).
                  # The records first, on the CPU (~15 s each): python -m bench.trace_driven record --device cpu
                  # --limit 4 --fuse-boundaries [--split train] --out .traces/trace_fused[_train].pt; carry .traces
                  for m in ${TRACE_MODELS:-fast-dllm-v2-7b}; do
                    python -m bench.trace_driven replay --trace "${TRACE:-.traces/trace_fused.pt}" --device cuda --models "$m" \
                      --repeats 3 --modes spiffy_compiled,specfold,specfold_heads \
                      --heads-from "${TRAIN_TRACE:-.traces/trace_fused_train.pt}" --out "$OUT/heads_$m.json" "${extra[@]}" \
                      2>&1 | tee -a "$OUT/log.txt"
                  done ;;
  cli)            # the command line on the GPU, from the source tree: `specfold generate` on the first
                  # demo problem, Spiffy and SpecFold, tau 0 and 0.1, launched, with --cuda-graphs and with
                  # --compile-writes (SpecFold); per run its rc, the md5 and first line of the text before the
                  # statistics line, the statistics; then `specfold demo --cuda-graphs` (exits 1 unless
                  # Spiffy's tokens equal vanilla's); ~4 min
                  P=$(python -c "from specfold_compile.cli import demo_prompts; print(demo_prompts()[0])")
                  echo "prompt: $P" | tee -a "$OUT/log.txt"
                  for tau in ${CLI_TAUS:-0 0.1}; do for m in ${CLI_MODES:-spiffy specfold}; do
                    for f in "" "--cuda-graphs" "--cuda-graphs --compile-writes"; do
                      [ "$m" = spiffy ] && { [ "$tau" != 0 ] || [ "$f" = "--cuda-graphs --compile-writes" ]; } && continue
                      # shellcheck disable=SC2086
                      python -m specfold_compile.cli generate --mode $m --tau $tau --prompt "$P" --max-new-tokens 96 \
                        --device cuda $f > "$OUT/gen.txt" 2> "$OUT/gen.err" && rc=0 || rc=$?
                      # stdout only: Inductor's first compile in a process warns on stderr
                      { echo "== $m tau=$tau $f rc=$rc"; sed '/^mode=/,$d' "$OUT/gen.txt" | md5sum
                        sed '/^mode=/,$d' "$OUT/gen.txt" | tr '\n' '|' | cut -c1-120; echo
                        grep -E '^mode=' "$OUT/gen.txt" || true; grep -E 'Error' "$OUT/gen.err" || true; } \
                        | tee -a "$OUT/log.txt"
                    done
                  done; done
                  rm -f "$OUT/gen.txt" "$OUT/gen.err"
                  if [ "${CLI_DEMO:-1}" = 1 ]; then  # CLI_TAUS, CLI_MODES, CLI_DEMO=0: a subset
                    python -m specfold_compile.cli demo --device cuda --cuda-graphs 2>&1 | tee -a "$OUT/log.txt"
                  fi ;;
  *) echo "unknown part: $part" >&2; exit 2 ;;
esac
