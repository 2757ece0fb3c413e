#!/bin/bash
# Study batches on a lent GPU, within one call of a time-limited device: the packages its Python lacks installed
# from .whl/ and the corpora read from gpu_data/ (both git-ignored, so the call must carry them; see below), each
# phase stopped at its deadline, every result and log packed into $OUT/batch.tgz (no weights) after each step.
#
#   bash experiments/gpu_batch.sh [--dry-run] SECONDS STEP...
#
# A STEP is a PHASE, PHASE:SECONDS (the phase stops after that many seconds, or at the call's SECONDS, whichever
# comes first), or phases joined by + (they run at the same time). The steps run one after another, in the order
# given. Issue 54's three batches, in its order (docs/templates/results.md, "GPU batches of issue 54"):
#   ptb      (a) ptb_paper residual and RK4, seeds 0-2 ($PTB_PARALLEL at once, 6): the rows issue 54 asks three
#            seeds of at least
#   ptbrest  (a) ptb_paper RK2, RK2 gamma = 1 and RK2-gated, seeds 0-2 ($PTB_REST_PARALLEL at once, 9); the same batch
#            as ptb's, results/ptb_paper/cpu_$BATCH (`ptb ptbrest`: residual and RK4 first; `ptb+ptbrest`: all 15
#            at once, which ends sooner in all but finishes no row early)
#   power    (b) multi30k_paired residual, RK2, RK4, seeds 0 to $POWER_SEEDS - 1 (19: the power analysis), a batch of
#            its own ($POWER_PARALLEL at once, 12); results/multi30k_paired/cpu_${BATCH}power
#   depth    (c) tatoeba_depth, residual encoders of 3, 6 and 12 layers, seeds 0-2 (9 at once)
#   depthrk  (c, later) tatoeba_depth RK2 and RK4 at 3 layers, seeds 0-2 (6 at once), only where experiments.depth_gate
#            finds a deeper residual row ahead beyond noise in this batch ($DEPTH_RK=always: regardless); a step after
#            depth's (never depth+depthrk); results/tatoeba_depth/cpu_$BATCH for both
# and the batch of 2026-11-26 (which ran as `545 paired+upcycle`, then `REST_PARALLEL=12 ... 285 rest`):
#   paired   multi30k_paired: residual, RK2, RK4, seeds 0-4, $PAIRED_PARALLEL at once (6)
#   upcycle  multi30k_upcycle, seeds 0-2, from this batch's residual models once seeds 0-2 of them exist
#   rest     multi30k_paired: the other four rows, seeds 0-2, $REST_PARALLEL at once (6)
# e.g. `bash experiments/gpu_batch.sh 570 ptb ptbrest power depth depthrk` on a call with timeout_s 600, the same
# command again on the next call (finished runs are skipped); --dry-run prints the plan, checks the batches and the
# carried folders, and needs no GPU.
#
# One batch is one commit, one device and one precision: $BATCH names the card (default: read from nvidia-smi,
# h100 or h200; h200 in a dry run), a phase whose batch folder already holds runs of another commit or device is
# refused, and each study's flags fix its precision on a device (ptb_paper bf16; multi30k_paired and tatoeba_depth
# --precision auto, bf16 on an H100 or H200). So commit nothing between two calls that continue one batch: commit
# its results once it is complete.
# A later call on the same warm machine resumes what a deadline stopped (runs/ is kept there, with the models the
# upcycle phase starts from, and each run resumes from its last checkpoint); copy results/ back first, as they
# travel with the checkout.
#
# What the call carries (git-ignored, so only where named in the device tool's `carry`: [".whl", "gpu_data"]):
#   .whl/      the wheels of benchmarks/README.md
#   gpu_data/  the phases' corpora (ptb, ptbrest: ptb; power, paired, rest, upcycle: multi30k; depth(rk): tatoeba_de_en;
#              11 MB in all; ../shared does not travel, and the whole of it is over the carry's 64 MiB):
#              mkdir -p gpu_data && cp -r ../shared/data/{ptb,multi30k,tatoeba_de_en} gpu_data/
set -u
usage="usage: bash experiments/gpu_batch.sh [--dry-run] SECONDS PHASE[:SECONDS][+PHASE[:SECONDS]]... (see its header)"
DRY=0
[[ ${1:-} == --dry-run ]] && { DRY=1; shift; }
[[ $# -ge 2 && $1 =~ ^[0-9]+$ ]] || { echo "$usage" >&2; exit 2; }
for step in "${@:2}"; do
  [[ $step != *+ ]] || { echo "bad step $step; $usage" >&2; exit 2; }
  [[ +$step+ =~ \+depth(:[0-9]+)?\+ && +$step+ =~ \+depthrk(:[0-9]+)?\+ ]] \
    && { echo "$step: depthrk reads depth's results, so it is a later step: depth depthrk" >&2; exit 2; }
  IFS=+ read -ra members <<< "$step"
  for member in "${members[@]}"; do
    [[ $member =~ ^(ptb|ptbrest|power|depth|depthrk|paired|upcycle|rest)(:[0-9]+)?$ ]] \
      || { echo "unknown phase $member; $usage" >&2; exit 2; }
  done
done
PYTHON=${PYTHON:-python3}  # reads the batch folders (any Python 3)
if [[ $DRY == 1 ]]; then
  GPU_NAME=""
  BATCH=${BATCH:-h200}
else
  : "${OUT:?the device tool sets OUT, the folder whose files come back}"
  GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
  card=$(grep -oiE '\b[A-Z]+[0-9]+[A-Z]*\b' <<< "$GPU_NAME" | head -n 1 | tr 'A-Z' 'a-z')  # NVIDIA H200: h200
  BATCH=${BATCH:-${card:-gpu}}
fi
[[ $BATCH =~ ^[A-Za-z0-9]+$ ]] || { echo "BATCH=$BATCH: letters and digits only, e.g. h200" >&2; exit 2; }
POWER_SEEDS=${POWER_SEEDS:-19}
[[ $POWER_SEEDS =~ ^[0-9]+$ && $POWER_SEEDS -ge 16 ]] || { echo "POWER_SEEDS=$POWER_SEEDS: 16 or more" >&2; exit 2; }
T0=$(date +%s)
DEADLINE=$((T0 + $1))
shift
left() { local l=$(($1 - $(date +%s))); echo $((l > 1 ? l : 1)); }  # seconds to the deadline $1 (timeout 0: none)
# timeout signals its whole process group, so a run that the deadline cuts short stops with its
# ode_transformer.train.run
RUN="python3 -m experiments.run"
HEAD=$(git rev-parse HEAD 2>/dev/null || true)
DIRTY=$(git status --porcelain --untracked-files=no 2>/dev/null | head -n 3 | tr '\n' ' ')

folder() {  # the batch folder a phase writes
  case $1 in
    ptb | ptbrest) echo "results/ptb_paper/cpu_$BATCH" ;;
    power) echo "results/multi30k_paired/cpu_${BATCH}power" ;;
    depth | depthrk) echo "results/tatoeba_depth/cpu_$BATCH" ;;
    paired | rest) echo "results/multi30k_paired/cpu_$BATCH" ;;
    upcycle) echo "results/multi30k_upcycle/cpu_$BATCH" ;;
  esac
}

