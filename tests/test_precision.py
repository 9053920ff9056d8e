"""--mixed_precision and --transfer_dtype in real processes.

What each promises, checked where it shows: the bfloat16 rewrite's casts in
a traced step; the bytes a traced step pulled from and pushed to the ps
tasks (its RecvTensor records); float32 variables in the checkpoint; and a
run that resumes, and evaluates, with the flags changed. And float16's loss
scaling (--initial_loss_scale, --loss_scale_period): overflows skipped in a
synchronous cluster, a late worker that resets nothing, the rule on the
used scale and the mutex of the updates on a real cluster of gRPC servers,
and the doubling, in this process.
"""

import json
import os
import re
import threading

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf import rewriter_config_pb2

import cifar10_model

tf1 = tf.compat.v1

from helpers import SERVERS, free_ports
from helpers import assert_clean_logs, checkpoint_step, checkpoint_steps
from helpers import cluster_flags, single_process_flags, steps, wait_until
from helpers import FLOAT16_ENV, start_cluster

from training.graph import learning_rate

# The reference's schedule as a 40-step test sees it: 0.1 throughout.
CONSTANT_RATE = learning_rate.Schedule('exponential', 0.1, 128, 'none', 0,
                                       1000, 1000, 0.1)

# What a worker reads of the model per step, in float32: its trainable
# parameters, once (see training/graph/transfers.py).
MODEL_BYTES = cifar10_model.MODEL_BYTES
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


def bf16_in_hardware():
  """Whether this CPU has bfloat16 instructions (read here, from
  /proc/cpuinfo, not by the code under test)."""
  with open('/proc/cpuinfo') as f:
    flags = f.read()
  return 'avx512_bf16' in flags or 'amx_bf16' in flags


def assert_bf16_rewrite(train_dir, worker, log):
  """The bfloat16 rewrite ran in the worker's traced step, or it could not
  on this CPU (oneDNN rewrites nothing without AVX-512: an AMD Zen 3) and
  the worker said so."""
  if rewritten(train_dir, worker, 'bfloat16'):
    return
  assert not bf16_in_hardware(), 'no bfloat16 casts on a CPU that has them'
  assert ('Worker %d: warning: --mixed_precision on a CPU with no '
          'AVX512_BF16 or AMX-BF16: bfloat16 may run slower than float32 '
          'here; drop the flag' % worker) in log, log


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
# the loss scaling with them; there, with Nesterov's momentum, whose
# accumulators change none of the bytes on the wire.
MOMENTUM = {'bfloat16': [], 'float16': ['--optimizer=momentum', '--nesterov']}


