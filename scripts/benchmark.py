#!/usr/bin/env python3
"""Measures the suite on this machine, side by side in one run.

Prints a Markdown table and writes the numbers as JSON:
- input pipeline records/s: the 16-thread queue pipeline, tf.data with the
  same decoding and preprocessing, and a numpy decode of the same bytes from
  memory (no augmentation: an upper bound);
- training images/s, steady state, summed over the workers: one process
  (--ps_hosts=), 1 ps + 1 worker, 1 ps + 2 workers and 2 ps + 2 workers,
  synchronous and asynchronous, one process and 1 ps + 2 workers with
  --mixed_precision, 1 ps + 2 workers with --transfer_dtype=bfloat16, each
  also as a ratio to the single process in the same round; --rounds rounds,
  the median reported; --only picks some of them;
- startup: seconds from launching a 1 ps + 2 worker synchronous cluster to
  its first step, minus the time to import TensorFlow; shutdown:
  from the last step to every process gone;
- bytes moved between a worker and the ps per step, and what that costs on
  1 Gb/s and 10 Gb/s networks;
- slow networks (root and iproute2): 1 and 2 ps + 2 synchronous workers,
  and 1 ps with bfloat16 transfers, every task a host of its own
  (network_namespaces.py), each worker on cores of its own, on unlimited
  links and on links limited to each --network_rates rate, in
  --network_rounds interleaved rounds; beside each limited run, the step
  scripts/plan_cluster.py predicts from the unlimited one, and its error;
  a PNG of images/s against the rate. Skipped, saying why, elsewhere.

Absolute numbers depend on the machine and whatever else runs on it; the
ratios, measured minutes apart on the same machine, are what to compare.

  python3 scripts/benchmark.py --quick
"""

import argparse
from datetime import datetime
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, 'scripts'))
from training import log_filter  # pylint: disable=g-import-not-at-top,wrong-import-position
if __name__ == '__main__':
  log_filter.install()  # Before TensorFlow loads: see training/log_filter.py.
  os.environ.setdefault('TF_USE_LEGACY_KERAS', '1')  # See import_seconds.

import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position
import tensorflow as tf  # pylint: disable=g-import-not-at-top,wrong-import-position

import cifar10_input  # pylint: disable=g-import-not-at-top,wrong-import-position
from training import cluster_runtime  # pylint: disable=g-import-not-at-top,wrong-import-position
import cpu_profile  # pylint: disable=g-import-not-at-top,wrong-import-position
import cifar10_model  # pylint: disable=g-import-not-at-top,wrong-import-position
from free_ports import free_ports  # pylint: disable=g-import-not-at-top,wrong-import-position
import network_namespaces  # pylint: disable=g-import-not-at-top,wrong-import-position
import plan_cluster  # pylint: disable=g-import-not-at-top,wrong-import-position
import make_synthetic_cifar10  # pylint: disable=g-import-not-at-top,wrong-import-position

tf1 = tf.compat.v1
NETWORK_RATES = '10000,1000,100'  # Mbit/s: 10 Gbit/s, 1 Gbit/s, 100 Mbit/s.
# Beside 2 workers, 8 with the same examples a step: 4 times the bytes per
# image, where the planner's model of the busiest link matters most.
NETWORK_WORKERS = '2,8'
# TensorFlow 2's own parameter-server training of the same network and
# files (scripts/tf2_peer.py): the first of a run's flags marks its rows.
PEER = os.path.join(ROOT, 'scripts', 'tf2_peer.py')
PEER_ROW = "TF2's ParameterServerStrategy, 1 ps + 2 workers (async)"
PEER_ROW_BARE = PEER_ROW + ', no moving averages'
QUEUE_INPUT = "queue, 16 threads (the trainer's)"
TFDATA_INPUT = 'tf.data, same decoding'
# --quick: the baseline, 1 ps + 2 workers synchronous and asynchronous, and
# TensorFlow 2's own asynchronous strategy beside them.
QUICK_RUNS = ('single process', '1 ps + 2 workers, sync',
              '1 ps + 2 workers, async', PEER_ROW)
TRAINER = os.path.join(ROOT, 'train_distributed.py')

PROGRESS = re.compile(r'^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6}): step (\d+), '
                      r'loss = ', re.M)


def cpu_model():
  """This machine's CPU, as /proc/cpuinfo names it."""
  try:
    with open('/proc/cpuinfo') as f:
      return next(l.split(':', 1)[1].strip() for l in f
                  if l.startswith('model name'))
  except (OSError, StopIteration):
    return platform.processor() or platform.machine()


def import_seconds(tries):
  """Wall time of a fresh `import tensorflow` (the best of tries), as the
  trainer imports it: without Keras 3 (TF_USE_LEGACY_KERAS, see
  train_distributed.py), 1-2 s less than a plain import."""
  times = []
  for _ in range(tries):
    start = time.time()
    subprocess.run([sys.executable, '-c', 'import tensorflow'], check=True,
                   capture_output=True,
                   env=dict(os.environ, TF_USE_LEGACY_KERAS='1'))
    times.append(time.time() - start)
  return min(times)


# --- Input pipeline ---------------------------------------------------------

def queue_records_per_sec(data_dir, batch_size, seconds):
  """The trainer's queue pipeline, as configured by default."""
  with tf.Graph().as_default():
    images, _ = cifar10_input.generate_batch_inputs(
        eval_data=False, shuffle=True, data_dir=data_dir,
        batch_size=batch_size)
    with tf1.train.MonitoredSession() as sess:
      return timed_batches(lambda: sess.run(images.op), batch_size, seconds,
                           QUEUE_INPUT)


