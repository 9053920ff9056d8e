"""--mixed_precision and --transfer_dtype in real processes.

What each promises, checked where it shows: the bfloat16 rewrite's casts in
a traced step; the bytes a traced step pulled from and pushed to the ps
tasks (its RecvTensor records); float32 variables in the checkpoint; and a
run that resumes, and evaluates, with the flags changed.
"""

import json
import os
import re
import threading
import time

import pytest
import tensorflow as tf

tf1 = tf.compat.v1

from test_cluster import assert_clean_logs, checkpoint_step, checkpoint_steps
from test_cluster import cluster_flags, single_process_flags, start_cluster

# What a worker reads of the model per step, in float32: its 179,962
# trainable parameters, once (see training_graph.wire_getter).
MODEL_BYTES = 179962 * 4
MIXED = re.compile(r'^Worker 0: (--mixed_precision: (bfloat16|float16) compute|'
                   r'warning: --mixed_precision on a CPU)', re.M)


def traced_bytes(log):
  """[(pulled, pushed)] of the traced steps a worker's log reports."""
  return [(int(a), int(b)) for a, b in re.findall(
      r'the step pulled (\d+) bytes from the ps tasks and pushed (\d+)', log)]


def rewritten(train_dir, worker, dtype='bfloat16'):
  """Whether a worker's trace of its step 3 ran casts to dtype that
  TensorFlow's mixed-precision rewrite inserted."""
  with open(os.path.join(train_dir, 'trace_worker%d_step3.json' % worker)) as f:
    events = json.load(f)['traceEvents']
  cast = {'bfloat16': 'CastToBf16', 'float16': 'CastToFp16'}[dtype]
  return any(cast in name and 'AutoMixedPrecision' in name
             for name in (e.get('args', {}).get('name', '') for e in events
                          if e.get('ph') == 'X'))


def summaries(train_dir, tag):
  """The chief's values of a summary tag, from its event files."""
  values = []
  for name in os.listdir(train_dir):
    if name.startswith('events.out.tfevents'):
      for event in tf1.train.summary_iterator(os.path.join(train_dir, name)):
        values += [v.simple_value for v in event.summary.value
                   if v.tag == tag]
  return values


def assert_float32_checkpoint(train_dir):
  reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(train_dir))
  dtypes = reader.get_variable_to_dtype_map()
  floats = {n: d for n, d in dtypes.items() if d.is_floating}
  assert floats and all(d == tf.float32 for d in floats.values()), floats
  # float16's loss scaling adds nothing to a checkpoint: one written with
  # or without it resumes either way.
  assert not [n for n in dtypes if 'loss_scal' in n]


