#!/usr/bin/env python3
"""Measures the suite on this machine, side by side in one run.

Prints a Markdown table and writes the numbers as JSON:
- input pipeline records/s: the 16-thread queue pipeline, tf.data with the
  same decoding and preprocessing, and a numpy decode of the same bytes from
  memory (no augmentation: an upper bound);
- training images/s, steady state, summed over the workers: one process
  (--ps_hosts=), 1 ps + 1 worker, 1 ps + 2 workers and 2 ps + 2 workers,
  synchronous and asynchronous, each also as a ratio to the single process;
- startup: seconds from launching a 1 ps + 2 worker synchronous cluster to
  its first step, minus the time to import TensorFlow; shutdown:
  from the last step to every process gone;
- bytes moved between a worker and the ps per step, and what that costs on
  1 Gb/s and 10 Gb/s networks.

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
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, 'scripts'))
import tf_log_filter  # pylint: disable=g-import-not-at-top,wrong-import-position
if __name__ == '__main__':
  tf_log_filter.install()  # Before TensorFlow loads: see tf_log_filter.py.

import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position
import tensorflow as tf  # pylint: disable=g-import-not-at-top,wrong-import-position

import cifar10_input  # pylint: disable=g-import-not-at-top,wrong-import-position
import cifar10_model  # pylint: disable=g-import-not-at-top,wrong-import-position
from free_ports import free_ports  # pylint: disable=g-import-not-at-top,wrong-import-position
import make_synthetic_cifar10  # pylint: disable=g-import-not-at-top,wrong-import-position

tf1 = tf.compat.v1
TRAINER = os.path.join(ROOT, 'train_distributed.py')
PROGRESS = re.compile(r'^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6}): step (\d+), '
                      r'loss = ', re.M)


def import_seconds():
  """Wall time of a fresh `import tensorflow` (the best of two)."""
  times = []
  for _ in range(2):
    start = time.time()
    subprocess.run([sys.executable, '-c', 'import tensorflow'], check=True,
                   capture_output=True)
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
      return timed_batches(lambda: sess.run(images.op), batch_size, seconds)


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
      return timed_batches(lambda: sess.run(images.op), batch_size, seconds)


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


def timed_batches(run, batch_size, seconds):
  for _ in range(3):  # Fill queues and caches first.
    run()
  count, start = 0, time.time()
  while time.time() - start < seconds:
    run()
    count += batch_size
  return count / (time.time() - start)


# --- Training ---------------------------------------------------------------

def bytes_per_step():
  """Bytes a worker pulls (variables) and pushes (gradients) per step."""
  with tf.Graph().as_default():
    cifar10_model.inference(tf1.placeholder(tf.float32, [1, 32, 32, 3]))
    trainable = sum(int(np.prod(v.shape)) for v in tf1.trainable_variables())
  return {'trainable_parameters': trainable, 'pull': trainable * 4,
          'push': trainable * 4}


def run_training(name, data_dir, work, num_ps, num_workers, steps,
                 batch_size, extra):
  """Runs a training job in subprocesses; returns its measurements."""
  train_dir = os.path.join(work, name)
  common = ['--data_dir=' + data_dir, '--train_dir=' + train_dir,
            '--max_steps=%d' % steps, '--batch_size=%d' % batch_size,
            '--log_frequency=1', '--save_checkpoint_steps=%d' % (steps * 10),
            '--save_summaries_steps=%d' % (steps * 10)] + extra
  tasks = []
  if num_ps == 0:
    tasks.append(('worker0', ['--ps_hosts=']))
  else:
    ports = free_ports(num_ps + num_workers)
    hosts = ['--ps_hosts=' + ','.join('localhost:%d' % p
                                     for p in ports[:num_ps]),
             '--worker_hosts=' + ','.join('localhost:%d' % p
                                         for p in ports[num_ps:])]
    tasks += [('ps%d' % i, hosts + ['--job_name=ps', '--task_index=%d' % i])
              for i in range(num_ps)]
    tasks += [('worker%d' % i, hosts + ['--job_name=worker',
                                        '--task_index=%d' % i])
              for i in range(num_workers)]
  launched = time.time()
  run_tasks(name, work, [(task, flags + common) for task, flags in tasks],
            timeout=60 + steps * 10)
  gone = time.time()
  lines = [progress_times(os.path.join(work, '%s-%s.log' % (name, task)))
           for task, _ in tasks if task.startswith('worker')]
  # Steady state: the second half of each worker's steps. (In a short
  # asynchronous run a late worker may get one step or none: it adds none.)
  rate = 0.0
  for times in lines:
    half = times[len(times) // 2:]
    if len(half) > 1:
      rate += (len(half) - 1) * batch_size / (half[-1] - half[0])
  # A synchronous worker may get no step at all: others took its tokens.
  lines = [t for t in lines if t]
  return {'images_per_sec': rate,
          'first_step_secs': min(t[0] for t in lines) - launched,
          'shutdown_secs': gone - max(t[-1] for t in lines)}


def run_tasks(name, work, tasks, timeout):
  """Starts the trainer once per (task, flags); waits for all to exit 0.

  Raises:
    RuntimeError: with the end of the log of a task that failed or hung.
  """
  procs = {}
  try:
    for task, flags in tasks:
      with open(os.path.join(work, '%s-%s.log' % (name, task)), 'w') as log:
        procs[task] = subprocess.Popen([sys.executable, TRAINER] + flags,
                                       stdout=log, stderr=subprocess.STDOUT)
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
    for proc in procs.values():
      if proc.poll() is None:
        proc.kill()
        proc.wait()


def progress_times(log_path):
  """The times of the progress lines in a worker's log."""
  with open(log_path) as f:
    return [datetime.strptime(t, '%Y-%m-%d %H:%M:%S.%f').timestamp()
            for t, _ in PROGRESS.findall(f.read())]


