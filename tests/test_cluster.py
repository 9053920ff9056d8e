"""The trainer in real processes, as users start it: one process, a
diverging run, bad command lines, a fresh start (clusters of every shape:
test_shapes.py)."""

import re

import numpy as np
import pytest
import tensorflow as tf

from helpers import FAST, PROGRESS, assert_clean_logs, checkpoint_step
from helpers import single_process_flags


def test_single_process_mode(procs, tiny_data, tmp_path):
  train_dir = str(tmp_path / 'train')
  procs.trainer('single', '--ps_hosts=', '--data_dir=' + tiny_data,
                '--train_dir=' + train_dir, '--max_steps=15', *FAST)
  assert procs.wait_all(timeout=120) == {'single': 0}, procs.tails()
  assert checkpoint_step(train_dir) == 15
  log = procs.log('single')
  assert [int(m['step']) for m in PROGRESS.finditer(log)] == [5, 10, 15]
  assert 'training finished at global step 15' in log
  assert_clean_logs(procs)
  # Without --mixed_precision, one line where the flag would pay (a CPU
  # with AMX-BF16, as read here), none elsewhere.
  with open('/proc/cpuinfo') as f:
    amx = ' amx_bf16' in f.read()
  assert log.count('--mixed_precision would be faster on this CPU') == int(amx)


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
    'negative_momentum': (['--optimizer=momentum', '--momentum=-0.1'],
                          '--momentum must be at least 0 and below 1 '
                          '(got -0.1)'),
    'momentum_1': (['--optimizer=momentum', '--momentum=1'],
                   '--momentum must be at least 0 and below 1 (got 1.0)'),
    'momentum_above_1': (['--optimizer=momentum', '--momentum=1.5'],
                         '--momentum must be at least 0 and below 1 '
                         '(got 1.5)'),
    'nesterov_with_sgd': (['--nesterov'], '--momentum and --nesterov apply '
                          'with --optimizer=momentum only: add it, or drop '
                          'them'),
    'momentum_with_sgd': (['--momentum=0.5'], '--momentum and --nesterov '
                          'apply with --optimizer=momentum only: add it, or '
                          'drop them'),
    'label_smoothing_1': (['--label_smoothing=1'], '--label_smoothing must be '
                          'at least 0 and below 1 (got 1.0)'),
    'negative_weight_decay': (['--weight_decay=-0.001'], '--weight_decay must '
                              'be 0 or more (got -0.001)'),
    'batch_norm_decay_1': (['--batch_norm_decay=1'], '--batch_norm_decay must '
                           'be at least 0 and below 1 (got 1.0)'),
    'negative_batch_norm_decay': (['--batch_norm_decay=-0.1'],
                                  '--batch_norm_decay must be at least 0 and '
                                  'below 1 (got -0.1)'),
    'batch_norm_decay_word': (['--batch_norm_decay=auto'],
                              '--batch_norm_decay=auto: must be a number'),
    'random_erasing_above_1': (['--random_erasing=1.5'], '--random_erasing '
                               'must be from 0 to 1 (got 1.5)'),
    'negative_random_erasing': (['--random_erasing=-0.1'], '--random_erasing '
                                'must be from 0 to 1 (got -0.1)'),
    'random_erasing_word': (['--random_erasing=half'],
                            '--random_erasing=half: must be a number'),
    'batch_size_fraction': (['--batch_size=1.5'],
                            '--batch_size=1.5: must be a whole number'),
    'random_erasing_without_distort': (
        ['--random_erasing=0.5', '--nodistort'], '--random_erasing erases '
        'with --distort only: drop --nodistort, or --random_erasing'),
    'erasing_fill_without_erasing': (
        ['--erasing_fill=mean'], '--erasing_fill applies with '
        '--random_erasing only: add it, or drop --erasing_fill'),
    'erasing_fill_zeros': (['--erasing_fill=zeros'], '--erasing_fill=zeros: '
                           'value should be one of <noise|mean>'),
    'eval_flips_maybe': (['--job_name=evaluator', '--eval_flips=maybe'],
                         '--eval_flips=maybe: it takes no value: give '
                         '--eval_flips or --noeval_flips'),
    'optimizer_adam': (['--optimizer=adam'], '--optimizer=adam: value should '
                       'be one of <sgd|momentum>'),
}


@pytest.mark.slow
def test_bad_flags_give_one_line_and_exit_2(procs, tmp_path):
  # Each case is a process of its own; all start at once, since each spends
  # its few seconds importing TensorFlow before it finds its flags wrong.
  for case, (flags, _) in BAD_FLAGS.items():
    procs.trainer(case, '--train_dir=' + str(tmp_path / case), *flags)
  assert procs.wait_all(timeout=180) == dict.fromkeys(BAD_FLAGS, 2)
  for case, (_, message) in BAD_FLAGS.items():
    log = procs.log(case)
    # Nothing but the one line, after the reference's echo of the task.
    lines = [l for l in log.strip().splitlines()
             if not re.match(r'(job_name|task_index) : \w+$', l)]
    assert len(lines) == 1 and lines[0].startswith('Error: '), (case, log)
    assert message in lines[0], (case, log)
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
  assert [int(m['step']) for m in PROGRESS.finditer(log)] == [5, 10]
  assert not (tmp_path / 'train' / 'stale.txt').exists()
  assert checkpoint_step(train_dir) == 10