# float16 on a CPU: the GPU's rewrite on CPU kernels, float16's numbers, and
# the loss scaling with them.
@pytest.mark.parametrize('dtype', ['bfloat16', 'float16'])
def test_both_flags_in_a_synchronous_cluster_then_resumed_async(
    procs, tiny_data, tmp_path, dtype):
  train_dir = str(tmp_path / 'train')
  flags = cluster_flags(tiny_data, train_dir, num_ps=2)
  start_cluster(procs, flags + ['--max_steps=20', '--mixed_precision',
                                '--mixed_precision_dtype=' + dtype,
                                '--transfer_dtype=bfloat16',
                                '--trace_steps=3'], num_ps=2)
  assert set(procs.wait_all(timeout=180).values()) == {0}, procs.tails()
  assert checkpoint_step(train_dir) == 20
  log = procs.log('worker0')
  assert MIXED.search(log), log
  if dtype == 'float16':
    assert ('Worker 0: --mixed_precision: float16 compute on the CPU' in log
            and 'with dynamic loss scaling;' in log), log
    # The loss scaling ran: its scale, 32768 or halved by an overflow.
    scales = summaries(train_dir, 'loss_scale')
    assert scales and all(s in (2.0**e for e in range(16)) for s in scales)
  else:
    assert not summaries(train_dir, 'loss_scale')
  traced = [w for w in (0, 1) if 'wrote the trace of its step 3' in
            procs.log('worker%d' % w)]
  assert traced, procs.tails()
  for w in traced:
    assert rewritten(train_dir, w, dtype)
    (pulled, pushed), = traced_bytes(procs.log('worker%d' % w))
    # Half the float32 bytes each way (and a few small float32 tensors:
    # the global step, the BatchNorm statistics the chief reads). The push
    # is counted where the ps tasks received it: only the part of each ps
    # that sent its stats back in time.
    assert MODEL_BYTES / 2 <= pulled < 0.52 * MODEL_BYTES, pulled
    assert pushed < 0.52 * MODEL_BYTES, pushed
  assert_float32_checkpoint(train_dir)
  assert_clean_logs(procs)
  # Resumed asynchronously on 1 ps, bfloat16 on the wire; float32 compute,
  # or float16 still (its loss scaling, asynchronous).
  again = ['--mixed_precision', '--mixed_precision_dtype=float16'] if (
      dtype == 'float16') else []
  start_cluster(procs, cluster_flags(tiny_data, train_dir) + [
      '--max_steps=30', '--nosync_replicas', '--transfer_dtype=bfloat16'] +
                again, suffix='_again')
  assert set(procs.wait_all(timeout=180).values()) == {0}, procs.tails()
  log = procs.log('worker0_again')
  assert 'Worker 0: resuming from %s/model.ckpt-20\n' % train_dir in log
  assert bool(MIXED.search(log)) == bool(again)
  # Asynchronous: another worker's update may land while the chief names
  # and writes its last checkpoint.
  name_step, step = checkpoint_steps(train_dir)
  assert 30 <= name_step <= step <= 31
  procs.trainer('evaluator', '--job_name=evaluator', '--run_once',
                '--data_dir=' + tiny_data, '--train_dir=' + train_dir)
  assert procs.wait_all(timeout=120)['evaluator'] == 0, procs.tails()
  assert re.search(r'Test accuracy = \d\.\d{4} \(50 examples\)',
                   procs.log('evaluator'))


@pytest.mark.parametrize('dtype', ['auto', 'float16'])
def test_mixed_precision_in_one_process_then_without(procs, tiny_data,
                                                    tmp_path, dtype):
  train_dir = str(tmp_path / 'train')
  flags = single_process_flags(tiny_data, train_dir)
  procs.trainer('mixed', '--max_steps=15', '--mixed_precision',
                '--mixed_precision_dtype=' + dtype, '--trace_steps=3', *flags)
  assert procs.wait_all(timeout=120) == {'mixed': 0}, procs.tails()
  assert MIXED.search(procs.log('mixed'))
  assert rewritten(train_dir, 0, 'bfloat16' if dtype == 'auto' else dtype)
  assert traced_bytes(procs.log('mixed')) == [(0, 0)]  # No network.
  assert_float32_checkpoint(train_dir)
  procs.trainer('plain', '--max_steps=25', '--trace_steps=3', *flags)
  assert procs.wait_all(timeout=120)['plain'] == 0, procs.tails()
  assert 'resuming from %s/model.ckpt-15\n' % train_dir in procs.log('plain')
  # The trace of its own step 3.
  assert not rewritten(train_dir, 0, 'bfloat16')
  assert not rewritten(train_dir, 0, 'float16')
  assert checkpoint_step(train_dir) == 25
  assert_clean_logs(procs)


@pytest.mark.parametrize('flags, error', [
    (['--mixed_precision', '--mixed_precision_dtype=bfloat16', '--num_gpus=1'],
     'Error: --mixed_precision_dtype=bfloat16 is for CPU workers: on a GPU '
     'TensorFlow\'s graph rewrite computes float16; drop '
     '--mixed_precision_dtype or --num_gpus'),
    (['--mixed_precision_dtype=float16'],
     'Error: --mixed_precision_dtype=float16 needs --mixed_precision: add it, '
     'or drop --mixed_precision_dtype'),
], ids=['bfloat16_on_a_gpu', 'dtype_alone'])
def test_a_precision_that_cannot_run_is_one_line(procs, tmp_path, flags,
                                                 error):
  train_dir = tmp_path / 'train'
  procs.trainer('worker', '--job_name=worker', '--task_index=0',
                '--train_dir=' + str(train_dir), *flags)
  assert procs.wait_all(timeout=120) == {'worker': 2}
  errors = [l for l in procs.log('worker').splitlines()
            if l.startswith('Error')]
  assert errors == [error]
  assert not train_dir.exists()  # Refused before it touched anything.


