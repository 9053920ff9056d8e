"""Real clusters: ps and worker processes on free ports, as users start them."""

import datetime
import json
import os
import re

import numpy as np
import tensorflow as tf

from conftest import free_ports

PROGRESS = re.compile(
    r'^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6}: step (\d+), loss = \d+\.\d\d '
    r',Train accuracy = \d\.\d\d \(\d+\.\d examples/sec; \d+\.\d{3} '
    r'sec/batch; (?:\d+:\d\d:\d\d|\?) left\)$', re.M)

# Fast settings for a 2-core machine.
FAST = ['--batch_size=16', '--num_preprocess_threads=2', '--log_frequency=5']


def cluster_flags(data_dir, train_dir, num_workers=2, num_ps=1):
  """The flags of a cluster on free localhost ports, with FAST settings."""
  ports = free_ports(num_ps + num_workers)
  hosts = ['localhost:%d' % p for p in ports]
  return ['--ps_hosts=' + ','.join(hosts[:num_ps]),
          '--worker_hosts=' + ','.join(hosts[num_ps:]),
          '--data_dir=' + data_dir, '--train_dir=' + train_dir] + FAST


def single_process_flags(data_dir, train_dir):
  """The flags of a one-process run (no cluster), with FAST settings."""
  return ['--ps_hosts=', '--data_dir=' + data_dir,
          '--train_dir=' + train_dir] + FAST


def start_cluster(procs, flags, num_workers=2, num_ps=1, suffix='',
                  tf_config=False):
  """Starts the ps tasks, then the workers from the last to the chief.

  The reference's order (ps, worker 1, worker 0). Process names are ps0..,
  worker0.., each with `suffix` appended. With tf_config, each task gets its
  cluster and role from TF_CONFIG as Kubeflow writes it (a "chief" job, the
  other workers indexed from 0) instead of the four cluster flags.
  """
  tasks = [('ps', i) for i in range(num_ps)] + [
      ('worker', i) for i in reversed(range(num_workers))]
  for job, i in tasks:
    name = '%s%d%s' % (job, i, suffix)
    if not tf_config:
      procs.trainer(name, '--job_name=' + job, '--task_index=%d' % i, *flags)
      continue
    hosts = {f.split('=')[0]: f.split('=')[1].split(',') for f in flags[:2]}
    workers = hosts['--worker_hosts']
    cluster = {'ps': hosts['--ps_hosts'], 'chief': workers[:1],
               'worker': workers[1:]}
    task = ({'type': 'chief', 'index': 0} if job == 'worker' and i == 0 else
            {'type': job, 'index': i - (job == 'worker')})
    procs.trainer(name, *flags[2:], env={'TF_CONFIG': json.dumps(
        {'cluster': cluster, 'task': task})})


def checkpoint_steps(train_dir):
  """Returns (step in the latest checkpoint's name, global_step inside it)."""
  latest = tf.train.latest_checkpoint(train_dir)
  assert latest, 'no checkpoint in %s' % train_dir
  return (int(latest.rsplit('-', 1)[1]),
          int(tf.train.load_variable(latest, 'global_step')))


def latest_step(train_dir):
  """The step in the latest checkpoint's name; -1 when there is none."""
  latest = tf.train.latest_checkpoint(train_dir)
  return int(latest.rsplit('-', 1)[1]) if latest else -1


def checkpoint_step(train_dir):
  """The latest checkpoint's step, checking that its name agrees."""
  name_step, step = checkpoint_steps(train_dir)
  assert name_step == step
  return step


def shard_counts(train_dir, step):
  """Returns the set of N in the step's model.ckpt-STEP.data-*-of-N files."""
  pattern = re.compile(r'^model\.ckpt-%d\.data-\d{5}-of-(\d{5})$' % step)
  return {int(m.group(1)) for m in map(pattern.match, os.listdir(train_dir))
          if m}


# Every line a healthy task prints: the suite's own, nothing of
# TensorFlow's (see training/log_filter.py).
OWN_LINE = re.compile(
    r'(job_name : \w+|task_index : \d+|(ps|Worker) \d+: .+|Evaluator: .+|'
    r'Cluster from TF_CONFIG: .+|Given on the command line, over TF_CONFIG: .+|'
    r'\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6}: step \d+, loss = .+)')


def assert_clean_logs(procs, expected=()):
  """Each task of a healthy run printed only the suite's own lines (and
  the expected ones, an Error line say)."""
  for name in procs.procs:
    log = procs.log(name)
    strange = [l for l in log.splitlines()
               if l not in expected and not OWN_LINE.fullmatch(l)]
    assert not strange, '%s printed lines not ours:\n%s' % (name, log)


def test_single_process_mode(procs, tiny_data, tmp_path):
  train_dir = str(tmp_path / 'train')
  procs.trainer('single', '--ps_hosts=', '--data_dir=' + tiny_data,
                '--train_dir=' + train_dir, '--max_steps=15', *FAST)
  assert procs.wait_all(timeout=120) == {'single': 0}, procs.tails()
  assert checkpoint_step(train_dir) == 15
  log = procs.log('single')
  assert [int(s) for s in PROGRESS.findall(log)] == [5, 10, 15]
  assert 'training finished at global step 15' in log
  assert_clean_logs(procs)
  # Without --mixed_precision, one line where the flag would pay (a CPU
  # with AMX-BF16, as read here), none elsewhere.
  with open('/proc/cpuinfo') as f:
    amx = ' amx_bf16' in f.read()
  assert log.count('--mixed_precision would be faster here') == int(amx)