@pytest.mark.slow
@pytest.mark.parametrize('dtype', ['bfloat16', 'float16'])
def test_both_flags_in_a_synchronous_cluster_then_resumed_async(
    procs, tiny_data, tmp_path, dtype):
  train_dir = str(tmp_path / 'train')
  flags = cluster_flags(tiny_data, train_dir, num_ps=2) + MOMENTUM[dtype]
  start_cluster(procs, flags + ['--max_steps=20', '--mixed_precision',
                                '--mixed_precision_dtype=' + dtype,
                                '--transfer_dtype=bfloat16',
                                '--trace_steps=3,4,5,6,7'], num_ps=2,
                worker_env=FLOAT16_ENV if dtype == 'float16' else None)
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
  # Both workers' steps 3-7: each of the 20 global steps takes 2 gradients,
  # and the chief's sync op hands out 2 tokens a step to the workers that
  # wait for one; measured in 6 runs, the chief computed 15-19 of them and
  # worker 1 23-27, far more than 7.
  for w in (0, 1):
    log = procs.log('worker%d' % w)
    assert 'wrote the trace of its step 7' in log, procs.tails()
    traced = traced_bytes(log)
    assert len(traced) == 5, traced
    # Half the float32 bytes each way, and a few small tensors: the global
    # step, the BatchNorm statistics the chief reads, the local steps the
    # accumulators get.
    assert all(MODEL_BYTES / 2 <= pulled < 0.52 * MODEL_BYTES
               for pulled, _ in traced), traced
    # The push is counted where each ps received it, from the records that
    # ps sent back with the step, and some come too late. Measured in 60
    # traced steps (steps 1-5 of both workers, 3 runs of each dtype): 50
    # whole (360,036-363,244 bytes: the gradients' 359,924 and the small
    # ones), 10 short, down to 187,752 (one ps's records missing); in CI
    # once 22,612. So every push is under the float32 half's bound, and
    # of the five at least one is whole: a float32 push fails the first,
    # a push of nothing (or of one ps's part) the second.
    assert all(pushed < 0.52 * MODEL_BYTES for _, pushed in traced), traced
    assert max(pushed for _, pushed in traced) >= MODEL_BYTES / 2, traced
    if dtype == 'bfloat16':
      assert_bf16_rewrite(train_dir, w, log)
    else:
      assert rewritten(train_dir, w, dtype)
  assert_float32_checkpoint(train_dir)
  reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(train_dir))
  assert len([n for n in reader.get_variable_to_shape_map()
              if n.endswith('/Momentum')]) == (12 if MOMENTUM[dtype] else 0)
  assert_clean_logs(procs)
  # Resumed asynchronously on 1 ps, bfloat16 on the wire; float32 compute,
  # or float16 still (its loss scaling, asynchronous, and momentum).
  again = ['--mixed_precision', '--mixed_precision_dtype=float16'] + (
      MOMENTUM[dtype]) if dtype == 'float16' else []
  start_cluster(procs, cluster_flags(tiny_data, train_dir) + [
      '--max_steps=30', '--nosync_replicas', '--transfer_dtype=bfloat16'] +
                again, suffix='_again',
                worker_env=FLOAT16_ENV if again else None)
  assert set(procs.wait_all(timeout=180).values()) == {0}, procs.tails()
  log = procs.log('worker0_again')
  assert 'Worker 0: resuming from %s/model.ckpt-20\n' % train_dir in log
  assert 'accumulators' not in log  # Restored, not started again or unused.
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
  # float16: a scale that never overflows here, doubled every 3 good steps.
  scaling = ['--initial_loss_scale=4', '--loss_scale_period=3',
             '--save_summaries_steps=1'] if dtype == 'float16' else []
  procs.trainer('mixed', '--max_steps=15', '--mixed_precision',
                '--mixed_precision_dtype=' + dtype, '--trace_steps=3',
                *scaling, *flags,
                env=FLOAT16_ENV if dtype == 'float16' else None)
  assert procs.wait_all(timeout=120) == {'mixed': 0}, procs.tails()
  assert MIXED.search(procs.log('mixed'))
  if dtype == 'auto':  # bfloat16 on a CPU.
    assert_bf16_rewrite(train_dir, 0, procs.log('mixed'))
  else:
    assert rewritten(train_dir, 0, dtype)
    # The flags reach the graph: from 4, doublings only, one every 3 steps
    # (15 steps: 4 or 5 of them; the default period, 2000, would give 0).
    scales = [s for _, s in summaries_in_step_order(train_dir, 'loss_scale')]
    assert scales[0] == 4, scales
    assert all(b in (a, 2 * a) for a, b in zip(scales, scales[1:])), scales
    assert 4 * 2**4 <= scales[-1] <= 4 * 2**5, scales
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


CANNOT_RUN = {
    'bfloat16_on_a_gpu': (
        ['--mixed_precision', '--mixed_precision_dtype=bfloat16',
         '--num_gpus=1'],
        'Error: --mixed_precision_dtype=bfloat16 is for CPU workers: on a GPU '
        'TensorFlow\'s graph rewrite computes float16; drop '
        '--mixed_precision_dtype or --num_gpus'),
    'dtype_alone': (
        ['--mixed_precision_dtype=float16'],
        'Error: --mixed_precision_dtype=float16 needs --mixed_precision: add '
        'it, or drop --mixed_precision_dtype'),
    'no_loss_scale': (
        ['--initial_loss_scale=0'],
        'Error: --initial_loss_scale must be more than 0 (got 0.0)'),
    'no_period': (
        ['--loss_scale_period=0'],
        'Error: --loss_scale_period must be at least 1 (got 0)'),
}