def run_scaled_steps(sync, steps, initial_scale):
  """Trains the trainer's graph in this process with float16's loss scaling
  from initial_scale (in float32: the scaling is the same arithmetic).

  Returns:
    [(global step after the step, skipped steps, scale, weights changed)]
    per step; with sync, read once, when the global step reached steps
    (within twice as many runs).
  """
  import numpy as np  # pylint: disable=g-import-not-at-top
  import training_graph  # pylint: disable=g-import-not-at-top
  import training_session  # pylint: disable=g-import-not-at-top
  rng = np.random.RandomState(0)
  with tf.Graph().as_default():
    tf1.set_random_seed(0)
    images = tf.constant(rng.rand(8, 32, 32, 3).astype(np.float32))
    labels = tf.constant(rng.randint(0, 10, 8).astype(np.int32))
    graph = training_graph.build(images, labels, 0, True, (0.1, 1000, 0.1),
                                 sync=(1, 1) if sync else None,
                                 loss_scale=initial_scale)
    scaling = graph.loss_scaling
    weights = tf1.trainable_variables()
    hooks = [training_session.SkippedSteps(scaling.after)]
    if sync:
      hooks.append(graph.sync_opt.make_session_run_hook(True))
    # The chief's queue runner waits in take_grad for gradients that no
    # longer come: closing the session cancels it.
    with tf1.train.MonitoredSession(
        session_creator=tf1.train.ChiefSessionCreator(
            scaffold=training_graph.scaffold(graph)),
        hooks=hooks, stop_grace_period_secs=1) as sess:
      def read():
        return sess.run_step_fn(lambda step_context: step_context.session.run(
            [graph.global_step, scaling.skipped_steps, scaling.scale,
             weights]))
      before = read()[3]
      rows = []
      step = 0
      for _ in range(steps if not sync else 2 * steps):
        sess.run(graph.step_after)
        step, skipped, scale, now = read()
        changed = not all(np.array_equal(a, b) for a, b in zip(before, now))
        if not sync:
          rows.append((step, skipped, scale, changed))
          before = now
        elif step >= steps:
          # Read once: a synchronous step's update lands after the step
          # that pushed its gradients returned.
          rows.append((step, skipped, scale, changed))
          break
  for thread in threading.enumerate():  # Cancelled by the close: let them
    if thread.name.startswith('QueueRunnerThread'):  # end within the test.
      thread.join(timeout=10)
  return rows


def test_overflowing_steps_apply_nothing_and_halve_the_scale(capsys):
  # 2**127 times any gradient above 2 is float32's inf: from this seed's
  # weights, the first step overflows.
  rows = run_scaled_steps(False, 40, 2.0**127)
  # The chief's hook says so once each time the count grew, after the step.
  assert capsys.readouterr().err.splitlines() == [
      'Worker 0: %d steps so far had float16 gradients that overflowed; they '
      'left the weights as they were, and the loss scale is now %g' % (
          n, 2.0**(127 - n)) for n in range(1, rows[-1][1] + 1)]
  assert [r[0] for r in rows] == list(range(1, 41))  # Every step counts.
  said = 0
  for step, skipped, scale, changed in rows:
    assert scale == 2.0**(127 - skipped), (step, skipped, scale)
    # A step that overflowed applied nothing; every other one applied.
    assert changed == (skipped == said), (step, skipped, changed)
    assert skipped - said in (0, 1)
    said = skipped
  assert rows[0][1] == 1  # The first.
  assert rows[-1][3]  # And it found a scale that fits.


# Closing the session cancels the chief queue runner's wait, which raises in
# its thread.
@pytest.mark.filterwarnings(
    'ignore::pytest.PytestUnhandledThreadExceptionWarning')
def test_skipped_steps_still_advance_a_synchronous_cluster():
  """SyncReplicasOptimizer's accumulators count steps on their own: a
  skipped step that left the global step behind would have made every
  later gradient stale, and the run would wait forever."""
  result = []
  thread = threading.Thread(target=lambda: result.extend(
      run_scaled_steps(True, 30, 2.0**127)), daemon=True)
  thread.start()
  thread.join(timeout=120)
  assert result, 'the synchronous steps stopped: a skipped step stalled them'
  (step, skipped, scale, changed), = result
  assert step == 30
  assert 1 <= skipped < 30 and scale == 2.0**(127 - skipped)
  assert changed
