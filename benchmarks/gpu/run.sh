#!/usr/bin/env bash
# fedx on one GPU machine in one sitting of at most ~9.5 minutes: install what the machine lacks
# (.gpu/, made by prepare.sh), then run the steps of STEPS in order, each within what is left of
# DEADLINE seconds, and leave their logs under $OUT. Run from the checkout's root:
#   OUT=/tmp/out bash benchmarks/gpu/run.sh
# Steps (default: install checks suite round timeline configs); steps joined by "+" run at the
# same time (e.g. "suite+configs"), each under its own cap; a group ends when all of its steps have:
#   install  : carried wheels into /tmp/site, Flower's and fedx's commands next to the interpreter
#   checks   : tests/system/test_gpu_promises.py's system tests, in one process: two deterministic runs of
#              one seed give the same metrics.json and model.pt; model.pt loads where no GPU is
#   suite    : the tests that train on the GPU (SUITE=all: the whole suite) with pytest-xdist
#              (SUITE_WORKERS workers, default 8; SUITE_CAP seconds, default 240)
#   round    : benchmarks/gpu_round.py, issue 25's round (ROUND_ARGS adds options: e.g.
#              "--variants sim sim-groups group device": 10 actors against client groups)
#   peak     : benchmarks/gpu_configs.py on VGG-16 alone (PEAK_ARGS), for the card's peak memory
#              with nothing else on it: run it outside a "+" group
#   timeline : benchmarks/message_timeline.py: real processes, warm executor, CUDA per task
#   configs  : benchmarks/gpu_configs.py with what time is left (CONFIG_ARGS: which files, e.g.
#              "--shard 2/4"; default: the six dataset x model families' IID files, FedMR only)
#   mps      : gpu_round.py's simulations (actors, and client groups) with NVIDIA's MPS daemon
#              running (MPS_ARGS; default "--variants sim sim-groups")
# Elsewhere (a CPU machine, for a dry run; SCALE multiplies every step's cap):
#   INSTALL=0 QUICK=1 SCALE=10 DEADLINE=3000 STEPS="checks round" OUT=/tmp/out bash benchmarks/gpu/run.sh
set -u
S=$(date +%s)
DEADLINE=${DEADLINE:-560}
STEPS=${STEPS:-install checks suite round timeline configs}
OUT=${OUT:?set OUT to a folder for the logs}
mkdir -p "$OUT"
quick=${QUICK:+--quick}
stamp() { echo "== $(( $(date +%s) - S )) s: $*"; }
left() { echo $(( DEADLINE - ($(date +%s) - S) )); }
# Seconds a step may take: its own cap, or what is left but a margin, whichever is less.
budget() {
  local l cap=$(( $1 * ${SCALE:-1} )); l=$(( $(left) - 15 ))
  [ "$l" -lt "$cap" ] && echo "$l" || echo "$cap"
}
run_step() {  # name cap command...: run it under its budget, log to $OUT/name.log, show the tail
  local name=$1 cap=$2; shift 2
  local b; b=$(budget "$cap")
  if [ "$b" -lt 20 ]; then stamp "$name skipped: ${b}s left"; return; fi
  stamp "$name (up to ${b}s)"
  timeout --kill-after=10 "$b" "$@" > "$OUT/$name.log" 2>&1
  echo "rc $?"; tail -n "${TAIL:-30}" "$OUT/$name.log"
}
export PYTHONUNBUFFERED=1 FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1
export FEDX_CACHE_DIR=${FEDX_CACHE_DIR:-/tmp/fedx-cache} FLWR_HOME=${FLWR_HOME:-/tmp/flwr-home}
py=${PYTHON:-python3}
site=${SITE:-/tmp/site}
if [ "${INSTALL:-1}" = 1 ] && [[ " $STEPS " == *" install "* ]]; then
  stamp "install"
  mkdir -p "$site"
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$site" "${WHEELS:-.gpu}"/*.whl || exit 1
  tar -C "$site" -xJf "${WHEELS:-.gpu}"/ray-*-stripped.tar.xz || exit 1
  export PYTHONPATH=$(pwd):$site${PYTHONPATH:+:$PYTHONPATH}
  # fedx starts Flower's and its own commands from its interpreter's folder: Flower's from the
  # wheels, fedx's as pyproject.toml's [project.scripts] name them (fedx is not installed here).
  python_path=$("$py" -c 'import sys; print(sys.executable)')
  bin=$(dirname "$python_path")
  for f in "$site"/bin/*; do ln -sf "$f" "$bin/"; done
  "$py" -c 'import sys, tomllib
for name, target in tomllib.load(open("pyproject.toml", "rb"))["project"]["scripts"].items():
    print(name, target)' | while read -r name target; do
    printf '#!%s\nimport sys\nfrom %s import %s\nsys.exit(%s())\n' \
      "$python_path" "${target%%:*}" "${target#*:}" "${target#*:}" > "$bin/$name"
    chmod +x "$bin/$name"
  done
  # Ray is unpacked, not pip-installed: its `ray` command (the Ray cluster tests start nodes).
  printf '#!%s\nimport sys\nfrom ray.scripts.scripts import main\nsys.exit(main())\n' \
    "$python_path" > "$bin/ray"
  chmod +x "$bin/ray"
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null
"$py" -c "import torch, flwr, ray; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'flwr', flwr.__version__, 'ray', ray.__version__)" || exit 1
git rev-parse --short HEAD 2>/dev/null
( while sleep 2; do nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader; done > "$OUT/smi.csv" 2>&1 ) &
smi=$!
trap 'kill $smi 2>/dev/null' EXIT
# CIFAR-shaped data once for every step (DATA_ROOT: real or earlier CIFAR files instead).
data=${DATA_ROOT:-/tmp/fedx-data}
if [ -z "${DATA_ROOT:-}" ] && [[ " ${STEPS//+/ } " =~ " "(round|peak|configs|mps)" " ]]; then
  sizes=${QUICK:+400 100}
  for name in cifar10 cifar100; do
    "$py" benchmarks/fake_cifar.py "$data" $name ${sizes:-50000 10000} > /dev/null || exit 1
  done
  stamp "CIFAR-10- and CIFAR-100-shaped data in $data"
fi
GPU_TESTS="tests/unit/test_gpu_promises.py tests/system/test_gpu_promises.py tests/unit/test_device_data.py tests/unit/test_training.py
  tests/unit/test_client_reuse.py tests/unit/test_server_app.py tests/unit/test_fedme_client.py tests/unit/test_mutual.py
  tests/unit/test_server_resume.py tests/unit/test_divergence.py tests/unit/test_checkpoint_damage.py
  tests/unit/test_leaf.py tests/unit/test_building.py tests/unit/test_cold_start.py tests/unit/test_message_timeline.py"
FAMILIES="configs/cifar10-cnn-iid.toml configs/cifar10-resnet20-iid.toml configs/cifar10-vgg16-iid.toml
  configs/cifar100-cnn-iid.toml configs/cifar100-resnet20-iid.toml configs/cifar100-vgg16-iid.toml"
workers=$("$py" -c 'import xdist' 2>/dev/null && echo "-n ${SUITE_WORKERS:-8}" || echo "-p no:xdist")
one_step() {
  case $1 in
  install) ;;
  checks) run_step checks 150 "$py" -m pytest -o addopts= -v -rfE -p no:cacheprovider -m system \
    tests/system/test_gpu_promises.py ;;
  suite)
    if [ "${SUITE:-gpu}" = all ]; then tests=""; else tests=$GPU_TESTS; fi
    # -v: each test's outcome is in the log as it ends, also when the cap stops the run.
    run_step suite "${SUITE_CAP:-240}" "$py" -m pytest -v -rfE $workers -p no:cacheprovider $tests ;;
  round) run_step round 200 "$py" benchmarks/gpu_round.py $quick --data-root "$data" ${ROUND_ARGS:-} ;;
  peak)
    run_step peak 120 "$py" benchmarks/gpu_configs.py $quick --data-root "$data" \
      ${PEAK_ARGS:---files configs/cifar10-vgg16-iid.toml --methods fedmr --local-epochs 1} ;;
  timeline) run_step timeline 120 "$py" benchmarks/message_timeline.py --rounds 4 ;;
  configs)
    b=$(budget 900)
    run_step configs 900 "$py" benchmarks/gpu_configs.py $quick --budget $(( b - 60 )) --data-root "$data" \
      ${CONFIG_ARGS:---files $FAMILIES --methods fedmr} ;;
  mps)
    export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
    mkdir -p /tmp/mps-pipe /tmp/mps-log
    if nvidia-cuda-mps-control -d; then
      stamp "MPS started"
      run_step mps 240 "$py" benchmarks/gpu_round.py $quick --data-root "$data" \
        ${MPS_ARGS:---variants sim sim-groups}
      echo quit | nvidia-cuda-mps-control
    else
      stamp "MPS not available (nvidia-cuda-mps-control)"
    fi ;;
  *) stamp "unknown step $1" ;;
  esac
}
for group in $STEPS; do
  if [[ $group == *+* ]]; then
    pids=()
    for step in ${group//+/ }; do one_step "$step" & pids+=($!); done
    wait "${pids[@]}"  # not the nvidia-smi sampler's
  else
    one_step "$group"
  fi
done
stamp "done"
