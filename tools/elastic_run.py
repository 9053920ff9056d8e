#!/usr/bin/env python3
"""A job whose workers come and go, against one of fixed size.

Runs --num_ps ps tasks and the most workers --workers names as listed
slots, on localhost: the first count of workers start with the ps tasks; at
each global step of --change_steps the job grows (the next slots start) or
shrinks (the highest-numbered workers are killed with SIGKILL: lost, not
stopped). In synchronous training every update aggregates as many gradients
as there are slots, so the examples per update and the learning rate's
schedule never change (after --, --nosync_replicas trains asynchronously:
each global step is one worker's batch). With
--compare_fixed, each seed also runs the job with every slot from the start.
Each run's chief is evaluated on the whole test set (--run_once):

  python3 tools/elastic_run.py --data_dir=./fashion-mnist-batches-bin \\
      --work_dir=/tmp/elastic --workers=2,4,3 --change_steps=469,938 \\
      --max_steps=1406 --seeds=0,1,2,3 --compare_fixed -- \\
      --lr_schedule=cosine --lr_scaling=linear --warmup_steps=234

Prints, per run, each phase's global steps, seconds and images/s (from the
chief's progress lines; a phase that begins with a loss includes the stall
until the chief gives the lost worker's token back: its longest pause;
the second half's images/s leave it and a joiner's start out), the
planner's prediction for the same workers each on a machine of its own
(scripts/plan_cluster.py, from --step_ms; synchronous training only), and
the test accuracy; writes it
all to WORK_DIR/elastic.json. The chief's `cluster_examples/sec` in
TensorBoard (--logdir=WORK_DIR) draws each run's phases.
"""

import argparse
import functools
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, 'scripts'))  # The planner.
from measured_run import progress_lines, run_training, stop  # pylint: disable=g-import-not-at-top,wrong-import-position
import plan_cluster  # pylint: disable=g-import-not-at-top,wrong-import-position
from training.cluster import ports  # pylint: disable=g-import-not-at-top,wrong-import-position
from training.runtime import process  # pylint: disable=g-import-not-at-top,wrong-import-position
from training.runtime import progress  # pylint: disable=g-import-not-at-top,wrong-import-position

TRAINER = os.path.join(ROOT, 'train_distributed.py')
POLL_SECS = 0.2