CPUINFO = ('processor\t: 0\nvendor_id\t: GenuineIntel\n'
           'flags\t\t: fpu sse2 avx2 avx512f %s\nbogomips\t: 4000\n')


@pytest.mark.parametrize('flags, num_gpus, hinted', [
    ('avx512_bf16 amx_bf16 amx_tile', 0, True),  # Sapphire Rapids.
    ('amx_bf16', 0, True),
    ('avx512_bf16', 0, False),  # Zen 4: no measurement says it pays.
    ('avx512_vnni', 0, False),
    ('amx_bf16', 1, False),  # A GPU worker computes on its GPU.
])
def test_the_hint_for_mixed_precision_is_the_chiefs_only_with_amx(
    tmp_path, flags, num_gpus, hinted):
  from training.graph import precision  # pylint: disable=g-import-not-at-top
  cpuinfo = tmp_path / 'cpuinfo'
  cpuinfo.write_text(CPUINFO % flags)
  line = precision.mixed_precision_hint(0, num_gpus, str(cpuinfo))
  assert line == (
      'Worker 0: --mixed_precision would be faster on this CPU (AMX-BF16: '
      '1.70x images/s, accuracy unchanged)' if hinted else None)
  # Once a run: the chief says it, no other worker.
  assert precision.mixed_precision_hint(3, num_gpus, str(cpuinfo)) is None
  # No /proc/cpuinfo (not Linux): nothing is said.
  assert precision.mixed_precision_hint(
      0, num_gpus, str(tmp_path / 'none')) is None


def test_a_precision_that_cannot_run_is_one_line(procs, tmp_path):
  # All at once: each spends its few seconds importing TensorFlow.
  for case, (flags, _) in CANNOT_RUN.items():
    procs.trainer(case, '--job_name=worker', '--task_index=0',
                  '--train_dir=' + str(tmp_path / case), *flags)
  assert procs.wait_all(timeout=120) == dict.fromkeys(CANNOT_RUN, 2)
  for case, (_, error) in CANNOT_RUN.items():
    errors = [l for l in procs.log(case).splitlines()
              if l.startswith('Error')]
    assert errors == [error], case
    assert not (tmp_path / case).exists()  # Refused before it touched it.


SKIPPED = re.compile(r'^Worker 0: (\d+) steps so far had float16 gradients '
                     r'that overflowed; they left the weights as they were, '
                     r'and the loss scale is now (\S+)$', re.M)


def skipped_lines(log):
  """[(skipped steps, scale)] of the chief's skipped-steps lines (the scale
  as printed, to 6 digits)."""
  return [(int(n), float(scale)) for n, scale in SKIPPED.findall(log)]


def summaries_in_step_order(train_dir, tag):
  """[(global step, value)] of the chief's summary tag, by step."""
  found = []
  for name in os.listdir(train_dir):
    if name.startswith('events.out.tfevents'):
      for event in tf1.train.summary_iterator(os.path.join(train_dir, name)):
        found += [(event.step, v.simple_value) for v in event.summary.value
                  if v.tag == tag]
  return sorted(found)


def trainable(checkpoint):
  """{name: value} of a checkpoint's weights, BatchNorm betas and biases
  (what SGD changes; not the moving statistics nor averages)."""
  reader = tf.train.load_checkpoint(checkpoint)
  return {n: reader.get_tensor(n) for n in reader.get_variable_to_shape_map()
          if n.rsplit('/', 1)[-1] in ('weights', 'beta', 'biases')}


POWERS_OF_TWO = {2.0**e for e in range(128)}


def same(a, b):
  return a.keys() == b.keys() and all(np.array_equal(a[n], b[n]) for n in a)


