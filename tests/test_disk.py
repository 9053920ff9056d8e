"""A full or read-only disk and damaged checkpoints: one line, nothing lost.

The full and read-only disks are real: a small tmpfs mounted for the test
(root only, as in CI; skipped, saying why, elsewhere), filled up or
remounted read-only once the chief has written a checkpoint. The damaged
checkpoints are real files cut in half, as a crash mid-write leaves them.
"""

import glob
import json
import os
import subprocess
import time

import pytest
import tensorflow as tf

from training.storage import checkpoints
from helpers import assert_clean_logs, checkpoint_step, cluster_flags
from helpers import latest_step, single_process_flags, start_cluster
from helpers import wait_until


@pytest.fixture
def small_disk(tmp_path):
  """A 32 MiB tmpfs; yields (its mount point, a function that breaks it)."""
  mount_point = str(tmp_path / 'disk')
  os.mkdir(mount_point)
  mounted = subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=32m', 'tmpfs',
                            mount_point], capture_output=True, text=True)
  if mounted.returncode:
    pytest.skip('cannot mount a tmpfs here (needs root): %s' %
                mounted.stderr.strip())

  mounts = [mount_point]

  def break_it(how, train_dir):
    if how == 'read-only':
      # A read-only mount of train_dir over itself: the tmpfs itself cannot
      # be remounted read-only while the chief has files open on it.
      subprocess.run(['mount', '--bind', train_dir, train_dir], check=True)
      mounts.append(train_dir)
      # Nor the new mount while a save has a file open through it ("mount
      # point is busy"): tried again until a moment between two saves.
      for _ in range(200):
        remount = subprocess.run(['mount', '-o', 'remount,bind,ro',
                                  train_dir, train_dir],
                                 capture_output=True, text=True)
        if remount.returncode == 0:
          return
        if 'busy' not in remount.stderr:
          break
        time.sleep(0.05)
      raise AssertionError(remount.stderr)
    with open(os.path.join(mount_point, 'filler'), 'wb', buffering=0) as f:
      try:
        while True:
          f.write(b'\0' * (1 << 16))
      except OSError:
        pass  # Full.

  try:
    yield mount_point, break_it
  finally:
    for path in reversed(mounts):
      subprocess.run(['umount', '-l', path], check=False)


WRITE_CASES = {
    # (ps tasks, workers, how the disk breaks, what the OS says)
    'single_full': (0, 1, 'full', 'No space left on device'),
    'single_read_only': (0, 1, 'read-only', 'Read-only file system'),
    # The ps tasks write the shards; the chief hears of their failure.
    '2ps_full': (2, 2, 'full', 'No space left on device'),
}


@pytest.mark.slow
@pytest.mark.parametrize('case', list(WRITE_CASES))
def test_a_failed_checkpoint_write_is_one_line_and_loses_nothing(
    procs, tiny_data, small_disk, case):
  num_ps, num_workers, how, cause = WRITE_CASES[case]
  disk, break_it = small_disk
  train_dir = os.path.join(disk, 'train')
  run = ['--max_steps=1000000', '--save_checkpoint_steps=10']
  if num_ps:
    flags = cluster_flags(tiny_data, train_dir, num_workers, num_ps) + run
    start_cluster(procs, flags, num_workers, num_ps)
  else:
    procs.trainer('worker0', *(single_process_flags(tiny_data, train_dir) +
                               run))
  wait_until(lambda: latest_step(train_dir) >= 10, 120, 'checkpoint 10',
             procs)
  break_it(how, train_dir)
  codes = procs.wait_all(timeout=90)
  # 2: fix something first, do not retry (the same disk would fail again).
  # The other tasks stop too, as at the end of a run.
  assert codes == dict(codes, worker0=2), procs.tails()
  assert all(codes[n] == 0 for n in codes if n.startswith('ps')), codes
  assert all(codes[n] == 1 for n in codes if n.startswith('worker')
             and n != 'worker0'), codes
  log = procs.log('worker0')
  errors = [l for l in log.splitlines() if l.startswith('Error: ')]
  last_good, _ = checkpoints.newest_readable(train_dir)
  assert len(errors) == 1, log
  assert errors[0].startswith('Error: cannot write the checkpoint of step '), log
  assert ' in %s: %s. The last good checkpoint, %s, is kept' % (
      train_dir, cause, last_good) in errors[0], log
  assert checkpoints.step_of(last_good) >= 10
  assert checkpoints.unreadable(last_good) is None
  assert not glob.glob(os.path.join(train_dir, '*_temp*')), os.listdir(
      train_dir)
  assert_clean_logs(procs, expected=errors)