def parse_args(argv):
  parser = argparse.ArgumentParser(
      description=__doc__.split('\n')[0],
      formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
  parser.add_argument('--data_dir', required=True)
  parser.add_argument('--work_dir', required=True,
                      help='each run\'s logs and train_dir go in here')
  parser.add_argument('--workers', default='2,4,3',
                      help='the workers running in each phase')
  parser.add_argument('--change_steps', default='469,938',
                      help='the global steps at which the phases change')
  parser.add_argument('--num_ps', type=int, default=1)
  parser.add_argument('--max_steps', type=int, default=1406)
  parser.add_argument('--batch_size', type=int, default=32)
  parser.add_argument('--seeds', default='0', help='one run (or two) each')
  parser.add_argument('--compare_fixed', action='store_true',
                      help='also run every slot from the start, each seed')
  parser.add_argument('--step_ms', type=float, default=None,
                      help='a worker\'s step alone on its machine, for the '
                      'planner (default: measured, one process, 150 steps)')
  parser.add_argument('--link_gbit', type=float, default=10.0,
                      help='the planner\'s link rate')
  parser.add_argument('trainer_flags', nargs='*',
                      help='after --: more flags for every task')
  args = parser.parse_args(argv)
  try:
    args.workers = int_list(args.workers, '--workers')
    args.change_steps = (int_list(args.change_steps, '--change_steps')
                         if args.change_steps else [])
    args.seeds = int_list(args.seeds, '--seeds')
    problem = usage_problem(args)
  except ValueError as e:
    problem = str(e)
  if problem:
    parser.exit(2, 'Error: %s\n' % problem)
  return args


def int_list(text, name):
  """[int] from 'a,b,c'; ValueError with the flag's name."""
  try:
    return [int(n) for n in text.split(',')]
  except ValueError:
    raise ValueError('%s must be whole numbers separated by commas (got %r)'
                     % (name, text)) from None


def usage_problem(args):
  """One line saying what is wrong with the arguments, or None."""
  if min(args.max_steps, args.batch_size, args.num_ps) < 1:
    return '--max_steps, --batch_size and --num_ps must be at least 1'
  if args.step_ms is not None and args.step_ms <= 0:
    return '--step_ms must be above 0 (leave it out to measure it)'
  fixed = [f for f in args.trainer_flags if f.split('=')[0] in (
      '--replicas_to_aggregate', '--worker_hosts', '--ps_hosts', '--max_steps', '--batch_size')]
  if fixed:
    return ('%s: this script sets it (every update takes a gradient per '
            'listed slot); drop it from the trainer\'s flags' % fixed[0])
  if len(args.change_steps) != len(args.workers) - 1:
    return ('--change_steps needs one step per change of --workers (%d), '
            'got %d' % (len(args.workers) - 1, len(args.change_steps)))
  if min(args.workers) < 1:
    return '--workers must all be at least 1 (got %s)' % args.workers
  if args.change_steps != sorted(set(args.change_steps)) or any(
      not 0 < s < args.max_steps for s in args.change_steps):
    return ('--change_steps must rise, each between 0 and --max_steps=%d '
            '(got %s)' % (args.max_steps, args.change_steps))
  return None


class Job:
  """The tasks of one run, each a process with its log in run_dir."""

  def __init__(self, run_dir, flags):
    self.run_dir, self.flags, self.procs = run_dir, flags, {}

  def start(self, job_name, index, extra=()):
    name = '%s%d' % (job_name, index)
    with open(self.log_path(name), 'a') as log:  # A slot started again.
      self.procs[name] = subprocess.Popen(
          [sys.executable, TRAINER, '--job_name=' + job_name,
           '--task_index=%d' % index] + self.flags + list(extra),
          stdout=log, stderr=subprocess.STDOUT)

  def log_path(self, name):
    return os.path.join(self.run_dir, name + '.log')

  def log(self, name):
    with open(self.log_path(name)) as f:
      return f.read()

  def chief_steps(self):
    """[(time, global step)] of the chief's progress lines so far."""
    return progress_lines(self.log('worker0'))

  def reached(self, step):
    """Whether the chief's progress lines have reached global step."""
    steps = self.chief_steps()
    return bool(steps) and steps[-1][1] >= step

  def trained(self, name):
    """Whether the task name has printed a progress line."""
    return bool(progress.PATTERN.search(self.log(name)))

  def wait_for(self, predicate, what, running):
    """Polls predicate() until true; raises if one of the tasks named in
    running exits first."""
    while not predicate():
      ended = [n for n in running if self.procs[n].poll() is not None]
      if ended:
        raise RuntimeError('%s exited (status %s) before %s (more '
                           '--max_steps?); its log ends:\n%s' % (
                               ended[0], self.procs[ended[0]].returncode,
                               what, self.log(ended[0])[-3000:]))
      time.sleep(POLL_SECS)

  def wait_all(self, names, timeout):
    """{name: exit status} once each has exited; raises if one has not
    within timeout seconds (from this call)."""
    deadline = time.time() + timeout
    try:
      return {n: self.procs[n].wait(max(0.1, deadline - time.time()))
              for n in names}
    except subprocess.TimeoutExpired as e:
      raise RuntimeError('still running %d s after the chief: %s; logs in %s'
                         % (timeout, e.cmd, self.run_dir)) from None

  def kill_all(self):
    stop(self.procs.values())


def run_job(*, run_dir, data_dir, seed, workers, change_steps, num_ps,
            max_steps, batch_size, trainer_flags):
  """Runs one job through its phases; returns its record (see main)."""
  slots = max(workers)
  hosts = ['localhost:%d' % p for p in ports.free_ports(num_ps + slots)]
  ps_tasks = ['ps%d' % i for i in range(num_ps)]
  examples_per_update = batch_size * (
      1 if '--nosync_replicas' in trainer_flags else slots)
  train_dir = os.path.join(run_dir, 'train')
  flags = ['--ps_hosts=' + ','.join(hosts[:num_ps]),
           '--worker_hosts=' + ','.join(hosts[num_ps:]),
           '--data_dir=' + data_dir, '--train_dir=' + train_dir,
           '--max_steps=%d' % max_steps, '--batch_size=%d' % batch_size,
           '--seed=%d' % seed, '--log_frequency=5'] + trainer_flags
  shutil.rmtree(run_dir, ignore_errors=True)  # A run of its own, no resume.
  os.makedirs(run_dir)
  job = Job(run_dir, flags)
  changes = []  # (time, global step, workers now, what happened)
  try:
    for i in range(num_ps):
      job.start('ps', i)
    for i in reversed(range(workers[0])):
      job.start('worker', i)
    running = workers[0]
    changes.append((time.time(), 0, running, 'started'))
    for step, now in zip(change_steps, workers[1:]):
      tasks = ps_tasks + ['worker%d' % i for i in range(running)]
      job.wait_for(functools.partial(job.reached, step),
                   'global step %d' % step, tasks)
      what = []
      while running < now:
        job.start('worker', running)
        what.append('worker %d started' % running)
        running += 1
      while running > now:
        running -= 1
        victim = 'worker%d' % running
        # A worker lost before its first step is a slot never filled.
        job.wait_for(functools.partial(job.trained, victim),
                     victim + '\'s first progress line', tasks)
        job.procs[victim].send_signal(signal.SIGKILL)
        what.append('worker %d killed (-9)' % running)
      changes.append((time.time(), job.chief_steps()[-1][1], running,
                      ', '.join(what)))
    tasks = ['worker%d' % i for i in range(running)] + ps_tasks
    job.wait_for(lambda: job.procs['worker0'].poll() is not None,
                 'the chief\'s end', ps_tasks)
    codes = job.wait_all(tasks, timeout=120)
    if set(codes.values()) != {0}:
      raise RuntimeError('a task failed: %s; logs in %s' % (codes, run_dir))
    accuracy = evaluate(job, train_dir)
  finally:
    job.kill_all()
  return {'seed': seed, 'workers': workers, 'accuracy': accuracy,
          'examples_per_update': examples_per_update,
          'phases': phases(job.chief_steps(), changes, examples_per_update),
          'changes': changes,
          'lost_lines': re.findall(r'^Worker 0: (?:lost worker|worker \d+ at '
                                   r'\S+ is back).*$', job.log('worker0'),
                                   re.M)}


def evaluate(job, train_dir):
  """The chief's last checkpoint's test accuracy, on the whole test set."""
  job.start('evaluator', 0, extra=['--run_once'])
  if job.procs['evaluator0'].wait() != 0:
    raise RuntimeError('the evaluator failed:\n' + job.log('evaluator0'))
  with open(os.path.join(train_dir, 'eval', 'results.jsonl')) as f:
    return json.loads(f.read().splitlines()[-1])['accuracy']


def phases(progress, changes, examples_per_update):
  """Each phase's steps, seconds, images/s and longest pause, from the
  chief's (time, global step) progress lines and the changes made: a phase
  runs from the line its change was made on to the next change's."""
  out = []
  for i, (start, _, workers, what) in enumerate(changes):
    end = changes[i + 1][0] if i + 1 < len(changes) else float('inf')
    lines = [(t, s) for t, s in progress if t < start][-1:] + [
        (t, s) for t, s in progress if start <= t < end]
    if len(lines) < 2:
      out.append({'workers': workers, 'change': what, 'steps': None})
      continue
    (t0, s0), (t1, s1) = lines[0], lines[-1]
    # The second half, once the job has settled: a joiner's start (its
    # TensorFlow loading on the same cores) or a lost worker's stall
    # comes in the first.
    (h0, k0) = lines[len(lines) // 2] if len(lines) > 2 else (t0, s0)
    out.append({
        'workers': workers, 'change': what, 'steps': [s0, s1],
        'secs': round(t1 - t0, 2),
        'images_per_sec': round((s1 - s0) * examples_per_update / (t1 - t0),
                                1),
        'longest_pause_secs': round(max(
            b[0] - a[0] for a, b in zip(lines, lines[1:])), 2),
        'second_half_steps': [k0, s1],
        'second_half_images_per_sec': round(
            (s1 - k0) * examples_per_update / (t1 - h0), 1)})
  return out


def measure_step_ms(work_dir, data_dir, batch_size, trainer_flags):
  """One process's step, ms, as the benchmark measures it (the second half
  of 150 steps): a worker on a machine of its own."""
  images_per_sec = run_training(
      name='one_process', data_dir=data_dir, work=work_dir, num_ps=0,
      num_workers=1, steps=150, batch_size=batch_size,
      flags=trainer_flags + ['--fresh_start'])['images_per_sec']
  return 1e3 * batch_size / images_per_sec


def row(name, record):
  phase_text = '; '.join(
      '%d workers: steps %s, %s images/s%s' % (
          p['workers'], '-'.join(map(str, p['steps'] or [])),
          p.get('images_per_sec'),
          ' (longest pause %.1f s; the second half %s images/s)' % (
              p['longest_pause_secs'], p['second_half_images_per_sec'])
          if p['steps'] else '') for p in record['phases'])
  return '%s, seed %d: test accuracy %.4f; %s' % (
      name, record['seed'], record['accuracy'], phase_text)


def main(argv=None):
  args = parse_args(argv)
  os.makedirs(args.work_dir, exist_ok=True)
  result = {'elastic': [], 'fixed': []}
  if '--nosync_replicas' not in args.trainer_flags:  # The planner's model.
    step_ms = args.step_ms or measure_step_ms(
        args.work_dir, args.data_dir, args.batch_size, args.trainer_flags)
    shares = {args.num_ps: plan_cluster.largest_shares(args.num_ps)[
        args.num_ps] if args.num_ps > 1 else 1.0}
    dtype_bytes = 2 if '--transfer_dtype=bfloat16' in args.trainer_flags else 4
    result.update(step_ms=round(step_ms, 2), link_gbit=args.link_gbit,
                  predicted_images_per_sec={  # The planner's row's images/s.
                      n: round(plan_cluster.plan(
                          step_ms, n, args.link_gbit * 1e3, shares,
                          args.batch_size, plan_cluster.network_bytes(),
                          dtype_bytes)[0][3], 1)
                      for n in sorted(set(args.workers))})
  kinds = [('elastic', args.workers, args.change_steps)]
  if args.compare_fixed:
    kinds.append(('fixed', [max(args.workers)], []))
  for seed in args.seeds:
    for kind, workers, change_steps in kinds:
      record = run_job(
          run_dir=os.path.join(args.work_dir, '%s_seed%d' % (kind, seed)),
          data_dir=args.data_dir, seed=seed, workers=workers,
          change_steps=change_steps, num_ps=args.num_ps,
          max_steps=args.max_steps,
          batch_size=args.batch_size, trainer_flags=args.trainer_flags)
      result[kind].append(record)
      print(row(kind, record), flush=True)
      with open(os.path.join(args.work_dir, 'elastic.json'), 'w') as f:
        json.dump(result, f, indent=1)  # So far: a later run may fail.
  if 'predicted_images_per_sec' in result:
    print('The planner, a worker\'s step %.1f ms, %g Gbit/s links: %s' % (
        result['step_ms'], args.link_gbit, ', '.join(
            '%d workers %.0f images/s' % (n, v)
            for n, v in result['predicted_images_per_sec'].items())))
  for kind in ('elastic', 'fixed'):
    if result[kind]:
      accuracies = [r['accuracy'] for r in result[kind]]
      print('%s: test accuracy median %.4f (%.4f-%.4f, %d runs)' % (
          kind, statistics.median(accuracies), min(accuracies),
          max(accuracies), len(accuracies)))
  return 0


if __name__ == '__main__':
  process.start()  # Before the planner loads TensorFlow.
  sys.exit(main())