@pytest.mark.slow
def test_overflows_in_a_synchronous_cluster_with_a_backup_worker(
    procs, tiny_data, tmp_path):
  """float16 from a scale that overflows, on 2 ps + 3 synchronous workers
  of which 2 make a step: each overflowing step is zeroed on both ps (from
  a finiteness flag per variable), still advances the global step, and
  the steps after the scale came down train."""
  train_dir = str(tmp_path / 'train')
  initial = 2**30
  start_cluster(procs, cluster_flags(tiny_data, train_dir, 3, 2) + [
      '--max_steps=20', '--replicas_to_aggregate=2', '--mixed_precision',
      '--mixed_precision_dtype=float16', '--initial_loss_scale=%d' % initial,
      '--save_summaries_steps=1', '--save_checkpoint_steps=5'], 3, 2,
                worker_env=FLOAT16_ENV)
  codes = procs.wait_all(timeout=240)
  assert codes == dict.fromkeys(
      ['ps0', 'ps1', 'worker0', 'worker1', 'worker2'], 0), procs.tails()
  assert checkpoint_step(train_dir) == 20
  said = skipped_lines(procs.log('worker0'))
  # Only the chief's sync op updates the scale, once a global step: each
  # skipped step halved it (and nothing doubled it: 2000 good steps).
  assert said and all(scale == float('%g' % (initial / 2**n))
                      for n, scale in said), said
  # float16's largest number is 65504: from 2**30 down to 2**21, any
  # gradient above 0.04 overflows (this model's reach 1 and more). So
  # global steps 1-10 were skipped, and left every weight on both ps as it
  # was. (The chief saves when its step
  # finds 5 more global steps: at 5 or a little after.)
  assert said[-1][0] >= 10, said
  saved = sorted(int(p.rsplit('-', 1)[1]) for p in
                 tf.train.get_checkpoint_state(
                     train_dir).all_model_checkpoint_paths)
  assert saved[0] == 0 and 0 < saved[1] <= 10, saved
  first = trainable(os.path.join(train_dir, 'model.ckpt-0'))
  assert first and same(first, trainable(
      os.path.join(train_dir, 'model.ckpt-%d' % saved[1])))
  last = trainable(tf.train.latest_checkpoint(train_dir))
  assert all(not np.array_equal(first[n], last[n]) for n in first), [
      n for n in first if np.array_equal(first[n], last[n])]
  scales = [v for _, v in summaries_in_step_order(train_dir, 'loss_scale')]
  assert scales and all(v in POWERS_OF_TWO and v <= initial for v in scales)
  assert scales[-1] < initial, scales
  assert_clean_logs(procs)


@pytest.mark.slow
def test_a_worker_joining_late_does_not_reset_the_loss_scale(
    procs, tiny_data, tmp_path):
  # Asynchronous, and no end: the chief trains alone, then with worker 1,
  # until the test has seen what it needs.
  flags = cluster_flags(tiny_data, str(tmp_path / 'train')) + [
      '--max_steps=1000000', '--nosync_replicas', '--mixed_precision',
      '--mixed_precision_dtype=float16', '--initial_loss_scale=%d' % 2**24,
      '--loss_scale_period=100000']
  procs.trainer('ps0', '--job_name=ps', '--task_index=0', *flags)
  procs.trainer('worker0', '--job_name=worker', '--task_index=0', *flags,
                env=FLOAT16_ENV)
  # Halved twice at least: a reset to 2**24 would then show (a reset at
  # 2**23 would come back as 2**24 / 2, as if nothing happened).
  wait_until(lambda: any(scale <= 2**22 for _, scale in skipped_lines(
      procs.log('worker0'))), 120, 'the scale down to 2**22', procs)
  # Worker 1's own initial scale, 2**30: were the shared scale and its
  # count initialized again when it joined, the chief's next line would say
  # a scale of 2**30 / 2**(its count), far above the ones before.
  procs.trainer('worker1', '--job_name=worker', '--task_index=1', *flags,
                '--initial_loss_scale=%d' % 2**30, env=FLOAT16_ENV)
  wait_until(lambda: steps(procs, 'worker1'), 120,
           'worker 1 training', procs)
  # The global step after worker 1's 5th step: it had joined by then.
  joined = steps(procs, 'worker1')[0]
  wait_until(lambda: steps(procs, 'worker0')[-1] > joined + 20, 120,
           'the chief training on after worker 1 joined', procs)
  said = [scale for _, scale in skipped_lines(procs.log('worker0'))]
  assert 'Error' not in procs.log('worker1'), procs.tails()
  procs.kill_all()
  # With 100000 good steps to double it, the scale only ever comes down.
  # Had worker 1 initialized it again, to 2**24, the chief's next step
  # would have overflowed and said a scale above the ones before.
  assert said and all(a >= b for a, b in zip(said, said[1:])), said