def tfdata_records_per_sec(data_dir, batch_size, seconds):
  """FixedLengthRecordDataset with the same decoding and preprocessing."""
  files, _ = cifar10_input.check_data(data_dir, eval_data=False)

  def decode(values):
    records = tf1.decode_raw(values, tf.uint8)
    images = tf.transpose(tf.reshape(records[:, 1:], [-1, 3, 32, 32]),
                          [0, 2, 3, 1])
    return (cifar10_input.preprocess(images, True, True),
            tf.cast(records[:, 0], tf.int32))

  with tf.Graph().as_default():
    dataset = (tf.data.FixedLengthRecordDataset(files,
                                                cifar10_input.RECORD_BYTES)
               .repeat().batch(batch_size)
               .map(decode, num_parallel_calls=tf.data.AUTOTUNE)
               .prefetch(tf.data.AUTOTUNE))
    images, _ = tf1.data.make_one_shot_iterator(dataset).get_next()
    with tf1.Session() as sess:
      return timed_batches(lambda: sess.run(images.op), batch_size, seconds,
                           TFDATA_INPUT)


def numpy_records_per_sec(data_dir, seconds):
  """Decoding bytes already in memory to float32 HWC: the upper bound."""
  files, _ = cifar10_input.check_data(data_dir, eval_data=False)
  raw = b''.join(open(f, 'rb').read() for f in files)
  count, start = 0, time.time()
  while time.time() - start < seconds:
    records = np.frombuffer(raw, np.uint8).reshape(-1,
                                                   cifar10_input.RECORD_BYTES)
    images = records[:, 1:].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    images.astype(np.float32)
    records[:, 0].astype(np.int32)
    count += len(records)
  return count / (time.time() - start)


# {input pipeline: this process's CPU ms per record}, as timed_batches
# measured them.
INPUT_CPU_MS = {}


def timed_batches(run, batch_size, seconds, name=None):
  """Records/s of run() (a batch each); with name, also records this
  process's CPU ms per record in INPUT_CPU_MS."""
  for _ in range(3):  # Fill queues and caches first.
    run()
  count, start, cpu = 0, time.time(), time.process_time()
  while time.time() - start < seconds:
    run()
    count += batch_size
  if name:
    INPUT_CPU_MS[name] = 1e3 * (time.process_time() - cpu) / count
  return count / (time.time() - start)


# --- Training ---------------------------------------------------------------

def bytes_per_step():
  """Bytes a worker pulls (variables) and pushes (gradients) per step."""
  with tf.Graph().as_default():
    cifar10_model.inference(tf1.placeholder(tf.float32, [1, 32, 32, 3]))
    trainable = sum(int(np.prod(v.shape)) for v in tf1.trainable_variables())
  return {'trainable_parameters': trainable, 'pull': trainable * 4,
          'push': trainable * 4,
          # One ps holds everything; two hold what placement gives each.
          'largest_ps_share': plan_cluster.largest_shares(2)}


def training_tasks(num_ps, num_workers, network=None):
  """[(task, its cluster flags, its command prefix)] of a training run: one
  process for num_ps=0; else on free localhost ports, or with a
  network_namespaces.Network each task on a host of its own there and each
  worker on cores of its own (pinned_worker)."""
  tasks = []
  if num_ps == 0:
    tasks.append(('worker0', ['--ps_hosts='], []))
  else:
    names = (['ps%d' % i for i in range(num_ps)] +
             ['worker%d' % i for i in range(num_workers)])
    if network:
      addresses = [network.add_host(n, 10 + i) for i, n in enumerate(names)]
    else:
      addresses = ['localhost:%d' % p for p in free_ports(len(names))]
    hosts = ['--ps_hosts=' + ','.join(addresses[:num_ps]),
             '--worker_hosts=' + ','.join(addresses[num_ps:])]
    for task in names:
      job = task.rstrip('0123456789')
      index = task[len(job):]
      flags, prefix = hosts + ['--job_name=' + job, '--task_index=' + index], []
      if network:
        prefix = network.exec_prefix(task)
        if job == 'worker':
          cores, threads = pinned_worker(int(index), num_workers)
          prefix += ['taskset', '-c', cores]
          flags.append('--intra_op_threads=%d' % threads)
      tasks.append((task, flags, prefix))
  return tasks


def run_training(name, data_dir, work, num_ps, num_workers, steps,
                 batch_size, extra, network=None, perf=False):
  """Runs a training job in subprocesses; returns its measurements.

  With a network_namespaces.Network, each task runs on a host of its own
  there, and each worker on cores of its own (pinned_worker). With perf,
  `perf record -a` runs beside it, and its steady state's CPU is split by
  kind of work (cpu_profile).
  """
  train_dir = os.path.join(work, name)
  common = ['--data_dir=' + data_dir, '--train_dir=' + train_dir,
            '--max_steps=%d' % steps, '--batch_size=%d' % batch_size,
            '--log_frequency=1', '--save_checkpoint_steps=%d' % (steps * 10),
            '--save_summaries_steps=%d' % (steps * 10)] + extra
  tasks = training_tasks(num_ps, num_workers, network)
  launched = time.time()
  sampler = CpuSampler()
  recorder = cpu_profile.Recorder(os.path.join(work, name + '.perf'))
  if perf:
    recorder.start()
  try:
    run_tasks(name, work, [(task, prefix, flags + common)
                           for task, flags, prefix in tasks],
              timeout=60 + steps * 10, sampler=sampler)
  finally:
    recorder.stop()
  gone = time.time()
  lines = [progress_times(os.path.join(work, '%s-%s.log' % (name, task)))
           for task, _, _ in tasks if task.startswith('worker')]
  rate, window = steady_state(lines, batch_size)
  # A synchronous worker may get no step at all: others took its tokens.
  lines = [t for t in lines if t]
  result = {'images_per_sec': rate,
            'first_step_secs': min(t[0] for t in lines) - launched,
            'shutdown_secs': gone - max(t[-1] for t in lines),
            'cpu_ms_per_image': cpu_ms_per_image(sampler, *window)}
  if perf:
    result['perf_ms_per_image'] = cpu_profile.profile(
        recorder, {pid: 'ps' if task.startswith('ps') else 'workers'
                   for task, pid in sampler.pids.items()}, *window)
    os.remove(recorder.path)
  return result


