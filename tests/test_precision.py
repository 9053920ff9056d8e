"""--mixed_precision and --transfer_dtype in real processes.

What each promises, checked where it shows: the bfloat16 rewrite's casts in
a traced step; the bytes a traced step pulled from and pushed to the ps
tasks (its RecvTensor records); float32 variables in the checkpoint; and a
run that resumes, and evaluates, with the flags changed.
"""

import json
import os
import re

import tensorflow as tf

from test_cluster import assert_clean_logs, checkpoint_step, checkpoint_steps
from test_cluster import cluster_flags, single_process_flags, start_cluster

# What a worker reads of the model per step, in float32: its 179,962
# trainable parameters, once (see training_graph.wire_getter).
MODEL_BYTES = 179962 * 4
MIXED = re.compile(r'^Worker 0: (--mixed_precision: bfloat16 compute|'
                   r'warning: --mixed_precision on a CPU)', re.M)


def traced_bytes(log):
  """[(pulled, pushed)] of the traced steps a worker's log reports."""
  return [(int(a), int(b)) for a, b in re.findall(
      r'the step pulled (\d+) bytes from the ps tasks and pushed (\d+)', log)]


def rewritten(train_dir, worker):
  """Whether a worker's trace of its step 3 ran bfloat16 casts that
  TensorFlow's mixed-precision rewrite inserted."""
  with open(os.path.join(train_dir, 'trace_worker%d_step3.json' % worker)) as f:
    events = json.load(f)['traceEvents']
  return any('AutoMixedPrecision' in e.get('args', {}).get('name', '')
             for e in events if e.get('ph') == 'X')


def assert_float32_checkpoint(train_dir):
  reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(train_dir))
  dtypes = reader.get_variable_to_dtype_map()
  floats = {n: d for n, d in dtypes.items() if d.is_floating}
  assert floats and all(d == tf.float32 for d in floats.values()), floats


def test_both_flags_in_a_synchronous_cluster_then_resumed_async(
    procs, tiny_data, tmp_path):
  train_dir = str(tmp_path / 'train')
  flags = cluster_flags(tiny_data, train_dir, num_ps=2)
  start_cluster(procs, flags + ['--max_steps=20', '--mixed_precision',
                                '--transfer_dtype=bfloat16',
                                '--trace_steps=3'], num_ps=2)
  assert set(procs.wait_all(timeout=180).values()) == {0}, procs.tails()
  assert checkpoint_step(train_dir) == 20
  log = procs.log('worker0')
  assert MIXED.search(log), log
  traced = [w for w in (0, 1) if 'wrote the trace of its step 3' in
            procs.log('worker%d' % w)]
  assert traced, procs.tails()
  for w in traced:
    assert rewritten(train_dir, w)
    (pulled, pushed), = traced_bytes(procs.log('worker%d' % w))
    # Half the float32 bytes each way (and a few small float32 tensors:
    # the global step, the BatchNorm statistics the chief reads). The push
    # is counted where the ps tasks received it: only the part of each ps
    # that sent its stats back in time.
    assert MODEL_BYTES / 2 <= pulled < 0.52 * MODEL_BYTES, pulled
    assert pushed < 0.52 * MODEL_BYTES, pushed
  assert_float32_checkpoint(train_dir)
  assert_clean_logs(procs)
  # Resumed asynchronously on 1 ps, bfloat16 on the wire, float32 compute.
  start_cluster(procs, cluster_flags(tiny_data, train_dir) + [
      '--max_steps=30', '--nosync_replicas', '--transfer_dtype=bfloat16'],
                suffix='_again')
  assert set(procs.wait_all(timeout=180).values()) == {0}, procs.tails()
  log = procs.log('worker0_again')
  assert 'Worker 0: resuming from %s/model.ckpt-20\n' % train_dir in log
  assert not MIXED.search(log)
  # Asynchronous: another worker's update may land while the chief names
  # and writes its last checkpoint.
  name_step, step = checkpoint_steps(train_dir)
  assert 30 <= name_step <= step <= 31
  procs.trainer('evaluator', '--job_name=evaluator', '--run_once',
                '--data_dir=' + tiny_data, '--train_dir=' + train_dir)
  assert procs.wait_all(timeout=120)['evaluator'] == 0, procs.tails()
  assert re.search(r'Test accuracy = \d\.\d{4} \(50 examples\)',
                   procs.log('evaluator'))


def test_mixed_precision_in_one_process_then_without(procs, tiny_data,
                                                    tmp_path):
  train_dir = str(tmp_path / 'train')
  flags = single_process_flags(tiny_data, train_dir)
  procs.trainer('mixed', '--max_steps=15', '--mixed_precision',
                '--trace_steps=3', *flags)
  assert procs.wait_all(timeout=120) == {'mixed': 0}, procs.tails()
  assert MIXED.search(procs.log('mixed'))
  assert rewritten(train_dir, 0)
  assert traced_bytes(procs.log('mixed')) == [(0, 0)]  # No network.
  assert_float32_checkpoint(train_dir)
  procs.trainer('plain', '--max_steps=25', '--trace_steps=3', *flags)
  assert procs.wait_all(timeout=120)['plain'] == 0, procs.tails()
  assert 'resuming from %s/model.ckpt-15\n' % train_dir in procs.log('plain')
  assert not rewritten(train_dir, 0)  # The trace of its own step 3.
  assert checkpoint_step(train_dir) == 25
  assert_clean_logs(procs)


def test_mixed_precision_is_for_cpu_workers(procs, tmp_path):
  procs.trainer('gpu', '--job_name=worker', '--task_index=0',
                '--mixed_precision', '--num_gpus=1',
                '--train_dir=' + str(tmp_path / 'train'))
  assert procs.wait_all(timeout=120) == {'gpu': 2}
  errors = [l for l in procs.log('gpu').splitlines() if l.startswith('Error')]
  assert errors == ['Error: --mixed_precision is oneDNN\'s bfloat16 on the '
                    'CPU; on a GPU it is not built yet: drop '
                    '--mixed_precision or --num_gpus']