def run_scaled_steps(steps, initial_scale, period=2000, rule=None):
  """Trains the trainer's graph in this process with float16's loss scaling
  from initial_scale, doubled after period good steps in a row (in
  float32: the scaling is the same arithmetic), with the
  train_graph.UpdateRule rule (None: plain SGD).

  Returns:
    [(global step after the step, skipped steps, scale, weights or
    momentum's accumulators changed, how many accumulators were not all
    zeros before it, whether every weight moved as rule's update of its
    accumulator says)] per step.
  """
  import train_graph  # pylint: disable=g-import-not-at-top
  from training.session import hooks  # pylint: disable=g-import-not-at-top
  rng = np.random.RandomState(0)
  with tf.Graph().as_default():
    tf1.set_random_seed(0)
    images = tf.constant(rng.rand(8, 32, 32, 3).astype(np.float32))
    labels = tf.constant(rng.randint(0, 10, 8).astype(np.int32))
    graph = train_graph.build(images=images, labels=labels, num_ps=0,
                              worker=0, schedule=CONSTANT_RATE,
                              loss_scale=initial_scale,
                              loss_scale_period=period,
                              rule=rule or train_graph.SGD)
    scaling = graph.loss_scaling
    slots = {v.op.name: v for v in tf1.global_variables()
             if v.op.name.endswith('/Momentum')}
    accumulators = [slots[w.op.name + '/Momentum']
                    for w in tf1.trainable_variables() if slots]
    weights = tf1.trainable_variables() + accumulators
    with tf1.train.MonitoredSession(
        session_creator=tf1.train.ChiefSessionCreator(
            scaffold=train_graph.scaffold(graph)),
        hooks=[hooks.SkippedStepsHook(scaling.after)]) as sess:
      def read():
        return sess.run_step_fn(lambda step_context: step_context.session.run(
            [graph.global_step, scaling.skipped_steps, scaling.scale,
             weights]))
      before = read()[3]
      rows = []
      for _ in range(steps):
        sess.run(graph.step_after)
        step, skipped, scale, now = read()
        changed = not all(np.array_equal(a, b) for a, b in zip(before, now))
        full = sum(a.any() for a in before[len(weights) - len(accumulators):])
        rows.append((step, skipped, scale, changed, full,
                     follows(rule, before, now, len(accumulators))))
        before = now
  return rows


def follows(rule, before, after, count):
  """Whether each of the weights (the first count of before and after, in
  the order of their accumulators, the last count) moved as momentum's
  rule says from its accumulator before and after, at CONSTANT_RATE:
  -rate x acc, with Nesterov's -rate x (gradient + m acc), the gradient
  being acc - m x its old acc. None without momentum."""
  if not count:
    return None
  m, rate = rule.momentum, CONSTANT_RATE.initial
  return all(np.allclose(
      w0 - w1, rate * ((1 + m) * a1 - m * a0 if rule.nesterov else a1),
      rtol=1e-3, atol=1e-7)
             for w0, w1, a0, a1 in zip(before[:count], after[:count],
                                       before[-count:], after[-count:]))