def test_time_left_at_half_way_is_within_30_percent(procs, tiny_data,
                                                   tmp_path):
  procs.trainer('single', '--ps_hosts=', '--data_dir=' + tiny_data,
                '--train_dir=' + str(tmp_path / 'train'), '--max_steps=300',
                # Steps long enough that the second half takes seconds:
                # the estimate is in whole seconds.
                '--batch_size=64', '--num_preprocess_threads=2',
                '--log_frequency=10')
  assert procs.wait_all(timeout=180) == {'single': 0}, procs.tails()
  lines = {int(m.group(2)): m for m in re.finditer(
      r'^(\S+ \S+): step (\d+), .*; (\d+):(\d\d):(\d\d) left\)$',
      procs.log('single'), re.M)}
  assert sorted(lines) == list(range(10, 301, 10)), procs.log('single')

  def when(step):
    return datetime.datetime.strptime(lines[step].group(1),
                                      '%Y-%m-%d %H:%M:%S.%f')

  h, m, s = (int(g) for g in lines[150].group(3, 4, 5))
  estimate = 3600 * h + 60 * m + s
  took = (when(300) - when(150)).total_seconds()
  assert abs(estimate - took) <= 0.3 * took, (estimate, took)
  assert lines[300].group(3, 4, 5) == ('0', '00', '00')


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(procs, tiny_data,
                                                           tmp_path):
  train_dir = str(tmp_path / 'train')
  procs.trainer('single', '--ps_hosts=', '--data_dir=' + tiny_data,
                '--train_dir=' + train_dir, '--max_steps=1000',
                '--initial_learning_rate=1e30', '--save_checkpoint_steps=1',
                *FAST)
  assert procs.wait_all(timeout=120) == {'single': 1}, procs.tails()
  log = procs.log('single')
  assert 'Error: the model diverged with loss = NaN' in log
  latest = tf.train.latest_checkpoint(train_dir)
  reader = tf.train.load_checkpoint(latest)
  for name in reader.get_variable_to_shape_map():
    assert np.all(np.isfinite(reader.get_tensor(name))), name


BAD_FLAGS = {
    'unknown_job': (['--job_name=boss', '--task_index=0'],
                    '--job_name must be ps, worker or evaluator'),
    'no_job': (['--task_index=0'], '--job_name must be ps, worker or evaluator'),
    'no_task_index': (['--job_name=worker'], '--task_index must be 0..1'),
    'task_index_too_big': (['--job_name=worker', '--task_index=2'],
                           '--task_index must be 0..1'),
    'host_without_port': (['--job_name=worker', '--task_index=0',
                           '--worker_hosts=localhost:1,localhost'],
                          'is not hostname:port'),
    'batch_size_0': (['--job_name=worker', '--task_index=0',
                      '--batch_size=0'], '--batch_size must be at least 1'),
    'too_many_replicas': (['--job_name=worker', '--task_index=0',
                           '--replicas_to_aggregate=3'],
                          '--replicas_to_aggregate must be 1..2'),
    'no_data': (['--job_name=worker', '--task_index=0',
                 '--data_dir=/nonexistent'],
                'data directory /nonexistent does not exist'),
    'bad_trace_steps': (['--job_name=worker', '--task_index=0',
                         '--trace_steps=5,0'],
                        '--trace_steps must be step numbers from 1'),
    'negative_crop_padding': (['--job_name=worker', '--task_index=0',
                               '--crop_padding=-1'],
                              '--crop_padding must be 0 or more (got -1)'),
    'negative_warmup_steps': (['--job_name=worker', '--task_index=0',
                               '--warmup_steps=-5'],
                              '--warmup_steps must be 0 or more (got -5)'),
}


def test_bad_flags_give_one_line_and_exit_2(procs, tmp_path):
  # Each case is a process of its own; all start at once, since each spends
  # its few seconds importing TensorFlow before it finds its flags wrong.
  for case, (flags, _) in BAD_FLAGS.items():
    procs.trainer(case, '--train_dir=' + str(tmp_path / case), *flags)
  assert procs.wait_all(timeout=120) == dict.fromkeys(BAD_FLAGS, 2)
  for case, (_, message) in BAD_FLAGS.items():
    log = procs.log(case)
    errors = [l for l in log.splitlines() if l.startswith('Error: ')]
    assert len(errors) == 1 and message in errors[0], (case, log)
    assert 'Traceback' not in log, (case, log)
    assert not (tmp_path / case).exists(), case  # Nothing written.


def test_fresh_start_empties_train_dir_and_starts_over(procs, tiny_data,
                                                      tmp_path):
  train_dir = str(tmp_path / 'train')
  flags = single_process_flags(tiny_data, train_dir) + ['--max_steps=10']
  procs.trainer('first', *flags)
  assert procs.wait_all(timeout=120) == {'first': 0}, procs.tails()
  (tmp_path / 'train' / 'stale.txt').write_text('from the first run')
  procs.trainer('again', '--fresh_start', *flags)
  assert procs.wait_all(timeout=120) == {'first': 0, 'again': 0}
  log = procs.log('again')
  assert '--fresh_start: deleting %s' % train_dir in log
  assert 'resuming' not in log
  assert [int(s) for s in PROGRESS.findall(log)] == [5, 10]
  assert not (tmp_path / 'train' / 'stale.txt').exists()
  assert checkpoint_step(train_dir) == 10
