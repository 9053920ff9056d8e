#!/usr/bin/env python3
"""Measures the planner's CPU constants on this machine, for plan_cluster.py.

  python3 scripts/calibrate_planner.py --data_dir=DIR --out=constants.json
  python3 scripts/plan_cluster.py --constants=constants.json --step_ms=45 \\
      --num_workers=32 --link_gbit=10 --worker_cores=16 --ps_cores=16

The planner counts the CPU of a step's RPCs (training/cluster/planner_model.py):
a worker's for a synchronous or an asynchronous step and for each ps it
talks to, and ps 0's for a worker's synchronous step, an update and an
asynchronous step. Its shipped values were fitted on one CPU and are 20-28%
off on another; this measures them here. Short runs of the trainer on
localhost (--steps steps each, batch --batch_size, one intra-op thread a
task), each process's CPU time read from /proc between two of the chief's
progress lines:

  A  one process                    its CPU a step: the compute, c
  B  1 ps + 1 synchronous worker    worker: c + SYNC + PS_RPC
  C  1 ps + 2 synchronous workers   ps 0 an update: UPDATE + 2 x PS_WORKER
  D  2 ps + 1 synchronous worker    worker: c + SYNC + 2 x PS_RPC
  E  1 ps + 1 asynchronous worker   worker: c + ASYNC + PS_RPC; ps 0: PS_ASYNC

with B's ps 0 an update UPDATE + PS_WORKER. Every run --rounds times, in
turn (the machine drifts); each figure the median of its rounds. Writes
the constants, the machine and the runs to --out.
"""

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from training.cluster import ports  # pylint: disable=g-import-not-at-top,wrong-import-position
from training.runtime import progress  # pylint: disable=g-import-not-at-top,wrong-import-position

TRAINER = os.path.join(ROOT, 'train_distributed.py')
TICKS = os.sysconf('SC_CLK_TCK')
# (name, ps tasks, workers, synchronous): 0 ps is one process.
RUNS = (('A', 0, 1, True), ('B', 1, 1, True), ('C', 1, 2, True),
        ('D', 2, 1, True), ('E', 1, 1, False))


def parse_args(argv):
  """The command line; exits with status 2 and one line where it is wrong."""
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--data_dir', required=True,
                      help='CIFAR-10 binaries (or the synthetic set)')
  parser.add_argument('--out', default='planner_constants.json',
                      help='where to write them (default: %(default)s)')
  parser.add_argument('--steps', type=int, default=100,
                      help='measured steps a run, after 20 of warmup')
  parser.add_argument('--batch_size', type=int, default=8,
                      help="small: the RPCs' CPU is a larger part of a step")
  parser.add_argument('--rounds', type=int, default=3)
  args = parser.parse_args(argv)
  for name in ('steps', 'batch_size', 'rounds'):
    if getattr(args, name) < 1:
      parser.exit(2, 'Error: --%s must be 1 or more (got %d)\n' % (
          name, getattr(args, name)))
  if not os.path.isdir(args.data_dir):
    parser.exit(2, 'Error: --data_dir=%s is not a folder; make the synthetic '
                'set with scripts/make_synthetic_cifar10.py\n' % args.data_dir)
  return args


def cpu_ms(pid):
  """A process's CPU time so far, user and system, in ms."""
  with open('/proc/%d/stat' % pid) as f:
    fields = f.read().rsplit(')', 1)[1].split()
  return (int(fields[11]) + int(fields[12])) * 1000.0 / TICKS


def task_commands(*, num_ps, workers, sync, common):
  """[(name, argv)] of one run's tasks, the chief first."""
  if not num_ps:
    return [('worker0', [sys.executable, TRAINER, '--job_name=worker',
                         '--task_index=0', '--ps_hosts='] + common)]
  found = ['localhost:%d' % p for p in ports.free_ports(num_ps + workers)]
  hosts = ['--ps_hosts=' + ','.join(found[:num_ps]),
           '--worker_hosts=' + ','.join(found[num_ps:]),
           '--intra_op_threads=1'] + ([] if sync else ['--nosync_replicas'])
  tasks = [('worker%d' % i, ['--job_name=worker', '--task_index=%d' % i])
           for i in range(workers)]
  tasks += [('ps%d' % i, ['--job_name=ps', '--task_index=%d' % i])
            for i in range(num_ps)]
  return [(name, [sys.executable, TRAINER] + flags + hosts + common)
          for name, flags in tasks]