def markdown(results):
  """Formats the results as Markdown tables."""
  out = ['Machine: %s, %d cores; TensorFlow %s; batch %d; %d steps per '
         'training run.' % (results['machine'], results['cores'],
                            results['tensorflow'], results['batch_size'],
                            results['steps']), '',
         '| input pipeline | records/s | x training needs |', '|---|---|---|']
  need = results['training']['single process']['images_per_sec']
  for name, rate in results['input'].items():
    out.append('| %s | %.0f | %.1fx |' % (name, rate, rate / need))
  out += ['', '| training | images/s | x single process |', '|---|---|---|']
  for name, r in results['training'].items():
    per_gpu = ('; %.0f per GPU' % r['images_per_gpu']
               if 'images_per_gpu' in r else '')
    out.append('| %s | %.0f%s | %.2fx |' % (name, r['images_per_sec'],
                                             per_gpu, r['ratio']))
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
  return '\n'.join(out)


def parse_args(argv):
  """The command line."""
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--quick', action='store_true',
                      help='fewer steps and shorter timings (under 2 minutes '
                      'on 2 cores)')
  parser.add_argument('--data_dir', help='CIFAR-10 binary files (default: a '
                      'synthetic set made in a temporary directory)')
  parser.add_argument('--batch_size', type=int, default=128)
  parser.add_argument('--steps', type=int,
                      help='global steps per training run (default: 40 with '
                      '--quick, 200 without)')
  parser.add_argument('--num_gpus', type=int, default=0,
                      help='GPUs per machine, passed to the trainer')
  parser.add_argument('--json', default='benchmark.json',
                      help='where to write the numbers (default: '
                      '%(default)s)')
  return parser.parse_args(argv)


def main(argv=None):
  args = parse_args(argv)
  tf1.disable_eager_execution()
  tf.get_logger().setLevel('ERROR')
  steps = args.steps or (40 if args.quick else 200)
  seconds = 3 if args.quick else 10
  extra = ['--num_gpus=%d' % args.num_gpus] if args.num_gpus else []

  with tempfile.TemporaryDirectory(prefix='cifar10-benchmark-') as work:
    data_dir = args.data_dir
    if not data_dir:
      data_dir = os.path.join(work, 'data')
      make_synthetic_cifar10.main(['--data_dir', data_dir, '--train_records',
                                   '2000', '--test_records', '100'])
    results = {'machine': platform.processor() or platform.machine(),
               'cores': len(os.sched_getaffinity(0)),
               'tensorflow': tf.__version__, 'batch_size': args.batch_size,
               'steps': steps, 'num_gpus': args.num_gpus}
    print('Input pipelines...', flush=True)
    results['input'] = {
        'queue, 16 threads (the trainer\'s)': queue_records_per_sec(
            data_dir, args.batch_size, seconds),
        'tf.data, same decoding': tfdata_records_per_sec(
            data_dir, args.batch_size, seconds),
        'numpy decode from memory (bound)': numpy_records_per_sec(data_dir,
                                                                  seconds),
    }
    results['training'] = train_all(data_dir, work, steps, args.batch_size,
                                    extra, args.num_gpus)
    sync = results['training']['1 ps + 2 workers, sync']
    imports = import_seconds()
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
  table = markdown(results)
  print(table)
  with open(args.json, 'w') as f:
    json.dump(results, f, indent=2)
  print('\nWrote %s' % args.json)
  return 0


def train_all(data_dir, work, steps, batch_size, extra, num_gpus):
  """Runs every training configuration; returns {name: measurements}."""
  runs = [('single process', 0, 1, []),
          ('1 ps + 1 worker', 1, 1, []),
          ('1 ps + 2 workers, sync', 1, 2, []),
          ('1 ps + 2 workers, async', 1, 2, ['--nosync_replicas']),
          ('2 ps + 2 workers, sync', 2, 2, []),
          ('2 ps + 2 workers, async', 2, 2, ['--nosync_replicas'])]
  training = {}
  for name, num_ps, num_workers, flags in runs:
    print('Training: %s...' % name, flush=True)
    training[name] = run_training(
        name.replace(' ', '_').replace(',', ''), data_dir, work, num_ps,
        num_workers, steps, batch_size, flags + extra)
  single = training['single process']['images_per_sec']
  for (name, _, num_workers, _) in runs:
    r = training[name]
    r['ratio'] = r['images_per_sec'] / single
    if num_gpus:
      r['images_per_gpu'] = r['images_per_sec'] / min(num_workers, num_gpus)
  return training


if __name__ == '__main__':
  sys.exit(main())