def test_overflowing_steps_apply_nothing_and_halve_the_scale(capsys):
  # 2**127 times any gradient above 2 is float32's inf: from this seed's
  # weights, the first step overflows.
  rows = run_scaled_steps(40, 2.0**127)
  # The chief's hook says so once each time the count grew, after the step.
  assert capsys.readouterr().err.splitlines() == [
      'Worker 0: %d steps so far had float16 gradients that overflowed; they '
      'left the weights as they were, and the loss scale is now %g' % (
          n, 2.0**(127 - n)) for n in range(1, rows[-1][1] + 1)]
  assert [r[0] for r in rows] == list(range(1, 41))  # Every step counts.
  said = 0
  for step, skipped, scale, changed, _, _ in rows:
    assert scale == 2.0**(127 - skipped), (step, skipped, scale)
    # A step that overflowed applied nothing; every other one applied.
    assert changed == (skipped == said), (step, skipped, changed)
    assert skipped - said in (0, 1)
    said = skipped
  assert rows[0][1] == 1  # The first.
  assert rows[-1][3]  # And it found a scale that fits.


def test_overflowing_steps_leave_momentum_as_it_was():
  """With Nesterov's momentum, whose accumulators would move the weights
  and decay on a zero gradient: a step that overflowed changes neither.
  Doubled every 3 good steps, the scale overflows again after good steps,
  with the accumulators full."""
  import train_graph  # pylint: disable=g-import-not-at-top
  rows = run_scaled_steps(40, 2.0**127, period=3,
                          rule=train_graph.UpdateRule('momentum', 0.9, True))
  said, overflows_with_accumulators = 0, 0
  for step, skipped, _, changed, full, rule_kept in rows:
    assert changed == (skipped == said), (step, skipped, changed)
    # A good step is Nesterov's update at momentum 0.9 and the full rate.
    assert rule_kept or skipped > said, (step, skipped)
    if skipped > said and full:
      # Every weight's accumulator (the 12) had moved by then.
      assert full == 12, (step, full)
      overflows_with_accumulators += 1
    said = skipped
  assert rows[-1][4] == 12  # Momentum was in use.
  # This data and seed overflow at steps 7, 18 and 30 (after the first).
  assert overflows_with_accumulators >= 2, rows


def test_every_3_good_steps_in_a_row_double_the_scale():
  rows = run_scaled_steps(10, 4.0, period=3)
  # Steps 3, 6 and 9 each end 3 good steps in a row.
  assert [r[2] for r in rows] == [4, 4, 8, 8, 8, 16, 16, 16, 32, 32]
  assert [(r[0], r[1], r[3]) for r in rows] == [
      (n, 0, True) for n in range(1, 11)]  # None skipped, every one applied.


@pytest.fixture
def two_workers(procs):
  """Returns start(initial_scale): two asynchronous workers' graphs of the
  trainer (float16 compute on the CPU, with its loss scaling) on a real
  cluster of 1 ps and 2 workers (helpers.SERVERS; the workers' servers
  rewrite their graphs to float16 as a worker does), the model
  initialized, each with a session on its worker's server:
  [(TrainingGraph, session)] for worker 0 and 1."""
  ports = free_ports(3)
  hosts = ['localhost:%d' % p for p in ports]
  cluster = {'ps': hosts[:1], 'worker': hosts[1:]}
  procs.start('servers', ['-c', SERVERS, json.dumps(cluster)],
              env=dict(FLOAT16_ENV, TF_CPP_MIN_LOG_LEVEL='2',
                       TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_EMULATE_FP16='0'))
  config = tf1.ConfigProto()
  config.graph_options.rewrite_options.auto_mixed_precision_cpu = (
      rewriter_config_pb2.RewriterConfig.ON)
  sessions = []

  def start(initial_scale):
    import train_graph  # pylint: disable=g-import-not-at-top
    procs.wait_for_line('servers', 'serving', timeout=60)
    workers = []
    for task in (0, 1):
      with tf.Graph().as_default() as graph:
        rng = np.random.RandomState(task)
        inputs, variables = train_graph.devices(
            cluster=tf.train.ClusterSpec(cluster), task_index=task,
            num_gpus=0)
        with tf.device(inputs):
          images = tf.constant(rng.rand(16, 32, 32, 3).astype(np.float32))
          labels = tf.constant(rng.randint(0, 10, 16).astype(np.int32))
        with tf1.device(variables):
          built = train_graph.build(images=images, labels=labels, num_ps=1,
                                    worker=task,
                                    schedule=CONSTANT_RATE,
                                    loss_scale=initial_scale,
                                    pack_transfers=True)
        init = tf.group(tf1.global_variables_initializer() if task == 0
                        else tf.no_op(), built.loss_scaling.local_init_op())
      session = tf1.Session('grpc://' + hosts[1 + task], graph=graph,
                            config=config)
      sessions.append(session)
      session.run(init)  # Worker 0's first: worker 1 resets nothing.
      workers.append((built, session))
    return workers

  yield start
  for session in sessions:
    session.close()