def one_run(*, num_ps, workers, sync, args, work):
  """{task: its CPU ms a global step} between the chief's progress lines at
  steps 20 and 20 + --steps."""
  first, last = 20, 20 + args.steps
  common = ['--data_dir=' + args.data_dir,
            '--train_dir=' + tempfile.mkdtemp(dir=work),
            '--batch_size=%d' % args.batch_size, '--log_frequency=10',
            '--max_steps=%d' % (last + 10), '--save_checkpoint_steps=100000']
  # One intra-op thread in one process too (the flag is a worker's).
  env = dict(os.environ, TF_NUM_INTRAOP_THREADS='1')
  procs = []
  try:
    for i, (name, argv) in enumerate(task_commands(
        num_ps=num_ps, workers=workers, sync=sync, common=common)):
      procs.append((name, subprocess.Popen(
          argv, env=env, stdout=subprocess.PIPE if i == 0 else
          subprocess.DEVNULL, stderr=subprocess.STDOUT, text=True)))
    marks = []
    for line in procs[0][1].stdout:
      for step in [p.step for p in progress.parse(line)]:
        if step >= (last if marks else first) and len(marks) < 2:
          marks.append((step, {n: cpu_ms(p.pid) for n, p in procs}))
    codes = [p.wait(timeout=600) for _, p in procs]
  finally:
    for _, p in procs:
      if p.poll() is None:
        p.kill()
        p.wait()
  if any(codes) or len(marks) < 2:
    sys.exit('Error: a run of %d ps + %d workers failed (exit codes %s); run '
             'the trainer by hand with these flags to see why: %s' % (
                 num_ps, workers, codes, ' '.join(common)))
  (step0, cpu0), (step1, cpu1) = marks
  return {n: (cpu1[n] - cpu0[n]) / (step1 - step0) for n in cpu0}


def constants(runs):
  """training/cluster/planner_model.py's CPU constants, core-ms, from the runs' {task:
  CPU ms a global step} (see the module's docstring); a difference the
  noise made negative is 0."""
  a, b, c, d, e = (runs[name] for name, _, _, _ in RUNS)
  compute = a['worker0']
  ps_rpc = max(0.0, d['worker0'] - b['worker0'])
  ps_worker = max(0.0, c['ps0'] - b['ps0'])
  found = {
      'PS_RPC_MS': ps_rpc,
      'SYNC_RPC_MS': b['worker0'] - compute - ps_rpc,
      'ASYNC_RPC_MS': e['worker0'] - compute - ps_rpc,
      'PS_WORKER_MS': ps_worker,
      'PS_UPDATE_MS': b['ps0'] - ps_worker,
      'PS_ASYNC_MS': e['ps0'],
  }
  return {name: max(0.0, value) for name, value in found.items()}


def machine():
  """This machine's CPU, in words (lscpu's model name, family and model)."""
  try:
    text = subprocess.run(['lscpu'], capture_output=True, text=True).stdout
  except OSError:
    text = ''
  found = dict(re.findall(r'^(Model name|CPU family|Model|CPU\(s\)):\s+(.+)$',
                          text, re.M))
  return '%s (family %s model %s), %s CPUs, %s' % (
      found.get('Model name', platform.processor() or 'unknown CPU'),
      found.get('CPU family', '?'), found.get('Model', '?'),
      found.get('CPU(s)', os.cpu_count()), platform.node())


def main(argv=None):
  args = parse_args(argv)
  measured = {name: [] for name, _, _, _ in RUNS}
  with tempfile.TemporaryDirectory(prefix='calibrate_') as work:
    for round_ in range(args.rounds):
      for name, num_ps, workers, sync in RUNS:
        measured[name].append(one_run(num_ps=num_ps, workers=workers,
                                      sync=sync, args=args, work=work))
        print('round %d, run %s (%d ps, %d %s workers): %s' % (
            round_ + 1, name, num_ps, workers, 'sync' if sync else 'async',
            ', '.join('%s %.1f ms' % kv for kv in measured[name][-1].items())),
              flush=True)
  medians = {name: {task: statistics.median(r[task] for r in rounds)
                    for task in rounds[0]} for name, rounds in measured.items()}
  found = constants(medians)
  by_round = [constants({n: r[i] for n, r in measured.items()})
              for i in range(args.rounds)]
  with open(args.out, 'w') as f:
    json.dump({'machine': machine(), 'batch_size': args.batch_size,
               'steps': args.steps, 'constants': found,
               'by_round': by_round, 'runs': measured}, f, indent=1)
  for key, value in found.items():
    print('%s = %.2f core-ms (rounds: %s)' % (key, value, ', '.join(
        '%.2f' % r[key] for r in by_round)))
  print('Wrote %s: give it to scripts/plan_cluster.py --constants=%s with '
        '--worker_cores and --ps_cores' % (args.out, args.out))


if __name__ == '__main__':
  main()