corpus() {  # the folder under gpu_data/ a phase reads
  case $1 in
    ptb | ptbrest) echo ptb ;;
    depth | depthrk) echo tatoeba_de_en ;;
    *) echo multi30k ;;
  esac
}

commands() {  # the experiments.run arguments of a phase's call
  local seeds
  case $1 in
    ptb)
      echo "ptb_paper --device cuda --batch $BATCH --seeds 0 1 2 --only residual rk4 --parallel ${PTB_PARALLEL:-6} --threads 2" ;;
    ptbrest)
      echo "ptb_paper --device cuda --batch $BATCH --seeds 0 1 2 --only rk2 rk2_ones rk2_gated --parallel ${PTB_REST_PARALLEL:-9} --threads 1" ;;
    power)
      seeds=$(seq -s ' ' 0 $((POWER_SEEDS - 1)))
      echo "multi30k_paired --device cuda --batch ${BATCH}power --seeds $seeds --only residual rk2 rk4 --parallel ${POWER_PARALLEL:-12} --threads 1" ;;
    depth)
      echo "tatoeba_depth --device cuda --batch $BATCH --seeds 0 1 2 --only residual residual_x2 residual_x4 --parallel 9 --threads 1" ;;
    depthrk)
      echo "tatoeba_depth --device cuda --batch $BATCH --seeds 0 1 2 --only rk2 rk4 --parallel 6 --threads 2" ;;
    paired)
      echo "multi30k_paired --device cuda --batch $BATCH --seeds 0 1 2 3 4 --only residual rk2 rk4 --parallel ${PAIRED_PARALLEL:-6} --threads 2" ;;
    upcycle)
      echo "multi30k_upcycle --device cuda --batch $BATCH --seeds 0 1 2 --parallel 3 --threads 1 --source runs/experiments/multi30k_paired/cpu_$BATCH/residual-3-seed{seed}" ;;
    rest)
      echo "multi30k_paired --device cuda --batch $BATCH --seeds 0 1 2 --only rk2_gated_authors rk2_gated_tableau residual_x2 residual_x4 --parallel ${REST_PARALLEL:-6} --threads 2" ;;
  esac
}

