#!/usr/bin/env bash
# Starts a whole cluster on this machine: ps tasks, workers and an evaluator
# of train_distributed.py on free localhost ports, one log file per task.
# Streams the chief's progress and the evaluator's test results, and exits 0
# only when every worker finished and the evaluator printed the final test
# accuracy. Ctrl-C or SIGTERM stops exactly the processes it started.
set -u -o pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
python=${PYTHON:-python3}

num_ps=1
num_workers=2
worker_slots=  # By default num_workers: every listed worker is started.
max_steps=400
batch_size=128
data_dir=  # By default ./cifar-10-batches-bin; with --synthetic, its own.
train_dir=  # ./models_cifar10, or ./models_cifar10_synthetic.
log_dir=./logs
replicas_to_aggregate=
num_gpus=0
async=0
synthetic=0
tensorboard=  # A port, with --tensorboard.
extra=()

usage() {
  cat <<EOF
Usage: scripts/run_local_cluster.sh [options] [-- trainer flags...]

Starts NUM_PS ps tasks, NUM_WORKERS workers and one evaluator of
train_distributed.py on free localhost ports and waits for them.

  --num_ps=N                 ps tasks (default: $num_ps)
  --num_workers=N            worker tasks; worker 0 is the chief (default: $num_workers)
  --worker_slots=N           workers listed in --worker_hosts, N >= NUM_WORKERS
                             (default: NUM_WORKERS); the slots not started
                             get ports kept free for workers started later,
                             by hand, with the command the script prints
  --max_steps=N              global steps to train (default: $max_steps)
  --batch_size=N             images per batch per worker (default: $batch_size)
  --data_dir=DIR             CIFAR-10 binary files (default:
                             ./cifar-10-batches-bin); when it has none, the
                             real CIFAR-10 is downloaded first
  --synthetic                train on a synthetic dataset instead, made if
                             missing, in a folder of its own (default data_dir
                             ./synthetic-cifar-10-batches-bin, train_dir
                             ./models_cifar10_synthetic): it never takes the
                             real data's place
  --train_dir=DIR            checkpoints and summaries (default:
                             ./models_cifar10); an existing checkpoint is
                             resumed: the script says from which step, and a
                             run already at --max_steps stops at once
  --log_dir=DIR              one log file per task (default: $log_dir); the
                             run before's are kept in DIR/previous
  --async                    asynchronous training (default: synchronous)
  --replicas_to_aggregate=N  gradients per update in synchronous training
                             (default: the number of workers)
  --num_gpus=N               GPUs on this machine; worker i sees only GPU i % N
                             through CUDA_VISIBLE_DEVICES, the ps tasks and the
                             evaluator see none (default: $num_gpus)
  --tensorboard[=PORT]       also start TensorBoard on --train_dir at
                             http://localhost:PORT (default port: 6006); it
                             stops with the rest
  -h, --help                 this help

Flags after -- go to every train_distributed.py process, e.g.
  scripts/run_local_cluster.sh --synthetic -- --fresh_start --log_frequency=50
except three that the script reads itself, in any spelling absl accepts:
--fresh_start (the script deletes --train_dir before starting anything),
--train_dir and --data_dir (the script uses them, and passes them on). A
flag the trainer does not know makes every task exit 1 at start; the script
then names it and exits 1.
EOF
}

die() {
  echo "run_local_cluster.sh: error: $*" >&2
  exit 2
}

set_option() {  # set_option NAME VALUE
  case $1 in
    num_ps|num_workers|worker_slots|max_steps|batch_size|replicas_to_aggregate|num_gpus|tensorboard)
      [[ $2 =~ ^[0-9]+$ ]] || die "--$1 must be a whole number (0, 1, 2...), got '$2'"
      printf -v "$1" '%s' "$2" ;;
    data_dir|train_dir|log_dir)
      [ -n "$2" ] || die "--$1 needs a directory"
      printf -v "$1" '%s' "$2" ;;
    *) die "unknown option --$1 (see --help)" ;;
  esac
}

