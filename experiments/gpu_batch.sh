#!/bin/bash
# Study batches on a lent GPU, within one call of a time-limited device: the packages its Python lacks installed
# from .whl/ and the corpora read from gpu_data/ (both git-ignored: benchmarks/README.md says how to make them),
# each phase stopped at the deadline, every result and log packed into $OUT/batch.tgz (no weights).
#
#   bash experiments/gpu_batch.sh SECONDS PHASE...
#     paired   multi30k_paired: residual, RK2, RK4, seeds 0-4, $PAIRED_PARALLEL at once (6)
#     upcycle  multi30k_upcycle, seeds 0-2, from this batch's residual models once seeds 0-2 of them exist
#     rest     multi30k_paired: the other four rows, seeds 0-2, $REST_PARALLEL at once (6)
# All write the batch "h200" (results/<study>/cpu_h200). A later call on the same warm machine resumes what a
# deadline stopped (runs/ is kept there); copy results/ back first, as they travel with the checkout.
set -u
T0=$(date +%s)
DEADLINE=$((T0 + $1))
shift
left() { local l=$((DEADLINE - $(date +%s))); echo $((l > 1 ? l : 1)); }  # timeout 0 would mean none
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site ODE_DATA_DIR=$PWD/gpu_data PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
mkdir -p /tmp/logs
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > /tmp/logs/nvidia.txt
(while true; do
  echo "$(date +%T) $(nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader)" >> /tmp/logs/util.log
  sleep 10
done) &
UTIL=$!
RUN="python3 -m experiments.run"
PAIRED=results/multi30k_paired/cpu_h200
for phase in "$@"; do
  case $phase in
    paired)
      timeout "$(left)" $RUN multi30k_paired --device cuda --batch h200 --seeds 0 1 2 3 4 --only residual rk2 rk4 \
        --parallel "${PAIRED_PARALLEL:-6}" --threads 2 > /tmp/logs/paired.log 2>&1 &
      JOBS+=($!) ;;
    upcycle)
      (until [ -f $PAIRED/residual-3-seed0.json ] && [ -f $PAIRED/residual-3-seed1.json ] \
          && [ -f $PAIRED/residual-3-seed2.json ]; do
         [ "$(left)" -le 1 ] && exit 0
         sleep 5
       done
       timeout "$(left)" $RUN multi30k_upcycle --device cuda --batch h200 --seeds 0 1 2 --parallel 3 --threads 1 \
         --source 'runs/experiments/multi30k_paired/cpu_h200/residual-3-seed{seed}' > /tmp/logs/upcycle.log 2>&1) &
      JOBS+=($!) ;;
    rest)
      timeout "$(left)" $RUN multi30k_paired --device cuda --batch h200 --seeds 0 1 2 \
        --only rk2_gated_authors rk2_gated_tableau residual_x2 residual_x4 \
        --parallel "${REST_PARALLEL:-6}" --threads 2 > /tmp/logs/rest.log 2>&1 &
      JOBS+=($!) ;;
    *) echo "unknown phase $phase: paired, upcycle or rest" >&2; exit 2 ;;
  esac
done
for job in "${JOBS[@]}"; do wait "$job"; done
kill $UTIL
pkill -f -- "--output_dir $PWD/runs/"  # this checkout's runs that the deadline cut short, and no one else's
echo "elapsed $(($(date +%s) - T0)) s"
tail -n 3 /tmp/logs/*.log
find runs -name "*.log" | tar czf "$OUT/batch.tgz" -T - results/multi30k_paired/cpu_h200 results/multi30k_upcycle /tmp/logs 2>/dev/null
ls -la "$OUT"