one_batch() {  # why a phase may not add runs to its batch folder (runs there of another commit or device), or nothing
  [[ -z $HEAD ]] && { echo "no git checkout here: the runs would record no commit, and a batch needs one"; return; }
  "$PYTHON" - "$(folder "$1")" "$HEAD" "$GPU_NAME" <<'EOF'
import json
import pathlib
import sys

folder, head, gpu = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3]
runs = [json.loads(path.read_text()) for path in sorted(folder.glob("*-seed*.json"))]
commits = {(run.get("git") or {}).get("commit") or "none" for run in runs} - {head}
devices = {(run.get("device") or {}).get("name") or "none" for run in runs} - {gpu} if gpu else set()
why = [f"commit {', '.join(sorted(c[:7] for c in commits))}"] if commits else []
why += [f"device {', '.join(sorted(devices))}"] if devices else []
if why:
    print(f"{folder} holds runs of {' and '.join(why)}: one batch is one commit and one device; name another BATCH")
EOF
}

no_corpus() {  # the phase's corpus, where gpu_data/ lacks it
  [[ -d gpu_data/$(corpus "$1") ]] || echo "gpu_data/$(corpus "$1")"
}

if [[ $DRY == 1 ]]; then
  echo "plan: BATCH=$BATCH, commit ${HEAD:-none}, the call's deadline in $((DEADLINE - T0)) s"
  [[ -n $DIRTY ]] && echo "warning: tracked files differ from the commit ($DIRTY...): the runs would record it dirty"
  n=0
  for step in "$@"; do
    n=$((n + 1))
    echo "step $n: $step"
    IFS=+ read -ra members <<< "$step"
    for member in "${members[@]}"; do
      phase=${member%%:*}
      cap="the call's deadline"
      [[ $member == *:* ]] && cap="${member#*:} s or the call's deadline"
      echo "  phase $phase: batch $(folder "$phase"), reads gpu_data/$(corpus "$phase"), stops at $cap"
      why=$(one_batch "$phase")
      [[ -n $why ]] && echo "  REFUSED $phase: $why"
      missing=$(no_corpus "$phase")
      [[ -n $missing ]] && echo "  not here: $missing (make it, and carry gpu_data: see the header)"
      [[ $phase == depthrk ]] && echo "  only if: python3 -m experiments.depth_gate $(folder depthrk) (or DEPTH_RK=always)"
      echo "  $RUN $(commands "$phase")"
    done
  done
  exit 0