def steady_state(lines, batch_size):
  """(images/s, (start, end, images)) of the second half of each
  worker's steps, from each worker's progress times. (In a short
  asynchronous run a late worker may get one step or none: it adds none.)
  The window is the span of those halves, and the images trained in it
  (each progress line in it is one of that worker's steps), over which
  the CPU is counted; (0, 0, 0) when there is none.
  """
  rate, halves = 0.0, []
  for times in lines:
    half = times[len(times) // 2:]
    if len(half) > 1:
      rate += (len(half) - 1) * batch_size / (half[-1] - half[0])
      halves.append(half)
  if not halves:
    return rate, (0.0, 0.0, 0)
  start, end = (min(h[0] for h in halves), max(h[-1] for h in halves))
  images = batch_size * sum(1 for times in lines for t in times
                            if start < t <= end)
  return rate, (start, end, images)


def run_peer(name, data_dir, work, steps, batch_size, flags):
  """TF2's ParameterServerStrategy on 1 ps + 2 workers (scripts/tf2_peer.py):
  the ps and worker servers, then its coordinator, which trains half the
  steps as a warmup and measures the other half. Returns its measurements,
  as run_training's (its first step: the end of the warmup)."""
  ports = free_ports(4)
  hosts = ['--ps_hosts=localhost:%d' % ports[0],
           '--worker_hosts=localhost:%d,localhost:%d' % tuple(ports[1:3]),
           '--chief_host=localhost:%d' % ports[3]]
  servers, sampler = {}, CpuSampler()
  launched = time.time()
  try:
    for task in ('ps0', 'worker0', 'worker1'):
      with open(os.path.join(work, '%s-%s.log' % (name, task)), 'w') as log:
        servers[task] = subprocess.Popen(
            [sys.executable, PEER, '--job_name=' + task[:-1],
             '--task_index=' + task[-1]] + hosts, stdout=log,
            stderr=subprocess.STDOUT)
    chief = subprocess.Popen(
        [sys.executable, PEER, '--job_name=chief', '--data_dir=' + data_dir,
         '--batch_size=%d' % batch_size, '--warmup_steps=%d' % (steps // 2),
         '--steps=%d' % (steps - steps // 2)] + hosts + flags,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sampler.start(dict({task: p.pid for task, p in servers.items()},
                       coordinator=chief.pid))
    try:
      out, _ = chief.communicate(timeout=60 + steps * 10)
    finally:
      sampler.stop()
      chief.kill()
      chief.wait()
  finally:
    for server in servers.values():  # They serve until killed.
      server.kill()
      server.wait()
  ended = time.time()
  if chief.returncode != 0:
    raise RuntimeError('%s: its coordinator exited with %d; the end of its '
                       'output:\n%s' % (name, chief.returncode, out[-3000:]))
  measured = json.loads([l for l in out.splitlines() if l.startswith('{')][-1])
  start, end = measured['warmup_done_at'], measured['ended_at']
  return {'images_per_sec': measured['images_per_sec'],
          'first_step_secs': start - launched,
          'shutdown_secs': ended - end,
          'cpu_ms_per_image': cpu_ms_per_image(
              sampler, start, end, measured['images_per_sec'] * (end - start))}


def pinned_worker(index, num_workers):
  """(cores for taskset, intra-op threads) of a worker on a host of its own.

  Hosts in network namespaces share this machine's cores; left to the
  scheduler, a worker waiting on the network lends its core to the other,
  which then computes faster than it would on a machine of its own. Pinned,
  each worker has its share of the cores whatever the others do, as on
  separate machines.
  """
  cores = sorted(os.sched_getaffinity(0))
  each = max(1, len(cores) // num_workers)
  start = (index * each) % len(cores)
  mine = cores[start:start + each]
  return ','.join(str(c) for c in mine), len(mine)


TICKS = os.sysconf('SC_CLK_TCK')


def tree_cpu_secs(pid):
  """CPU seconds (user + system) of a live process and its live
  descendants (a prefix such as `ip netns exec` may run the task as a
  child); 0 for what has gone.

  Only the main thread's children are looked for, where a prefix starts
  its command: reading the children of each of a trainer's 150 threads ten
  times a second cost the benchmark's own process 0.02 CPU ms per image of
  a 3-process cluster, and 0.003 of one process (`--perf`'s "other").
  """
  total = 0.0
  try:
    with open('/proc/%d/stat' % pid) as f:
      fields = f.read().rsplit(')', 1)[1].split()
    total += (int(fields[11]) + int(fields[12])) / TICKS
    with open('/proc/%d/task/%d/children' % (pid, pid)) as f:
      total += sum(tree_cpu_secs(int(c)) for c in f.read().split())
  except (OSError, IndexError, ValueError):
    pass
  return total


class CpuSampler:
  """Samples each task's CPU seconds every 0.1 s, so that the CPU a task
  spent in a window of the run (the steady state) can be read afterwards.
  """

  def __init__(self):
    self.pids, self.samples = {}, {}
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, daemon=True)

  def start(self, pids):
    """Starts sampling {task: pid}."""
    self.pids = dict(pids)
    self.samples = {task: [] for task in self.pids}
    self._thread.start()

  def _run(self):
    while not self._stop.is_set():
      for task, pid in self.pids.items():
        secs = tree_cpu_secs(pid)
        if secs:
          self.samples[task].append((time.time(), secs))
      self._stop.wait(0.1)

  def stop(self):
    self._stop.set()
    if self._thread.is_alive():
      self._thread.join()

  def secs(self, task, start, end):
    """The task's CPU seconds between two times (linear between samples)."""
    return (interpolate(self.samples[task], end) -
            interpolate(self.samples[task], start))


def interpolate(samples, at):
  """The CPU seconds a [(time, CPU seconds)] series reached at time at
  (0 for a task gone before its first sample)."""
  if not samples:
    return 0.0
  before = [s for s in samples if s[0] <= at] or samples[:1]
  after = [s for s in samples if s[0] >= at] or samples[-1:]
  (t0, c0), (t1, c1) = before[-1], after[0]
  return c0 if t1 == t0 else c0 + (c1 - c0) * (at - t0) / (t1 - t0)


def cpu_ms_per_image(sampler, start, end, images):
  """{task: its CPU ms per image trained between start and end}; {} when
  no image was."""
  if images <= 0:
    return {}
  return {task: 1e3 * sampler.secs(task, start, end) / images
          for task in sampler.samples}


def run_tasks(name, work, tasks, timeout, sampler=None):
  """Starts the trainer once per (task, command prefix, flags); waits for
  all to exit 0.

  Raises:
    RuntimeError: with the end of the log of a task that failed or hung.
  """
  procs = {}
  try:
    for task, prefix, flags in tasks:
      with open(os.path.join(work, '%s-%s.log' % (name, task)), 'w') as log:
        procs[task] = subprocess.Popen(
            prefix + [sys.executable, TRAINER] + flags, stdout=log,
            stderr=subprocess.STDOUT)
    if sampler:
      sampler.start({task: proc.pid for task, proc in procs.items()})
    for task, proc in procs.items():
      try:
        code = proc.wait(timeout=timeout)
      except subprocess.TimeoutExpired:
        code = 'still running after %d s' % timeout
      if code != 0:
        with open(os.path.join(work, '%s-%s.log' % (name, task))) as f:
          tail = f.read()[-3000:]
        raise RuntimeError('%s: %s exited with %s; the end of its log:\n%s' %
                           (name, task, code, tail))
  finally:
    if sampler:
      sampler.stop()
    for proc in procs.values():
      if proc.poll() is None:
        proc.kill()
        proc.wait()


def progress_times(log_path):
  """The times of the progress lines in a worker's log."""
  with open(log_path) as f:
    return [datetime.strptime(t, '%Y-%m-%d %H:%M:%S.%f').timestamp()
            for t, _ in PROGRESS.findall(f.read())]


# --- Slow networks ----------------------------------------------------------

def train_over_links(data_dir, work, steps, batch_sizes, rates, extra,
                     wire_dtypes=('float32',), rounds=1, ps_counts=(1, 2),
                     worker_counts=(2,)):
  """Each of ps_counts ps + 2 synchronous workers, every task a host of its
  own on links of each rate (Mbit/s; None: unlimited), at each batch size,
  and 1 ps with each other --transfer_dtype of wire_dtypes; then, for each
  other count N of worker_counts, ps_counts ps + N workers with the same
  examples a step (a batch of 2 / N of each size): N / 2 times the bytes
  an image, the regime where the network bounds the step. Rounds times,
  interleaved. Returns {'runs': [one dict a run: its shape, its ms per step
  in each round and their median]}, or {'skipped': why}.

  The hosts share this machine's cores, each worker pinned to its share
  (pinned_worker): on 2 cores, one core each, as two 1-core machines (the
  ps tasks float over both); 8 workers, 4 to a core. The unlimited link
  measures the step the planner starts from: the same cluster when the
  network costs nothing.
  """
  why = network_namespaces.why_unavailable() or (
      None if rates else 'no --network_rates given')
  measured = {link: [] for link in network_links(
      batch_sizes, rates, wire_dtypes, ps_counts, worker_counts)}
  for i in range(0 if why else rounds):
    for link in measured:
      batch_size, mbit, num_ps, dtype, num_workers = link
      name = link_run_name(*link)
      print('Slow networks, round %d of %d: %s...' % (i + 1, rounds, name),
            flush=True)
      network = network_namespaces.Network(rate_mbit=mbit)
      try:
        network.make_hub()
      except RuntimeError as e:
        network.close()
        why = 'cannot make network namespaces here: %s' % e
        break
      try:
        measured[link].append(run_training(
            '%s_%d' % (re.sub(r'\W+', '_', name), i), data_dir, work, num_ps,
            num_workers, steps, batch_size,
            extra + ['--transfer_dtype=' + dtype], network))
      finally:
        network.close()
    if why:
      break
  if why:
    print('Slow networks: skipped, %s' % why, flush=True)
    return {'skipped': why}
  runs = []
  for link, each_round in measured.items():
    batch_size, mbit, num_ps, dtype, num_workers = link
    images = num_workers * batch_size  # A step's, all workers'.
    ms = [1e3 * images / r['images_per_sec'] for r in each_round]
    runs.append({'name': link_run_name(*link), 'num_ps': num_ps,
                 'num_workers': num_workers, 'mbit': mbit,
                 'batch_size': batch_size, 'transfer_dtype': dtype,
                 'ms_per_step': statistics.median(ms),
                 'ms_per_step_rounds': ms,
                 'images_per_sec': 1e3 * images / statistics.median(ms)})
  return {'runs': runs}


def network_links(batch_sizes, rates, wire_dtypes, ps_counts, worker_counts):
  """The slow-network runs train_over_links makes, each a tuple (batch size,
  Mbit/s or None, ps tasks, --transfer_dtype, workers)."""
  links = [(b, m, p, d, 2) for b in batch_sizes for m in [None] + rates
           for p, d in [(p, 'float32') for p in ps_counts] + [
               (1, d) for d in wire_dtypes if d != 'float32']]
  return links + [(max(1, b * 2 // n), m, p, 'float32', n)
                  for n in worker_counts if n != 2 for b in batch_sizes
                  for m in [None] + rates for p in ps_counts]


def link_run_name(batch_size, mbit, num_ps, dtype, num_workers=2):
  """A slow-network run's name in the table, e.g. '1 ps + 2 workers, sync,
  100 Mbit/s, batch 64'."""
  return '%d ps + %d workers, sync, %s, batch %d%s' % (
      num_ps, num_workers, link_name(mbit), batch_size,
      '' if dtype == 'float32' else ', %s transfers' % dtype)


def measure_networks(args, data_dir, work, extra, bytes_):
  """The slow-network runs the command line asks for; returns (their batch
  sizes, their measurements with predictions)."""
  rates = args.network_rates if not (
      args.quick and args.network_rates == NETWORK_RATES) else '100'
  batch_sizes = ([int(b) for b in args.network_batch_sizes.split(',')]
                 if args.network_batch_sizes else [max(1, args.batch_size // 2)])
  network = train_over_links(
      data_dir, work, args.network_steps or (10 if args.quick else 60),
      batch_sizes, sorted({int(r) for r in rates.split(',') if r},
                          reverse=True), extra,
      ['float32'] if args.quick else args.network_transfer_dtypes.split(','),
      args.network_rounds or (1 if args.quick else 3),
      (1,) if args.quick else (1, 2),
      args.network_workers)
  predict_network(network, bytes_)
  return batch_sizes, network


def link_name(mbit):
  if mbit is None:
    return 'unlimited'
  return '%g Gbit/s' % (mbit / 1000) if mbit >= 1000 else '%d Mbit/s' % mbit


def predict_network(network, bytes_):
  """Adds to each limited run the planner's prediction, from the unlimited
  run of the same shape (plan_cluster.predict_step_ms), and its error; and
  to each run but the 1 ps float32 one its speed-up over that one."""
  def shape(run, **change):
    keys = ('num_workers', 'batch_size', 'num_ps', 'transfer_dtype', 'mbit')
    return tuple(change.get(k, run[k]) for k in keys)

  by_shape = {shape(r): r for r in network.get('runs', [])}
  for run in network.get('runs', []):
    free = by_shape[shape(run, mbit=None)]
    if run['mbit'] is not None:
      run['predicted_ms'] = plan_cluster.predict_step_ms(
          free['ms_per_step'], bytes_['pull'],
          bytes_['largest_ps_share'][run['num_ps']], run['num_workers'],
          run['mbit'], tf.as_dtype(run['transfer_dtype']).size)
      run['prediction_error'] = run['predicted_ms'] / run['ms_per_step'] - 1
    base = by_shape[shape(run, num_ps=1, transfer_dtype='float32')]
    if run is not base:
      run['speedup_over_1_ps'] = (run['images_per_sec'] /
                                  base['images_per_sec'])


def plot_network(network, path):
  """Images/s against link rate, a line per ps count and batch, and the
  planner's predictions as crosses (PNG)."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, ax = plt.subplots(figsize=(6, 4))
  def line_of(r):
    return r['num_workers'], r['batch_size'], r['num_ps'], r['transfer_dtype']

  for num_workers, batch_size, num_ps, dtype in sorted(
      {line_of(r) for r in network['runs']}, reverse=True):
    runs = sorted((r for r in network['runs'] if line_of(r) == (
        num_workers, batch_size, num_ps, dtype) and r['mbit'] is not None),
                  key=lambda r: r['mbit'])
    line, = ax.plot([r['mbit'] for r in runs],
                    [r['images_per_sec'] for r in runs],
                    marker='s' if num_workers != 2 else 'o',
                    linestyle='-' if num_ps == 2 else ':' if dtype != 'float32'
                    else '--', label='%d ps + %d workers, batch %d%s' % (
                        num_ps, num_workers, batch_size,
                        '' if dtype == 'float32' else ', %s transfers' % dtype))
    ax.plot([r['mbit'] for r in runs if 'predicted_ms' in r],
            [1e3 * num_workers * batch_size / r['predicted_ms'] for r in runs
             if 'predicted_ms' in r], marker='x', markersize=9,
            linestyle='none', color=line.get_color())
  ax.plot([], [], marker='x', linestyle='none', color='gray',
          label="the planner's prediction")
  ax.set_xscale('log')
  ax.set_xlabel('link rate of every task (Mbit/s)')
  ax.set_ylabel('images/s (all workers)')
  ax.set_ylim(bottom=0)
  ax.grid(True, which='both', alpha=0.3)
  ax.legend(fontsize='small', loc='lower right')
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def markdown(results):
  """Formats the results as Markdown tables."""
  bf16 = results['cpu_bf16']
  out = ['Machine: %s, %d cores (bfloat16 instructions: %s); TensorFlow %s; '
         'batch %d; %d steps per training run.' % (
             results['machine'], results['cores'],
             ', '.join(bf16) if bf16 else 'none' if bf16 is not None else
             'unknown', results['tensorflow'], results['batch_size'],
             results['steps']), '',
         '| input pipeline | records/s | x training needs |', '|---|---|---|']
  need = results['training']['single process']['images_per_sec']
  cpu = results['input_cpu_ms_per_record']
  out[-2:] = ['| input pipeline | records/s | x training needs | CPU ms per '
              'record |', '|---|---|---|---|']
  for name, rate in results['input'].items():
    out.append('| %s | %.0f | %.1fx | %s |' % (
        name, rate, rate / need, '%.3f' % cpu[name] if name in cpu else ''))
  out += ['', '| training (median of %d rounds) | images/s | x single '
          'process | x in each round |' % results['rounds'],
          '|---|---|---|---|']
  for name, r in results['training'].items():
    per_gpu = ('; %.0f per GPU' % r['images_per_gpu']
               if 'images_per_gpu' in r else '')
    out.append('| %s | %.0f%s | %.2fx | %s |' % (
        name, r['images_per_sec'], per_gpu, r['ratio'],
        ', '.join('%.2f' % x for x in r['ratios'])))
  out += peer_markdown(results['training']) + cpu_markdown(
      results['training']) + perf_markdown(results['training'])
  s = results['startup']
  b = results['bytes']
  out += ['', '| startup and shutdown (1 ps + 2 workers, sync) | seconds |',
          '|---|---|',
          '| import TensorFlow | %.1f |' % s['import_secs'],
          '| launch to the first step (any worker) | %.1f |' % s['first_step_secs'],
          '| the same, beyond importing TensorFlow | %.1f |' %
          s['first_step_beyond_import_secs'],
          '| last step to every process gone | %.1f |' % s['shutdown_secs'],
          '', '| bytes per worker per step | value |', '|---|---|',
          '| trainable parameters | %d |' % b['trainable_parameters'],
          '| pulled (variables) + pushed (gradients) | %.2f MB |' %
          ((b['pull'] + b['push']) / 1e6),
          '| on 1 Gb/s | %.1f ms |' % b['ms_at_1gbps'],
          '| on 10 Gb/s | %.2f ms |' % b['ms_at_10gbps']]
  return '\n'.join(out + network_markdown(results['network']))


def against_peer(training):
  """{our row: (median, [per round]) of its images/s over TF2's strategy's
  (PEER_ROW) in the same round}, for every row measured beside it."""
  if PEER_ROW not in training:
    return {}
  peer = training[PEER_ROW]['ratios']
  return {name: (statistics.median(r / p for r, p in zip(run['ratios'],
                                                          peer)),
                 [r / p for r, p in zip(run['ratios'], peer)])
          for name, run in training.items() if name != PEER_ROW}


def peer_markdown(training):
  """The table of every row against TF2's strategy; none without it."""
  ratios = against_peer(training)
  if not ratios:
    return []
  out = ['', "| against TF2's ParameterServerStrategy (1 ps + 2 workers, the "
         'same step) | x TF2 | x in each round |', '|---|---|---|']
  for name, (median, rounds) in ratios.items():
    out.append('| %s | %.2fx | %s |' % (name, median, ', '.join(
        '%.2f' % x for x in rounds)))
  return out


def cpu_markdown(training):
  """Each run's CPU ms per image trained in its steady state, by process."""
  out = ['', '| CPU ms per image, steady state (median of the rounds) | ps | '
         'workers | coordinator | all |', '|---|---|---|---|---|']
  for name, run in training.items():
    ms = run['cpu_ms_per_image']
    if not ms:
      out.append('| %s | | | | no steady state measured |' % name)
      continue
    ps = sum(v for k, v in ms.items() if k.startswith('ps'))
    workers = sum(v for k, v in ms.items() if k.startswith('worker'))
    out.append('| %s | %s | %.2f | %s | %.2f |' % (
        name, '%.2f' % ps if any(k.startswith('ps') for k in ms) else '',
        workers, '%.2f' % ms['coordinator'] if 'coordinator' in ms else '',
        sum(ms.values())))
  return out


def median_cpu(runs):
  """{task: the median over the runs of its CPU ms per image}, of the runs
  that measured a steady state."""
  cpu = [r['cpu_ms_per_image'] for r in runs if r['cpu_ms_per_image']]
  return {task: statistics.median(c[task] for c in cpu)
          for task in (cpu[0] if cpu else ())}


def median_profile(profiles):
  """The median over the rounds of each {group: {kind: ms}} entry (a
  kind a round did not sample counts 0 there)."""
  groups = {g for p in profiles for g in p}
  return {g: {k: statistics.median(p.get(g, {}).get(k, 0.0)
                                   for p in profiles)
              for k in {k for p in profiles for k in p.get(g, {})}}
          for g in groups}


def perf_markdown(training):
  """With --perf: each run's CPU ms per image in its steady state, by
  group of processes and kind of work; none without."""
  runs = {n: r['perf_ms_per_image'] for n, r in training.items()
          if 'perf_ms_per_image' in r}
  if not runs:
    return []
  out = ['', '| perf: CPU ms per image, steady state (median of the rounds) '
         '| %s | all |' % ' | '.join(cpu_profile.ORDER),
         '|---|' + '---|' * (len(cpu_profile.ORDER) + 1)]
  for name, groups in runs.items():
    for group in ('workers', 'ps', 'other', 'idle'):
      if group in groups:
        row = groups[group]
        out.append('| %s: %s | %s | %.3f |' % (
            name, group, ' | '.join('%.3f' % row.get(k, 0.0)
                                    for k in cpu_profile.ORDER),
            sum(row.values())))
  return out


def network_markdown(network):
  """The slow-network table, or the line that says why there is none."""
  if 'skipped' in network:
    return ['', 'Slow networks: not measured (%s).' % network['skipped']]
  rounds = len(network['runs'][0]['ms_per_step_rounds'])
  out = ['', '| every task on its own link (median of %d round%s) | images/s '
         '| ms per step | planner, ms | planner error | x 1 ps, float32 |' % (
             rounds, '' if rounds == 1 else 's'),
         '|---|---|---|---|---|---|']
  for r in network['runs']:
    out.append('| %s | %.0f | %.0f | %s | %s | %s |' % (
        r['name'], r['images_per_sec'], r['ms_per_step'],
        '%.0f' % r['predicted_ms'] if 'predicted_ms' in r else '',
        '%+.0f%%' % (100 * r['prediction_error'])
        if 'prediction_error' in r else '',
        '%.2fx' % r['speedup_over_1_ps'] if 'speedup_over_1_ps' in r
        else ''))
  return out


def parse_args(argv):
  """The command line."""
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--quick', action='store_true',
                      help='one round of three configurations, fewer steps '
                      'and shorter timings (under 3 minutes '
                      'on 2 cores)')
  parser.add_argument('--data_dir', help='CIFAR-10 binary files (default: a '
                      'synthetic set made in a temporary directory)')
  parser.add_argument('--batch_size', type=int, default=128)
  parser.add_argument('--steps', type=int,
                      help='global steps per training run (default: 40 with '
                      '--quick, 120 without)')
  parser.add_argument('--rounds', type=int,
                      help='times each training configuration runs, '
                      'interleaved; the median counts (default: 1 with '
                      '--quick, 3 without)')
  parser.add_argument('--num_gpus', type=int, default=0,
                      help='GPUs per machine, passed to the trainer')
  add_network_args(parser)
  parser.add_argument('--perf', action='store_true',
                      help='split each training run\'s CPU in its steady '
                      'state by process and kind of work (oneDNN, gRPC, '
                      'the kernel...) with `perf record -a`: needs perf and '
                      'root (scripts/cpu_profile.py)')
  parser.add_argument('--only',
                      help='a regular expression: train only the '
                      'configurations whose name it finds, and the single '
                      'process, e.g. "mixed precision"')
  parser.add_argument('--plot', default='benchmark_network.png',
                      help='where to draw images/s against link rate '
                      '(default: %(default)s)')
  parser.add_argument('--json', default='benchmark.json',
                      help='where to write the numbers (default: '
                      '%(default)s)')
  return check_args(parser, parser.parse_args(argv))


def add_network_args(parser):
  """The slow-network runs' flags."""
  parser.add_argument('--network_rates', default=NETWORK_RATES,
                      help='link rates in Mbit/s for the slow-network runs '
                      '(needs root and iproute2; empty: none; default: '
                      '%(default)s, with --quick 100)')
  parser.add_argument('--network_steps', type=int,
                      help='global steps per slow-network run (default: 10 '
                      'with --quick, 60 without)')
  parser.add_argument('--network_batch_sizes',
                      help='batches per worker in the slow-network runs, '
                      'comma-separated (default: half of --batch_size, what '
                      'each of 2 pinned workers computes in the time one '
                      'process computes the whole)')
  parser.add_argument('--network_rounds', type=int,
                      help='times each slow-network run runs, interleaved; '
                      'the median counts (default: 1 with --quick, 3 '
                      'without)')
  parser.add_argument('--network_workers', default=NETWORK_WORKERS,
                      help='worker counts of the slow-network runs; a count '
                      'N other than 2 trains a batch of 2 / N of each of '
                      '--network_batch_sizes, the same examples a step '
                      '(default: %(default)s, with --quick 2)')
  parser.add_argument('--network_transfer_dtypes', default='float32,bfloat16',
                      help='--transfer_dtype values of the 1 ps slow-network '
                      'runs (default: %(default)s, with --quick float32)')


def check_args(parser, args):
  """Refuses counts below 1, in one line; returns args with
  --network_workers as a sorted list of counts."""
  given = args.network_workers
  if args.quick and given == NETWORK_WORKERS:
    given = '2'
  if not re.fullmatch(r'[1-9]\d*(,[1-9]\d*)*', given):
    parser.error('--network_workers must be worker counts of 1 or more, '
                 'comma-separated, e.g. 2,8 (got "%s")' % given)
  args.network_workers = sorted({int(n) for n in given.split(',')})
  missing = args.perf and cpu_profile.unavailable()
  if missing:
    parser.error('--perf: %s; run without it, or where perf may record '
                 'every CPU (as root)' % missing)
  for name in ('rounds', 'network_rounds', 'steps', 'network_steps'):
    if getattr(args, name) is not None and getattr(args, name) < 1:
      parser.error('--%s must be 1 or more, got %d' % (name,
                                                       getattr(args, name)))
  return args


def main(argv=None):
  args = parse_args(argv)
  tf1.disable_eager_execution()
  tf.get_logger().setLevel('ERROR')
  steps = args.steps or (40 if args.quick else 120)
  seconds = 1 if args.quick else 10
  extra = ['--num_gpus=%d' % args.num_gpus] if args.num_gpus else []

  with tempfile.TemporaryDirectory(prefix='cifar10-benchmark-') as work:
    data_dir = args.data_dir
    if not data_dir:
      data_dir = os.path.join(work, 'data')
      make_synthetic_cifar10.main(['--data_dir', data_dir, '--train_records',
                                   '2000', '--test_records', '100'])
    results = {'machine': cpu_model(),
               'cpu_bf16': cluster_runtime.cpu_bf16_flags(),
               'cores': len(os.sched_getaffinity(0)),
               'tensorflow': tf.__version__, 'batch_size': args.batch_size,
               'steps': steps, 'num_gpus': args.num_gpus,
               'rounds': args.rounds or (1 if args.quick else 3)}
    print('Input pipelines...', flush=True)
    results['input'] = {
        QUEUE_INPUT: queue_records_per_sec(data_dir, args.batch_size,
                                           seconds),
        TFDATA_INPUT: tfdata_records_per_sec(data_dir, args.batch_size,
                                             seconds),
        'numpy decode from memory (bound)': numpy_records_per_sec(data_dir,
                                                                  seconds),
    }
    results['input_cpu_ms_per_record'] = dict(INPUT_CPU_MS)
    results['training'] = train_all(data_dir, work, steps, args.batch_size,
                                    extra, args.num_gpus, results['rounds'],
                                    args.quick, args.only, args.perf)
    results['against_tf2'] = {name: {'ratio': median, 'ratios': rounds}
                              for name, (median, rounds) in against_peer(
                                  results['training']).items()}
    sync = results['training'].get('1 ps + 2 workers, sync',
                                   results['training']['single process'])
    imports = import_seconds(1 if args.quick else 2)
    results['startup'] = {
        'import_secs': imports,
        'first_step_secs': sync['first_step_secs'],
        'first_step_beyond_import_secs': sync['first_step_secs'] - imports,
        'shutdown_secs': sync['shutdown_secs']}
    b = bytes_per_step()
    bits = (b['pull'] + b['push']) * 8
    b['ms_at_1gbps'] = bits / 1e9 * 1e3
    b['ms_at_10gbps'] = bits / 1e10 * 1e3
    results['bytes'] = b
    results['network_batch_sizes'], results['network'] = measure_networks(
        args, data_dir, work, extra, b)
  if results['network'].get('runs'):
    plot_network(results['network'], args.plot)
    print('Wrote %s' % args.plot)
  table = markdown(results)
  print(table)
  with open(args.json, 'w') as f:
    json.dump(results, f, indent=2)
  print('\nWrote %s' % args.json)
  return 0


def train_all(data_dir, work, steps, batch_size, extra, num_gpus, rounds,
              quick, only=None, perf=False):
  """Runs the training configurations (with quick, those of QUICK_RUNS),
  round after round; returns {name: measurements}, each the median of the
  rounds.

  One round runs each configuration once, so a slow minute of the machine
  weighs on all configurations of a round alike; a ratio to the single
  process is taken within a round, and its median over the rounds is the
  one reported.
  """
  runs = [('single process', 0, 1, []),
          ('single process, mixed precision', 0, 1, ['--mixed_precision']),
          ('1 ps + 1 worker', 1, 1, []),
          ('1 ps + 2 workers, sync', 1, 2, []),
          ('1 ps + 2 workers, sync, mixed precision', 1, 2,
           ['--mixed_precision']),
          ('1 ps + 2 workers, sync, bfloat16 transfers', 1, 2,
           ['--transfer_dtype=bfloat16']),
          ('1 ps + 2 workers, async', 1, 2, ['--nosync_replicas']),
          ('2 ps + 2 workers, sync', 2, 2, []),
          ('2 ps + 2 workers, async', 2, 2, ['--nosync_replicas']),
          (PEER_ROW, 1, 2, [PEER, '--moving_averages']),
          (PEER_ROW_BARE, 1, 2, [PEER])]
  if only:  # The single process stays: the ratios are to it.
    runs = [r for r in runs if r[0] == 'single process' or
            re.search(only, r[0])]
  elif quick:
    runs = [r for r in runs if r[0] in QUICK_RUNS]
  measured = {name: [] for name, _, _, _ in runs}
  for i in range(rounds):
    for name, num_ps, num_workers, flags in runs:
      print('Training, round %d of %d: %s...' % (i + 1, rounds, name),
            flush=True)
      run_name = '%s_%d' % (re.sub(r'\W+', '_', name), i)
      if flags[:1] == [PEER]:
        measured[name].append(run_peer(run_name, data_dir, work, steps,
                                       batch_size, flags[1:]))
      else:
        measured[name].append(run_training(
            run_name, data_dir, work, num_ps, num_workers, steps, batch_size,
            flags + extra, perf=perf))
  training = {}
  for name, _, num_workers, flags in runs:
    ratios = [r['images_per_sec'] / s['images_per_sec'] for r, s in
              zip(measured[name], measured['single process'])]
    training[name] = {
        key: statistics.median(r[key] for r in measured[name])
        for key in ('images_per_sec', 'first_step_secs', 'shutdown_secs')}
    training[name]['cpu_ms_per_image'] = median_cpu(measured[name])
    training[name].update(ratio=statistics.median(ratios), ratios=ratios)
    if perf and flags[:1] != [PEER]:
      training[name]['perf_ms_per_image'] = median_profile(
          [r['perf_ms_per_image'] for r in measured[name]])
    if num_gpus:
      training[name]['images_per_gpu'] = (training[name]['images_per_sec'] /
                                          min(num_workers, num_gpus))
  return training


if __name__ == '__main__':
  sys.exit(main())
