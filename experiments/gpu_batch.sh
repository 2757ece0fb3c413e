#!/bin/bash
# Study batches on a lent GPU, within one call of a time-limited device: the packages its Python lacks installed
# from .whl/ and the corpora read from gpu_data/ (both git-ignored: benchmarks/README.md says how to make them),
# each phase stopped at the deadline, every result and log packed into $OUT/batch.tgz (no weights).
#
#   bash experiments/gpu_batch.sh SECONDS PHASE...
#     paired   multi30k_paired: residual, RK2, RK4, seeds 0-4, $PAIRED_PARALLEL at once (6)
#     upcycle  multi30k_upcycle, seeds 0-2, from this batch's residual models once seeds 0-2 of them exist
#     rest     multi30k_paired: the other four rows, seeds 0-2, $REST_PARALLEL at once (6)
# Phases run at the same time. All write the batch $BATCH (default h200: results/<study>/cpu_h200); name the card.
# A later call on the same warm machine resumes what a deadline stopped (runs/ is kept there, with the models the
# upcycle phase starts from); copy results/ back first, as they travel with the checkout.
set -u
usage="usage: bash experiments/gpu_batch.sh SECONDS paired|upcycle|rest ... (see its header)"
[[ $# -ge 2 && $1 =~ ^[0-9]+$ ]] || { echo "$usage" >&2; exit 2; }
for phase in "${@:2}"; do
  [[ $phase =~ ^(paired|upcycle|rest)$ ]] || { echo "unknown phase $phase; $usage" >&2; exit 2; }
done
: "${OUT:?the device tool sets OUT, the folder whose files come back}"
BATCH=${BATCH:-h200}
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
trap 'kill $UTIL 2>/dev/null' EXIT
# timeout signals its whole process group, so a run that the deadline cuts short stops with its ode_transformer.train.run
RUN="python3 -m experiments.run"
PAIRED=results/multi30k_paired/cpu_$BATCH
JOBS=()
for phase in "$@"; do
  case $phase in
    paired)
      timeout "$(left)" $RUN multi30k_paired --device cuda --batch $BATCH --seeds 0 1 2 3 4 --only residual rk2 rk4 \
        --parallel "${PAIRED_PARALLEL:-6}" --threads 2 > /tmp/logs/paired.log 2>&1 &
      JOBS+=($!) ;;
    upcycle)
      (until [ -f $PAIRED/residual-3-seed0.json ] && [ -f $PAIRED/residual-3-seed1.json ] \
          && [ -f $PAIRED/residual-3-seed2.json ]; do
         [ "$(left)" -le 1 ] && exit 0
         sleep 5
       done
       timeout "$(left)" $RUN multi30k_upcycle --device cuda --batch $BATCH --seeds 0 1 2 --parallel 3 --threads 1 \
         --source "runs/experiments/multi30k_paired/cpu_$BATCH/residual-3-seed{seed}" > /tmp/logs/upcycle.log 2>&1) &
      JOBS+=($!) ;;
    rest)
      timeout "$(left)" $RUN multi30k_paired --device cuda --batch $BATCH --seeds 0 1 2 \
        --only rk2_gated_authors rk2_gated_tableau residual_x2 residual_x4 \
        --parallel "${REST_PARALLEL:-6}" --threads 2 > /tmp/logs/rest.log 2>&1 &
      JOBS+=($!) ;;
  esac
done
for job in "${JOBS[@]}"; do wait "$job"; echo "phase job $job: exit $? (124: the deadline)"; done
echo "elapsed $(($(date +%s) - T0)) s"
tail -n 3 /tmp/logs/*.log
find runs -name "*.log" | tar czf "$OUT/batch.tgz" -T - "results/multi30k_paired/cpu_$BATCH" "results/multi30k_upcycle/cpu_$BATCH" /tmp/logs 2>/dev/null
ls -la "$OUT"