fi

# A venv over the machine's Python (its CUDA torch), the wheels, and this checkout installed editable: the tools'
# one import name, ode_transformer.train, exists only through the install (pyproject's package-dir), as after
# `make setup` here. The editable install needs a setuptools new enough for pyproject's license field (in .whl).
python3 -m venv --system-site-packages /tmp/venv || exit 1
/tmp/venv/bin/pip install -q --no-index --no-deps --no-compile --no-cache-dir .whl/*.whl || exit 1
/tmp/venv/bin/pip install -q --no-index --no-deps --no-build-isolation -e . || exit 1
export PATH=/tmp/venv/bin:$PATH ODE_DATA_DIR=$PWD/gpu_data PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
python3 -c "import ode_transformer.train.run, ode_transformer.hub.export" || exit 1
mkdir -p /tmp/logs
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > /tmp/logs/nvidia.txt
echo "BATCH=$BATCH commit=$HEAD" >> /tmp/logs/nvidia.txt
(while true; do
  echo "$(date +%T) $(nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader)" >> /tmp/logs/util.log
  sleep 10
done) &
UTIL=$!
trap 'kill $UTIL 2>/dev/null' EXIT
FOLDERS=()

pack() {
  find runs -name "*.log" 2>/dev/null | tar czf "$OUT/batch.tgz" -T - "${FOLDERS[@]}" /tmp/logs 2>/dev/null
}

start_phase() {  # starts a phase's call in the background, stopped at the phase's deadline (JOBS: its pid)
  local phase=$1 end=$2 why paired line
  why=$(one_batch "$phase")
  [[ -z $why && -n $(no_corpus "$phase") ]] && why="no $(no_corpus "$phase"): carry gpu_data (see the header)"
  if [[ -n $why ]]; then
    echo "REFUSED $phase: $why" | tee -a /tmp/logs/refused.log
    return
  fi
  FOLDERS+=("$(folder "$phase")")
  if [[ $phase == depthrk && ${DEPTH_RK:-} != always ]] \
    && ! python3 -m experiments.depth_gate "$(folder depthrk)" > /tmp/logs/depth_gate.log 2>&1; then
    echo "depthrk not run: $(tail -n 1 /tmp/logs/depth_gate.log)"
    return
  fi
  line=$(commands "$phase")
  if [[ $phase == upcycle ]]; then  # its sources: this batch's residual models of seeds 0-2
    paired=$(folder paired)
    (until [ -f "$paired/residual-3-seed0.json" ] && [ -f "$paired/residual-3-seed1.json" ] \
        && [ -f "$paired/residual-3-seed2.json" ]; do
       [ "$(left "$end")" -le 1 ] && exit 0
       sleep 5
     done
     timeout "$(left "$end")" $RUN $line > "/tmp/logs/$phase.log" 2>&1) &
  else
    timeout "$(left "$end")" $RUN $line > "/tmp/logs/$phase.log" 2>&1 &
  fi
  JOBS+=($!)
}

[[ -n $DIRTY ]] && echo "warning: tracked files differ from the commit ($DIRTY...): the runs record it dirty"
for step in "$@"; do
  IFS=+ read -ra members <<< "$step"
  JOBS=()
  for member in "${members[@]}"; do
    phase=${member%%:*}
    now=$(date +%s)
    end=$DEADLINE
    [[ $member == *:* && $((now + ${member#*:})) -lt $DEADLINE ]] && end=$((now + ${member#*:}))
    echo "$(date +%T) step $step: phase $phase until $(date -d "@$end" +%T)"
    start_phase "$phase" "$end"
  done
  for job in "${JOBS[@]}"; do wait "$job"; echo "call $job: exit $? (124: the deadline)"; done
  pack
done
echo "elapsed $(($(date +%s) - T0)) s"
tail -n 3 /tmp/logs/*.log
pack
ls -la "$OUT"