while (($#)); do
  case $1 in
    -h|--help) usage; exit 0 ;;
    --async) async=1 ;;
    --synthetic) synthetic=1 ;;
    --tensorboard) tensorboard=6006 ;;
    --) shift; extra=("$@"); break ;;
    --*=*) key=${1%%=*}; set_option "${key#--}" "${1#*=}" ;;
    --*) (($# >= 2)) || die "$1 needs a value"
         set_option "${1#--}" "$2"; shift ;;
    *) die "unexpected argument '$1' (see --help)" ;;
  esac
  shift
done
# Trainer flags after -- that the script acts on itself, in every spelling
# absl accepts (-flag or --flag, =value or a separate value, --noflag; the
# last one given wins): --train_dir and --data_dir become the script's own,
# so that it checks, deletes and reports where the tasks really work, and
# --fresh_start happens here, before any task runs, rather than in the chief,
# which would race the evaluator (it could evaluate the old run's checkpoint,
# or write into the directory the chief is deleting).
fresh_start=0
trainer_flags=()
# (${a[@]+"${a[@]}"}: an empty array under set -u, on bash before 4.4 too.)
set -- ${extra[@]+"${extra[@]}"}
while (($#)); do
  flag=${1#-}; flag=${flag#-}
  case $flag in
    train_dir|data_dir)
      (($# >= 2)) || die "-- --$flag needs a value"
      set_option "$flag" "$2"; shift ;;
    train_dir=*|data_dir=*) set_option "${flag%%=*}" "${flag#*=}" ;;
    fresh_start) fresh_start=1 ;;
    nofresh_start) fresh_start=0 ;;
    fresh_start=*)
      case ${flag#*=} in
        [Tt][Rr][Uu][Ee]|[Tt]|1) fresh_start=1 ;;
        [Ff][Aa][Ll][Ss][Ee]|[Ff]|0) fresh_start=0 ;;
        *) die "-- --fresh_start=${flag#*=}: use true or false" ;;
      esac ;;
    *) trainer_flags+=("$1") ;;
  esac
  shift
done
((num_ps >= 1)) || die "--num_ps must be at least 1"
((num_workers >= 1)) || die "--num_workers must be at least 1"
: "${worker_slots:=$num_workers}"
((worker_slots >= num_workers)) ||
  die "--worker_slots=$worker_slots is fewer than --num_workers=$num_workers: list at least the workers started"
((max_steps >= 1)) || die "--max_steps must be at least 1"
((batch_size >= 1)) || die "--batch_size must be at least 1"
if ((synthetic)); then
  default_data_dir=./synthetic-cifar-10-batches-bin
  : "${train_dir:=./models_cifar10_synthetic}"
else
  default_data_dir=./cifar-10-batches-bin
  : "${train_dir:=./models_cifar10}"
fi
: "${data_dir:=$default_data_dir}"

# Data first: nothing is started until it is there. A folder given that
# does not exist is a typo more often than a wish for a new download.
if [ "$data_dir" != "$default_data_dir" ] && [ ! -e "$data_dir" ]; then
  near=$("$python" - "$data_dir" 2> /dev/null <<'EOF'
import difflib, os, sys
path = os.path.normpath(sys.argv[1])
parent = os.path.dirname(path) or '.'
names = [n for n in os.listdir(parent)
         if os.path.isdir(os.path.join(parent, n))] if os.path.isdir(
             parent) else []
close = difflib.get_close_matches(os.path.basename(path), names, 1, 0.6)
print(os.path.join(os.path.dirname(sys.argv[1].rstrip('/')), close[0])
      if close else '')
EOF
)
  die "--data_dir=$data_dir does not exist${near:+ (did you mean $near?)}: give the folder that holds the data, or make it (mkdir) to have the script fill it"
fi
if ! compgen -G "$data_dir/data_batch_*.bin" > /dev/null ||
   [ ! -f "$data_dir/test_batch.bin" ]; then
  if ((synthetic)); then
    "$python" "$root/scripts/make_synthetic_cifar10.py" --data_dir="$data_dir" ||
      die "could not make the synthetic dataset in $data_dir"
  else
    # CIFAR10_URL and CIFAR10_MD5 point it at a mirror.
    # CIFAR10_URL may also be the path of a tarball fetched elsewhere.
    # --env_names: its error lines name those, not its --url and --md5.
    "$python" "$root/scripts/download_cifar10.py" --data_dir="$data_dir" \
      --env_names ${CIFAR10_URL:+--url="$CIFAR10_URL"} ${CIFAR10_MD5:+--md5="$CIFAR10_MD5"} ||
      die "no CIFAR-10 in $data_dir (use --synthetic to train on generated data)"
  fi
fi

if ((fresh_start)); then
  echo "--fresh_start: deleting $train_dir"
  rm -rf "$train_dir" || die "cannot delete $train_dir"
