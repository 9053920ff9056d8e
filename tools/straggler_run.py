#!/usr/bin/env python3
"""A synchronous job with a worker that lags, hangs or is lost, side by side.

Each round runs 1 ps and 3 synchronous workers (every update takes 3
gradients) on localhost, once per case, in turn: `healthy`; `slow`, worker
2 at a third of its speed (a pacer stops it 20 ms of every 30, as a
throttled or shared machine); `slow_noaside`, the same with --noset_aside;
`lost`, worker 2 killed. Each run trains --steps global steps past worker
2's first progress line and reports the global steps a second over its
second half (from the chief's progress lines: after a set-aside, a loss or
its stall), the CPU seconds worker 2 used, and the most tokens the queue
held (a probe reads its size on the ps every 0.25 s: no token piles up).
`hang` stops worker 2 (SIGSTOP) and then ps 0 for 20 s each and reports
how long each took to be named. Ratios are taken within a round:

  python3 tools/straggler_run.py --data_dir=/tmp/syn --work_dir=/tmp/st \\
      --rounds=3 --steps=600

Writes WORK_DIR/straggler.json.
"""

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import types

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from training.cluster import ports  # pylint: disable=g-import-not-at-top,wrong-import-position
from training.runtime import process  # pylint: disable=g-import-not-at-top,wrong-import-position
from training.runtime import progress  # pylint: disable=g-import-not-at-top,wrong-import-position

TRAINER = os.path.join(ROOT, 'train_distributed.py')
CASES = ('healthy', 'slow', 'slow_noaside', 'lost')