def cut_in_half(path):
  size = os.path.getsize(path)
  with open(path, 'r+b') as f:
    f.truncate(size // 2)
  return size // 2


def data_files(train_dir, step):
  return sorted(glob.glob(os.path.join(train_dir,
                                       'model.ckpt-%d.data-*' % step)))


def test_a_damaged_checkpoint_is_skipped_never_deleted(procs, tiny_data,
                                                      tmp_path):
  train_dir = str(tmp_path / 'train')
  flags = single_process_flags(tiny_data, train_dir)
  procs.trainer('first', '--max_steps=30', '--save_checkpoint_steps=10',
                *flags)
  assert procs.wait_all(timeout=120) == {'first': 0}, procs.tails()
  cut = cut_in_half(data_files(train_dir, 30)[0])
  # The chief resumes from 20, the newest it can read, and says so.
  procs.trainer('again', '--max_steps=40', '--save_checkpoint_steps=100',
                *flags)
  assert procs.wait_all(timeout=120)['again'] == 0, procs.tails()
  log = procs.log('again')
  assert 'Worker 0: cannot read the checkpoint %s/model.ckpt-30 (' % (
      train_dir) in log, log
  assert 'Worker 0: resuming from %s/model.ckpt-20\n' % train_dir in log
  assert checkpoint_step(train_dir) == 40
  assert os.path.getsize(data_files(train_dir, 30)[0]) == cut  # Left be.
  # The evaluator looks past damaged ones too: 40 and 30 to 20.
  cut_in_half(data_files(train_dir, 40)[0])
  procs.trainer('evaluator', '--job_name=evaluator', '--run_once',
                '--data_dir=' + tiny_data, '--train_dir=' + train_dir)
  assert procs.wait_all(timeout=120)['evaluator'] == 0, procs.tails()
  log = procs.log('evaluator')
  for step in (40, 30):
    assert ('Evaluator: cannot read the checkpoint %s/model.ckpt-%d (' % (
        train_dir, step)) in log, log
  with open(os.path.join(train_dir, 'eval', 'results.jsonl')) as f:
    results = [json.loads(line) for line in f]
  assert [(r['step'], r['examples']) for r in results] == [(20, 50)]
  # None left that reads back: one line, exit 2, every file still there.
  for step in (0, 10, 20):
    cut_in_half(data_files(train_dir, step)[0])
  before = sorted(os.listdir(train_dir))
  procs.trainer('none_left', '--max_steps=50', *flags)
  assert procs.wait_all(timeout=120)['none_left'] == 2, procs.tails()
  errors = [l for l in procs.log('none_left').splitlines()
            if l.startswith('Error: ')]
  assert errors == ['Error: none of the 5 checkpoint(s) in --train_dir=%s '
                    'can be read: move them away to start over, or '
                    '--fresh_start to delete them' % train_dir]
  assert sorted(os.listdir(train_dir)) == before
  assert 'Traceback' not in procs.log('none_left')


@pytest.mark.slow
def test_a_damaged_shard_in_a_cluster_is_skipped(procs, tiny_data, tmp_path):
  # Two ps tasks write two shards; one of the newest is cut.
  train_dir = str(tmp_path / 'train')
  flags = cluster_flags(tiny_data, train_dir, num_ps=2)
  start_cluster(procs, flags + ['--max_steps=30', '--save_checkpoint_steps=10'],
                num_ps=2)
  assert set(procs.wait_all(timeout=180).values()) == {0}, procs.tails()
  shards = data_files(train_dir, 30)
  assert len(shards) == 2
  cut_in_half(shards[1])
  start_cluster(procs, flags + ['--max_steps=40'], num_ps=2, suffix='_again')
  codes = procs.wait_all(timeout=180)
  assert set(codes.values()) == {0}, procs.tails()
  log = procs.log('worker0_again')
  assert 'Worker 0: cannot read the checkpoint %s/model.ckpt-30 (' % (
      train_dir) in log, log
  # (Or, where a task was not there yet and the chief's session was made
  # again, as a restore once the cluster is back.)
  assert ('Worker 0: resuming from %s/model.ckpt-20\n' % train_dir in log or
          'Worker 0: restored the model at global step 20\n' in log), log
  assert checkpoint_step(train_dir) == 40
  assert tf.train.load_variable(train_dir, 'global_step') == 40
