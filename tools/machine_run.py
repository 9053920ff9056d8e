"""A training run whose tasks each run on a machine of their own.

Starts the trainer's ps and worker tasks on hosts of tools/machines.py,
holds each to its share of the cores from its first step (a ps from the
first worker's), and measures the steady state from the chief's progress
lines: the global images/s, each task's CPU, how often its share was
throttled. Used by tools/scaling_run.py.
"""

import os
import statistics
import sys
import time

import measured_run
import machines

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAINER = os.path.join(ROOT, 'train_distributed.py')
POLL_SECS = 0.2
# Chief steps after every machine's first step before the window opens.
SETTLE_STEPS = 3


class TaskFailed(Exception):
  """A task of a run exited: the message names it, its status and log."""


class Run:
  """One training run, its tasks each on a machine, for a window of steps."""

  def __init__(self, *, args, name, num_workers, num_ps, mode, mbit, share,
               held=True, steps=None):
    """Args: share: each machine's cores; held: False leaves the machines
    the whole of their core, no quota (--check_shares' baseline); steps:
    the chief's steps measured (default --steps)."""
    self.args, self.name, self.steps = args, name, steps or args.steps
    self.num_workers, self.num_ps, self.mode = num_workers, num_ps, mode
    self.mbit, self.share, self.held = mbit, share, held

  def flags(self):
    """The flags every task gets beyond the cluster's."""
    flags = ['--data_dir=' + self.args.data_dir,
             '--train_dir=' + os.path.join(self.args.work_dir, self.name),
             '--fresh_start', '--max_steps=100000000',
             '--batch_size=%d' % self.args.batch_size, '--log_frequency=1',
             '--save_checkpoint_steps=100000000',
             '--save_summaries_steps=100000000',
             # A machine is a share of one core: one thread each.
             '--intra_op_threads=1', '--num_preprocess_threads=1']
    if self.mode == 'async':
      flags.append('--nosync_replicas')
    if self.mode == 'backup':
      flags.append('--replicas_to_aggregate=%d' % (self.num_workers - 1))
    return flags

  def measure(self):
    """Runs it; returns its measurements (a dict)."""
    # A packet between two machines crosses two ends' delays (a sender's
    # eth0, the bridge's port to the receiver): each is half the one-way
    # latency, slowed as the machines are.
    delay_ms = (self.args.latency_us / 1e3 / 2 * self.args.machine_cores /
                self.share)
    with machines.Machines(cores=self.share, rate_mbit=self.mbit,
                           delay_ms=delay_ms) as hosts:
      names = (['ps%d' % i for i in range(self.num_ps)] +
               ['worker%d' % i for i in range(self.num_workers)])
      addresses = [hosts.add(n, 10 + i) for i, n in enumerate(names)]
      cluster = ['--ps_hosts=' + ','.join(addresses[:self.num_ps]),
                 '--worker_hosts=' + ','.join(addresses[self.num_ps:])]
      if not self.num_ps:
        cluster = ['--ps_hosts=']
      procs, sampler = {}, measured_run.CpuSampler()
      try:
        for n in names:
          job = n.rstrip('0123456789')
          procs[n] = measured_run.launch(
              measured_run.log_path(self.args.work_dir, self.name, n),
              hosts.prefix(n) + [sys.executable, TRAINER] + cluster + [
                  '--job_name=' + job, '--task_index=' + n[len(job):]] +
              self.flags())
        sampler.start({n: p.pid for n, p in procs.items()})
        return self._watch(hosts, procs, sampler)
      finally:
        sampler.stop()
        measured_run.stop(procs.values())

  def _lines(self, task):
    with open(measured_run.log_path(self.args.work_dir, self.name,
                                      task)) as f:
      return measured_run.progress_lines(f.read())

  def _watch(self, hosts, procs, sampler):
    """Holds each machine to its share from its first step (a ps from the
    first worker's), waits for the window's steps, and measures it."""
    workers = [n for n in procs if n.startswith('worker')]
    held, opened, throttled = set(), None, {}
    while True:
      for n, p in procs.items():
        if p.poll() is not None:
          log = measured_run.log_path(self.args.work_dir, self.name, n)
          with open(log) as f:
            tail = f.read().strip().splitlines()[-1:]
          raise TaskFailed('%s: %s exited with %s (%s; its log: %s)' % (
              self.name, n, p.returncode, tail[0] if tail else 'no output',
              log))
      lines = {n: self._lines(n) for n in workers}
      for n in workers:
        if lines[n] and n not in held:
          if self.held:
            hosts.hold(n)
          held.add(n)
      if held and not any(n.startswith('ps') and n in held for n in procs):
        for n in procs:
          if n.startswith('ps'):
            hosts.hold(n)
            held.add(n)
      chief = lines['worker0']
      if opened is None and len(held) == len(procs):
        opened = len(chief) + SETTLE_STEPS
      if opened is not None and len(chief) >= opened + self.steps + 1:
        break
      if opened is not None and len(chief) >= opened and not throttled:
        throttled = {n: hosts.throttled(n) for n in procs}
      time.sleep(POLL_SECS)
    window = chief[opened:opened + self.steps + 1]
    (t0, g0), (t1, g1) = window[0], window[-1]
    per_update = self.args.batch_size * (
        1 if self.mode == 'async' else
        self.num_workers - (self.mode == 'backup'))
    steps = [b[0] - a[0] for a, b in zip(window, window[1:])]
    result = {'images_per_sec': (g1 - g0) * per_update / (t1 - t0),
              'window': [t0, g0, t1, g1],
              'step_cv': statistics.pstdev(steps) / statistics.mean(steps),
              'chief_step_ms': 1e3 * (t1 - t0) / (len(window) - 1),
              'cpu_cores': {n: sampler.secs(n, t0, t1) / (t1 - t0)
                            for n in procs}}
    if throttled:
      result['throttled'] = {}
      for n in procs:
        periods, hits = hosts.throttled(n)
        p0, h0 = throttled[n]
        result['throttled'][n] = (hits - h0) / max(1, periods - p0)
    return result