def scaling_state(worker):
  """(scale, skipped steps, global step) on the ps, read by worker."""
  built, session = worker
  return tuple(session.run([built.loss_scaling.scale,
                            built.loss_scaling.skipped_steps,
                            built.global_step]))


def trainable_weights(worker):
  built, session = worker
  return session.run(built.loss.graph.get_collection(
      tf1.GraphKeys.TRAINABLE_VARIABLES))


@pytest.mark.slow
def test_two_async_workers_that_overflowed_at_one_scale_halve_it_once(
    two_workers):
  scale = 2.0**24  # float16's gradients overflow (its largest: 65504).
  workers = two_workers(scale)
  weights = trainable_weights(workers[0])
  # Worker 0's step, then worker 1's, both from gradients computed with the
  # same scale: the one worker 1 would have read before worker 0 halved it.
  for built, session in workers:
    session.run(built.step_after, {built.loss_scaling.used_scale: scale})
  # Halved once, from the scale both used: halving the scale found at each
  # update would have left scale / 4.
  assert scaling_state(workers[1]) == (scale / 2, 2, 2)
  assert all(np.array_equal(a, b) for a, b in zip(
      weights, trainable_weights(workers[0])))  # Both applied nothing.


@pytest.mark.slow
def test_a_workers_update_of_the_scale_waits_for_anothers(two_workers):
  """The lost update, made to happen: worker 0 holds the ps's mutex between
  its read of the scale and its write (as a finite step's update does)
  while worker 1's overflowing step updates the scale; worker 1's halving
  must come after worker 0's write, not be overwritten by it."""
  scale = 2.0**24
  workers = two_workers(scale)
  (built0, session0), (built1, session1) = workers
  scaling = built0.loss_scaling
  with built0.loss.graph.as_default(), tf.device('/job:ps/task:0/cpu:0'):
    entered = tf1.FIFOQueue(1, tf.int32)
    release = tf1.FIFOQueue(1, tf.int32)

    def hold():
      read = scaling.scale.read_value()
      with tf.control_dependencies([read]):
        told = entered.enqueue(1)
      with tf.control_dependencies([told]):
        waited = release.dequeue()
      with tf.control_dependencies([waited]):
        wrote = scaling.scale.assign(read, read_value=False)
      with tf.control_dependencies([wrote]):
        return tf.identity(read)
    held = scaling.critical.execute(hold)
    wait_entered, let_go = entered.dequeue(), release.enqueue(1)
  results = {}
  holder = threading.Thread(target=lambda: results.update(
      held=session0.run(held)), daemon=True)
  holder.start()
  # Worker 0 holds the mutex, has read the scale.
  session0.run(wait_entered, options=tf1.RunOptions(timeout_in_ms=60000))
  stepper = threading.Thread(target=lambda: results.update(
      step=session1.run(built1.step_after)), daemon=True)
  stepper.start()
  # Long enough for its first step's graph to be built on a loaded machine
  # (a watch of a stall: nothing may happen in it).
  stepper.join(timeout=10)
  waited = stepper.is_alive()  # Worker 1's update: it waits for the mutex.
  session0.run(let_go)
  holder.join(timeout=30)
  stepper.join(timeout=30)
  assert results == {'held': scale, 'step': 1}
  # Worker 0 wrote back what it read, then worker 1 halved it (without the
  # mutex: worker 1 halved it, then worker 0 wrote the scale back).
  assert scaling_state(workers[0]) == (scale / 2, 1, 1)
  assert waited
