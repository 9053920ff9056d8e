"""Real clusters: ps and worker processes on free ports, as users start them."""

import os
import re

import numpy as np
import pytest
import tensorflow as tf

from conftest import free_ports

PROGRESS = re.compile(
    r'^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6}: step (\d+), loss = \d+\.\d\d '
    r',Train accuracy = \d\.\d\d \(\d+\.\d examples/sec; \d+\.\d{3} '
    r'sec/batch\)$', re.M)

# Fast settings for a 2-core machine.
FAST = ['--batch_size=16', '--num_preprocess_threads=2', '--log_frequency=5']


def cluster_flags(data_dir, train_dir, num_workers=2):
  ports = free_ports(1 + num_workers)
  return ['--ps_hosts=localhost:%d' % ports[0],
          '--worker_hosts=' + ','.join('localhost:%d' % p for p in ports[1:]),
          '--data_dir=' + data_dir, '--train_dir=' + train_dir] + FAST


def start_cluster(procs, flags, num_workers=2):
  """Starts ps 0 and the workers in the reference's order: ps, 1, 0."""
  procs.trainer('ps0', '--job_name=ps', '--task_index=0', *flags)
  for i in reversed(range(num_workers)):
    procs.trainer('worker%d' % i, '--job_name=worker', '--task_index=%d' % i,
                  *flags)


def checkpoint_steps(train_dir):
  """Returns (step in the latest checkpoint's name, global_step inside it)."""
  latest = tf.train.latest_checkpoint(train_dir)
  assert latest, 'no checkpoint in %s' % train_dir
  return (int(latest.rsplit('-', 1)[1]),
          int(tf.train.load_variable(latest, 'global_step')))


def checkpoint_step(train_dir):
  """The latest checkpoint's step, checking that its name agrees."""
  name_step, step = checkpoint_steps(train_dir)
  assert name_step == step
  return step


def assert_clean_logs(procs):
  for name in procs.procs:
    log = procs.log(name)
    assert 'Traceback' not in log, log
    assert 'Exception' not in log, log


def test_sync_cluster_trains_to_max_steps_and_every_task_exits(procs,
                                                               tiny_data,
                                                               tmp_path):
  train_dir = str(tmp_path / 'train')
  flags = cluster_flags(tiny_data, train_dir) + [
      '--max_steps=30', '--save_checkpoint_steps=10']
  start_cluster(procs, flags)
  codes = procs.wait_all(timeout=150)
  assert codes == {'ps0': 0, 'worker0': 0, 'worker1': 0}, procs.tails()
  assert checkpoint_step(train_dir) == 30
  # Periodic checkpoints too, and summaries for TensorBoard.
  steps = {int(f.split('-')[1].split('.')[0]) for f in os.listdir(train_dir)
           if f.startswith('model.ckpt-') and f.endswith('.index')}
  assert {10, 20, 30} <= steps
  assert any(f.startswith('events.out.tfevents') for f in os.listdir(train_dir))
  chief = procs.log('worker0')
  progress = [int(s) for s in PROGRESS.findall(chief)]
  assert progress and progress == sorted(progress) and progress[-1] <= 30
  assert 'Worker 0: Session initialization complete.' in chief
  assert 'Worker 0: training finished at global step 30' in chief
  assert 'Worker 1: training finished at global step 30' in procs.log(
      'worker1')
  assert 'ps 0: all 2 worker(s) finished; exiting' in procs.log('ps0')
  # Only the chief writes to train_dir.
  assert 'Waiting for session to be initialized' in procs.log('worker1')
  assert_clean_logs(procs)


def test_async_cluster(procs, tiny_data, tmp_path):
  train_dir = str(tmp_path / 'train')
  flags = cluster_flags(tiny_data, train_dir) + ['--max_steps=30',
                                                 '--nosync_replicas']
  start_cluster(procs, flags)
  codes = procs.wait_all(timeout=150)
  assert codes == {'ps0': 0, 'worker0': 0, 'worker1': 0}, procs.tails()
  # Asynchronous updates do not wait for a save: the other worker may apply
  # one more update while the chief names or writes its last checkpoint.
  name_step, step = checkpoint_steps(train_dir)
  assert 30 <= name_step <= step <= 31
  assert_clean_logs(procs)


def test_restart_resumes_from_the_checkpoint(procs, tiny_data, tmp_path):
  train_dir = str(tmp_path / 'train')
  flags = cluster_flags(tiny_data, train_dir)
  start_cluster(procs, flags + ['--max_steps=10'])
  assert set(procs.wait_all(timeout=150).values()) == {0}, procs.tails()
  assert checkpoint_step(train_dir) == 10
  before = tf.train.load_variable(train_dir,
                                  'InceptionResnetV2/Logits/weights')

  procs.procs.clear()
  start_cluster(procs, flags + ['--max_steps=20'])
  assert set(procs.wait_all(timeout=150).values()) == {0}, procs.tails()
  chief = procs.log('worker0')
  assert 'resuming from %s/model.ckpt-10' % train_dir in chief
  assert min(int(s) for s in PROGRESS.findall(chief)) > 10
  assert checkpoint_step(train_dir) == 20
  after = tf.train.load_variable(train_dir, 'InceptionResnetV2/Logits/weights')
  assert not np.array_equal(before, after)


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


@pytest.mark.parametrize('flags, message', [
    (['--job_name=boss', '--task_index=0'], '--job_name must be ps, worker or evaluator'),
    (['--task_index=0'], '--job_name must be ps, worker or evaluator'),
    (['--job_name=worker'], '--task_index must be 0..1'),
    (['--job_name=worker', '--task_index=2'], '--task_index must be 0..1'),
    (['--job_name=worker', '--task_index=0',
      '--worker_hosts=localhost:1,localhost'], 'is not hostname:port'),
    (['--job_name=worker', '--task_index=0', '--batch_size=0'],
     '--batch_size must be at least 1'),
    (['--job_name=worker', '--task_index=0', '--replicas_to_aggregate=3'],
     '--replicas_to_aggregate must be 1..2'),
    (['--job_name=worker', '--task_index=0', '--data_dir=/nonexistent'],
     'data directory /nonexistent does not exist'),
])
def test_bad_flags_give_one_line_and_exit_2(procs, tmp_path, flags, message):
  procs.trainer('bad', '--train_dir=' + str(tmp_path / 'train'), *flags)
  assert procs.wait_all(timeout=60) == {'bad': 2}
  log = procs.log('bad')
  errors = [l for l in log.splitlines() if l.startswith('Error: ')]
  assert len(errors) == 1 and message in errors[0], log
  assert 'Traceback' not in log


def test_fresh_start_empties_train_dir_and_starts_over(procs, tiny_data,
                                                      tmp_path):
  train_dir = str(tmp_path / 'train')
  flags = ['--ps_hosts=', '--data_dir=' + tiny_data,
           '--train_dir=' + train_dir, '--max_steps=10'] + FAST
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