fi
mkdir -p "$log_dir" || die "cannot create --log_dir=$log_dir"
log_dir=$(cd "$log_dir" && pwd)
# The run before's logs are kept, in previous/ (the one before that's go).
kept=""
if compgen -G "$log_dir/*.log" > /dev/null; then
  rm -rf "$log_dir/previous" && mkdir "$log_dir/previous" &&
    mv "$log_dir"/*.log "$log_dir/previous/" ||
    die "cannot keep the run before's logs in $log_dir/previous"
  kept=" (the run before's in $log_dir/previous)"
fi
# What it trains on (the chief checks it against what --train_dir was
# trained on), and from where.
"$python" - "$root" "$data_dir" <<'EOF' || exit 2
import sys
sys.path.insert(0, sys.argv[1])
from training.storage import data_layout
try:
  print('Data: ' + data_layout.describe(data_layout.identity(sys.argv[2])))
except data_layout.DataError as e:
  sys.exit('Error: %s' % e)
EOF
last=$(sed -n 's/^model_checkpoint_path: ".*-\([0-9]*\)"$/\1/p' "$train_dir/checkpoint" 2> /dev/null)
if [ -z "$last" ]; then
  echo "Starting fresh in $train_dir"
elif (($last >= max_steps)); then
  echo "$train_dir is at step $last, at or past --max_steps=$max_steps:" \
       "the tasks start, find nothing to train and stop (raise --max_steps to" \
       "train on, or add -- --fresh_start to start over)"
else
  echo "Resuming $train_dir from step $last to --max_steps=$max_steps"
fi

# Free ports, all at once so that no two tasks get the same one, from below
# the range the kernel picks connections' source ports from.
# Free worker slots get theirs too: below that range no connection takes
# them, so they stay free for the workers started later.
ports=($("$python" "$root/training/cluster/ports.py" "$((num_ps + worker_slots))")) || die "could not find free ports"
join() { local IFS=,; echo "$*"; }
ps_hosts=$(join $(for p in "${ports[@]:0:num_ps}"; do echo "localhost:$p"; done))
worker_hosts=$(join $(for p in "${ports[@]:num_ps}"; do echo "localhost:$p"; done))

flags=(--ps_hosts="$ps_hosts" --worker_hosts="$worker_hosts"
       --data_dir="$data_dir" --train_dir="$train_dir"
       --max_steps="$max_steps" --batch_size="$batch_size")
((async)) && flags+=(--nosync_replicas)
[ -n "$replicas_to_aggregate" ] && flags+=(--replicas_to_aggregate="$replicas_to_aggregate")
((num_gpus > 0)) && flags+=(--num_gpus=1)  # Each worker sees one GPU.
flags+=(${trainer_flags[@]+"${trainer_flags[@]}"})
# A worker started later by hand gets the same flags from a file, its
# folders absolute so that it may start anywhere.
absolute() { case $1 in /*) echo "$1" ;; *) echo "$PWD/${1#./}" ;; esac; }
flagfile=
if ((worker_slots > num_workers)); then
  flagfile=$log_dir/cluster.flags
  for flag in "${flags[@]}"; do
    case $flag in
      --data_dir=*) echo "--data_dir=$(absolute "$data_dir")" ;;
      --train_dir=*) echo "--train_dir=$(absolute "$train_dir")" ;;
      *) printf '%s\n' "$flag" ;;
    esac
  done > "$flagfile" || die "cannot write $flagfile"
fi

names=()
declare -A pid status
tail_pid=
tensorboard_pid=
start() {  # start NAME CUDA_VISIBLE_DEVICES TRAINER_FLAGS...
  local name=$1 gpus=$2
  shift 2
  # Emptied here, not by the task's redirection: that runs in the
  # background, and the tail below could show an earlier run's lines first.
  : > "$log_dir/$name.log"
  CUDA_VISIBLE_DEVICES=$gpus PYTHONUNBUFFERED=1 \
    "$python" "$root/train_distributed.py" "$@" >> "$log_dir/$name.log" 2>&1 &
  pid[$name]=$!
  names+=("$name")
}

stop_all() {  # Stops what this script started, by PID: TERM, then KILL.
  local name left
  for name in "${names[@]}"; do
    [ -z "${status[$name]:-}" ] && kill -TERM "${pid[$name]}" 2> /dev/null
  done
  for _ in $(seq 50); do
    left=0
    for name in "${names[@]}"; do
      [ -z "${status[$name]:-}" ] && kill -0 "${pid[$name]}" 2> /dev/null && left=1
    done
    ((left)) || break
    sleep 0.1
  done
  for name in "${names[@]}"; do
    if [ -z "${status[$name]:-}" ]; then
      kill -KILL "${pid[$name]}" 2> /dev/null
      wait "${pid[$name]}" 2> /dev/null
      status[$name]=killed
    fi
  done
  [ -n "$tail_pid" ] && kill "$tail_pid" 2> /dev/null
  if [ -n "$tensorboard_pid" ]; then  # Nothing to save: no grace period.
    kill -KILL "$tensorboard_pid" 2> /dev/null
    wait "$tensorboard_pid" 2> /dev/null
  fi
}
interrupted() {
  echo "run_local_cluster.sh: $1: stopping the cluster" >&2
  stop_all
  exit "$2"
}
trap 'interrupted interrupted 130' INT
trap 'interrupted terminated 143' TERM
trap stop_all EXIT

echo "Logs: $log_dir/{ps0..,worker0..,evaluator}.log$kept"
echo "Cluster: ps $ps_hosts; workers $worker_hosts; train_dir $train_dir"
for ((i = 0; i < num_ps; i++)); do
  start "ps$i" "" --job_name=ps --task_index=$i "${flags[@]}"
done
for ((i = num_workers - 1; i >= 0; i--)); do
  gpus=""
  ((num_gpus > 0)) && gpus=$((i % num_gpus))
  start "worker$i" "$gpus" --job_name=worker --task_index=$i "${flags[@]}"
done
start evaluator "" --job_name=evaluator "${flags[@]}"
for ((i = num_workers; i < worker_slots; i++)); do
  echo "Worker slot $i free, at localhost:${ports[num_ps + i]}: start worker $i with" \
       "\`$python $root/train_distributed.py --flagfile=$flagfile --job_name=worker --task_index=$i\`," \
       "stop it with Ctrl-C"
done
if [ -n "$tensorboard" ]; then
  PYTHON=$python bash "$root/scripts/tensorboard.sh" --logdir="$train_dir" \
    --host=localhost --port="$tensorboard" > "$log_dir/tensorboard.log" 2>&1 &
  tensorboard_pid=$!
  echo "TensorBoard: http://localhost:$tensorboard/ (log: $log_dir/tensorboard.log)"
fi

# The chief's progress and the evaluator's results, until this script ends
# (a task's error ends it too, and fail() shows that task's log: once).
tail -n +1 -F "$log_dir/worker0.log" "$log_dir/evaluator.log" 2> /dev/null \
  > >(grep --line-buffered -E 'Train accuracy|Test accuracy|^Worker 0: (resuming|the ps tasks hold|.* has no moving averages|--new_data|all [0-9]+ workers have joined|lost worker)|^Evaluator: .* evaluated already') &
tail_pid=$!

fail() {  # fail NAME MESSAGE
  echo "run_local_cluster.sh: $1 $2; the end of $log_dir/$1.log:" >&2
  tail -n 20 "$log_dir/$1.log" | sed 's/^/    /' >&2
  exit 1
}

# Wait: every worker and the evaluator must exit 0; so must the ps tasks,
# which exit by themselves once every worker is done.
ps_deadline=
while :; do
  running=()
  for name in "${names[@]}"; do
    [ -n "${status[$name]:-}" ] && continue
    if kill -0 "${pid[$name]}" 2> /dev/null; then
      running+=("$name")
      continue
    fi
    wait "${pid[$name]}"
    status[$name]=$?
    ((status[$name] == 0)) || fail "$name" "exited with status ${status[$name]}"
  done
  ((${#running[@]})) || break
  if [[ ! " ${running[*]}" =~ " "(worker|evaluator) ]]; then
    # Only ps tasks are left: they get 30 s to see the workers' done posts.
    : "${ps_deadline:=$((SECONDS + 30))}"
    ((SECONDS < ps_deadline)) || fail "${running[0]}" "did not exit 30 s after the workers"
  fi
  sleep 0.5
done

# The reference's test line; with --eval_flips, its figure after it.
result=$(grep 'Test accuracy = ' "$log_dir/evaluator.log" | tail -n 1)
[ -n "$result" ] || fail evaluator "printed no test accuracy"
echo "Final: $result"
flips=$(grep 'Test accuracy with flips averaged' "$log_dir/evaluator.log" |
  tail -n 1)
[ -z "$flips" ] || echo "Final: $flips"
echo "Results: $train_dir/eval/results.jsonl; logs: $log_dir"