def parse_args(argv):
  parser = argparse.ArgumentParser(
      description=__doc__.split('\n')[0],
      formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
  parser.add_argument('--data_dir', required=True)
  parser.add_argument('--work_dir', required=True)
  parser.add_argument('--rounds', type=int, default=3)
  parser.add_argument('--steps', type=int, default=600)
  parser.add_argument('--batch_size', type=int, default=32)
  return parser.parse_args(argv)


class Cluster:
  """1 ps and 3 synchronous workers, their logs in a folder."""

  def __init__(self, args, name, extra=()):
    self.dir = os.path.join(args.work_dir, name)
    os.makedirs(self.dir, exist_ok=True)
    hosts = ['localhost:%d' % p for p in ports.free_ports(4)]
    self.ps, self.workers = hosts[0], hosts[1:]
    self.flags = [
        '--ps_hosts=' + self.ps, '--worker_hosts=' + ','.join(self.workers),
        '--data_dir=' + args.data_dir,
        '--train_dir=' + os.path.join(self.dir, 'train'),
        '--batch_size=%d' % args.batch_size, '--log_frequency=10',
        '--num_preprocess_threads=2', '--max_steps=1000000',
        '--save_checkpoint_steps=100000', '--lost_worker_secs=10'] + list(
            extra)
    self.procs = {}
    for job, i in (('ps', 0), ('worker', 2), ('worker', 1), ('worker', 0)):
      name = '%s%d' % (job, i)
      with open(os.path.join(self.dir, name + '.log'), 'w') as log:
        self.procs[name] = subprocess.Popen(
            [sys.executable, TRAINER, '--job_name=' + job,
             '--task_index=%d' % i] + self.flags, stdout=log,
            stderr=subprocess.STDOUT, cwd=ROOT)

  def log(self, name):
    with open(os.path.join(self.dir, name + '.log')) as f:
      return f.read()

  def steps(self):
    return progress.parse(self.log('worker0'))

  def wait_for(self, predicate, secs=600):
    deadline = time.time() + secs
    while not predicate():
      if time.time() > deadline:
        raise RuntimeError('timed out in %s' % self.dir)
      time.sleep(0.2)

  def cpu_secs(self, name):
    with open('/proc/%d/stat' % self.procs[name].pid) as f:
      fields = f.read().rsplit(')', 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf('SC_CLK_TCK')

  def stop(self):
    for proc in self.procs.values():
      try:
        proc.send_signal(signal.SIGCONT)
        proc.kill()
      except ProcessLookupError:
        pass
      proc.wait()


def pace(pid, done, stop_ms=20, run_ms=10):
  """Stops pid stop_ms of every stop_ms + run_ms until done is set."""
  try:
    while not done.is_set():
      os.kill(pid, signal.SIGSTOP)
      time.sleep(stop_ms / 1000)
      os.kill(pid, signal.SIGCONT)
      time.sleep(run_ms / 1000)
  except ProcessLookupError:
    pass


def probe_tokens(ps, done, sizes):
  """Reads the token queue's size on the ps every 0.25 s into sizes."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from training.graph import sync_protocol  # pylint: disable=g-import-not-at-top
  tf1 = tf.compat.v1
  with tf.Graph().as_default():
    size = sync_protocol.token_queue(types.SimpleNamespace(
        device='/job:ps/task:0', dtype=tf.int64)).size()
    with tf1.Session('grpc://' + ps) as sess:
      while not done.wait(0.25):
        try:
          sizes.append(int(sess.run(size, options=tf1.RunOptions(
              timeout_in_ms=2000))))
        except tf.errors.OpError:
          pass


def run_case(args, case, round_index):
  """One run; returns its figures."""
  cluster = Cluster(args, '%s_%d' % (case, round_index),
                    ['--noset_aside'] if case == 'slow_noaside' else [])
  done, sizes = threading.Event(), []
  try:
    cluster.wait_for(lambda: progress.parse(cluster.log('worker2')))
    start = cluster.steps()[-1].step if cluster.steps() else 0
    cpu_before = cluster.cpu_secs('worker2')
    threading.Thread(target=probe_tokens, args=(cluster.ps, done, sizes),
                     daemon=True).start()
    if case.startswith('slow'):
      threading.Thread(target=pace, args=(cluster.procs['worker2'].pid, done),
                       daemon=True).start()
    elif case == 'lost':
      cluster.procs['worker2'].kill()
    cluster.wait_for(lambda: cluster.steps() and
                     cluster.steps()[-1].step >= start + args.steps)
    cpu = (None if case == 'lost' else
           cluster.cpu_secs('worker2') - cpu_before)
    lines = [p for p in cluster.steps() if p.step >= start]
    half = [p for p in lines if p.step >= start + args.steps // 2]
    secs = (half[-1].time - half[0].time).total_seconds()
    return dict(rate=(half[-1].step - half[0].step) / secs,
                worker2_cpu_secs=cpu, most_tokens=max(sizes or [None]),
                chief_lines=[l for l in cluster.log('worker0').splitlines()
                             if 'worker 2' in l])
  finally:
    done.set()
    cluster.stop()


def named_after(cluster, name, pid, text):
  """Stops pid for 20 s; returns the seconds until text is in name's log."""
  os.kill(pid, signal.SIGSTOP)
  start = time.time()
  try:
    cluster.wait_for(lambda: text in cluster.log(name), 20)
    return round(time.time() - start, 1)
  except RuntimeError:
    return None
  finally:
    time.sleep(max(0, 20 - (time.time() - start)))
    os.kill(pid, signal.SIGCONT)


def run_hangs(args, round_index):
  """How long a hung worker and a hung ps take to be named."""
  cluster = Cluster(args, 'hang_%d' % round_index)
  try:
    cluster.wait_for(lambda: progress.parse(cluster.log('worker2')))
    worker = named_after(cluster, 'worker0', cluster.procs['worker2'].pid,
                         'lost worker 2')
    cluster.wait_for(lambda: 'worker 2 at %s is back' % cluster.workers[2]
                     in cluster.log('worker0'))
    ps = named_after(cluster, 'worker1', cluster.procs['ps0'].pid,
                     'ps 0 at %s takes connections' % cluster.ps)
    return dict(worker_named_secs=worker, ps_named_secs=ps)
  finally:
    cluster.stop()


def main(argv):
  args = parse_args(argv)
  rounds = []
  for r in range(args.rounds):
    result = {case: run_case(args, case, r) for case in CASES}
    result['hang'] = run_hangs(args, r)
    rounds.append(result)
    print('round %d: %s' % (r, json.dumps({
        c: {k: v for k, v in f.items() if k != 'chief_lines'}
        for c, f in result.items()})), flush=True)
  for case in ('slow', 'slow_noaside'):
    ratios = [r[case]['rate'] / r['lost']['rate'] for r in rounds]
    print('%s x lost: median %.2f (%s)' % (case, statistics.median(ratios),
                                           ', '.join('%.2f' % x
                                                     for x in ratios)))
  with open(os.path.join(args.work_dir, 'straggler.json'), 'w') as f:
    json.dump(rounds, f, indent=1)


if __name__ == '__main__':
  process.start()
  main(sys.argv[1:])
