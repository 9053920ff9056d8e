"""--optimizer=momentum: its updates in a synchronous cluster as in one
process and by its rule, and resumes across optimizers. (Where its
accumulators live: test_placement.py; float16's skipped steps:
test_precision.py; bad flags: test_cluster.py.)"""

import concurrent.futures
import json
import os

from google.protobuf import text_format
import numpy as np
import pytest
import tensorflow as tf

from helpers import SERVERS, free_ports, single_process_flags

import cifar10_model
import train_graph
from training import learning_rate

tf1 = tf.compat.v1

RATE = 0.1  # CONSTANT's, at every step here.
CONSTANT = learning_rate.Schedule('exponential', RATE, 128, 'none', 0, 1000,
                                  1000, 0.1)
UPDATES = 3


def batch():
  rng = np.random.default_rng(0)
  return (rng.normal(size=(8, 32, 32, 3)).astype(np.float32),
          rng.integers(0, 10, size=8).astype(np.int32))


def train(out, rule, initial=None, target='', cluster=None, num_ps=0):
  """UPDATES updates of the trainer's graph with rule on batch(), from the
  checkpoint initial (None: its own initial values, saved as out-0): in one
  process, or over cluster's num_ps ps tasks and its one worker, through
  SyncReplicasOptimizer (1 gradient an update). Saves out-N after update
  N; returns ([out-0 or initial, out-1, ...], [{weight: its gradient in
  update N}])."""
  images, labels = batch()
  with tf.Graph().as_default():
    inputs, variables = train_graph.devices(cluster=cluster, task_index=0,
                                            num_gpus=0)
    with tf1.device(inputs):
      images, labels = tf.constant(images), tf.constant(labels)
    with tf1.device(variables):
      built = train_graph.build(images=images, labels=labels, num_ps=num_ps,
                                worker=0, schedule=CONSTANT, rule=rule,
                                sync=(1, 1) if cluster else None)
    saver = tf1.train.Saver(sharded=bool(cluster))
    config = tf1.ConfigProto(operation_timeout_in_ms=120000)  # No hang.
    names = [v.op.name for v in tf1.trainable_variables()]
    with tf1.Session(target, config=config) as sess, (
        concurrent.futures.ThreadPoolExecutor(1)) as pool:
      sess.run(tf1.global_variables_initializer())
      sess.run(tf1.local_variables_initializer())
      paths = [saver.save(sess, out, global_step=0) if initial is None
               else initial]
      saver.restore(sess, paths[0])
      opt = built.sync_opt
      if opt:  # The chief's SyncReplicasHook, without the first tokens:
        # the step's token comes from the update of its own gradient.
        sess.run(opt.chief_init_op)
        sync_op = opt.get_chief_queue_runner().enqueue_ops[0]
      gradients = []
      for update in range(1, UPDATES + 1):
        # One update (the chief's sync thread runs it in a loop).
        synced = pool.submit(sess.run, sync_op) if opt else None
        # The gradient, then (sync) the token.
        _, values = sess.run([built.step_after, built.gradients])
        gradients.append(dict(zip(names, values)))
        if synced:
          synced.result()
        paths.append(saver.save(sess, out, global_step=update))
  return paths, gradients


def accumulators(path):
  reader = tf.train.load_checkpoint(path)
  return {name[:-len('/Momentum')]: reader.get_tensor(name)
          for name in reader.get_variable_to_shape_map()
          if name.endswith('/Momentum')}


@pytest.mark.parametrize('num_ps, nesterov', [(1, False), (2, True)],
                         ids=['1ps', '2ps_nesterov'])
def test_momentum_in_a_sync_cluster_updates_as_one_process(
    procs, tmp_path, monkeypatch, num_ps, nesterov):
  """Three updates through ps tasks and a worker (gRPC servers, in a
  process of their own; 2 ps: the big kernels partitioned) and in one
  process, from the same weights on the same batch: every variable after
  them, accumulators included, the same; and each update in one process
  is momentum's rule in numpy, from the gradient the step computed and
  the saved accumulators (Nesterov's too). Dropout off: nothing drawn at
  random."""
  monkeypatch.setattr(train_graph, 'DROPOUT_KEEP_PROB', 1.0)
  rule = train_graph.UpdateRule('momentum', 0.9, nesterov)
  alone, gradients = train(str(tmp_path / 'alone'), rule)
  for before, after, gradient in zip(alone, alone[1:], gradients):
    weights = [tf.train.load_checkpoint(p) for p in (before, after)]
    accumulated = [accumulators(p) for p in (before, after)]
    assert len(accumulated[1]) == len(gradient) == 12  # One a weight.
    for name, acc in accumulated[1].items():
      np.testing.assert_allclose(acc, 0.9 * accumulated[0].get(
          name, 0) + gradient[name], rtol=1e-4, atol=1e-7, err_msg=name)
      # The weight moves by RATE x acc, or with Nesterov by
      # RATE x (gradient + 0.9 acc).
      step = gradient[name] + 0.9 * acc if nesterov else acc
      np.testing.assert_allclose(
          weights[0].get_tensor(name) - weights[1].get_tensor(name),
          RATE * step, rtol=1e-3, atol=1e-7, err_msg=name)
      assert acc.any(), name
  hosts = ['localhost:%d' % p for p in free_ports(num_ps + 1)]
  spec = {'ps': hosts[:num_ps], 'worker': hosts[num_ps:]}
  procs.start('servers', ['-c', SERVERS, json.dumps(spec)],
              env={'TF_CPP_MIN_LOG_LEVEL': '2'})
  procs.wait_for_line('servers', 'serving', 60)
  clustered, _ = train(str(tmp_path / 'cluster'), rule, initial=alone[0],
                       target='grpc://' + hosts[-1],
                       cluster=tf.train.ClusterSpec(spec), num_ps=num_ps)
  start = tf.train.load_checkpoint(alone[0])
  alone, clustered = (tf.train.load_checkpoint(p[-1])
                      for p in (alone, clustered))
  names = alone.get_variable_to_shape_map()
  assert names == clustered.get_variable_to_shape_map()
  # Step, weights, statistics, averages, accumulators.
  assert len(names) == 1 + 12 + 10 + 12 + 12
  for name in names:
    moved = alone.get_tensor(name) - start.get_tensor(name)
    np.testing.assert_allclose(
        clustered.get_tensor(name) - start.get_tensor(name), moved,
        rtol=1e-4, atol=1e-7, err_msg=name)
  assert alone.get_tensor('global_step') == UPDATES


def test_resumes_across_optimizers(procs, tiny_data, tmp_path):
  """SGD's checkpoint resumed with Nesterov's momentum, its accumulators at
  zero; then momentum's resumed with SGD, which leaves them unused."""
  train_dir = str(tmp_path / 'train')
  flags = single_process_flags(tiny_data, train_dir) + [
      '--initial_learning_rate=%g' % RATE]  # Through step 20 (staircase).
  nesterov = ['--optimizer=momentum', '--nesterov']
  for name, more in [('sgd', ['--max_steps=10']),
                     ('momentum', ['--max_steps=11'] + nesterov),
                     ('sgd_again', ['--max_steps=20'])]:
    procs.trainer(name, *flags, *more)
    assert procs.wait_all(timeout=120)[name] == 0, procs.tails()
  assert ('Worker 0: %s/model.ckpt-10 has no momentum accumulators '
          '(--optimizer=sgd wrote it): resuming from it, the 12 accumulators '
          'starting at zero' % train_dir) in procs.log('momentum')
  assert ("Worker 0: %s/model.ckpt-11 holds momentum's 12 accumulators "
          '(--optimizer=momentum wrote it); --optimizer=sgd leaves them '
          'unused' % train_dir) in procs.log('sgd_again')
  ten, eleven = (tf.train.load_checkpoint('%s/model.ckpt-%d' % (train_dir, n))
                 for n in (10, 11))
  # Written again as the momentum run started: its accumulators, at zero.
  at_ten = accumulators('%s/model.ckpt-10' % train_dir)
  assert len(at_ten) == 12 and not any(a.any() for a in at_ten.values())
  # From zero, one Nesterov update moves a weight by the rate x (1 + 0.9)
  # x the accumulator (the gradient); from any other start, not.
  accumulated = accumulators('%s/model.ckpt-11' % train_dir)
  assert len(accumulated) == 12
  for name, acc in accumulated.items():
    np.testing.assert_allclose(
        ten.get_tensor(name) - eleven.get_tensor(name), RATE * 1.9 * acc,
        rtol=1e-3, atol=1e-7, err_msg=name)
  assert not accumulators('%s/model.ckpt-20' % train_dir)
  # What the accumulators add to a checkpoint: the model's float32 bytes.
  sizes = [os.path.getsize('%s/model.ckpt-%d.data-00000-of-00001' % (
      train_dir, n)) for n in (11, 20)]
  assert sizes[0] - sizes[1] == cifar10_model.MODEL_BYTES


def test_the_flags_reach_the_trainers_graph(procs, tiny_data, tmp_path):
  """--momentum, --nesterov, --weight_decay and --label_smoothing, read
  from the graph the chief wrote (graph.pbtxt): each update's factor and
  kind, the factor of each of the 6 L2 terms, the smoothed targets."""
  train_dir = str(tmp_path / 'train')
  procs.trainer('single', *single_process_flags(tiny_data, train_dir),
                '--max_steps=2', '--optimizer=momentum', '--momentum=0.5',
                '--nesterov', '--weight_decay=0.001', '--label_smoothing=0.2')
  assert procs.wait_all(timeout=120) == {'single': 0}, procs.tails()
  with open(os.path.join(train_dir, 'graph.pbtxt')) as f:
    graph = text_format.Parse(f.read(), tf1.GraphDef())
  nodes = {n.name: n for n in graph.node}

  def value(name):
    return tf.make_ndarray(nodes[name.split(':')[0]].attr['value'].tensor)

  updates = [n for n in graph.node if n.op == 'ResourceApplyMomentum']
  assert len(updates) == 12
  assert all(n.attr['use_nesterov'].b for n in updates)
  assert {float(value(n.input[4])) for n in updates} == {0.5}  # momentum
  scales = [n for n in nodes if n.endswith('/l2_regularizer/scale')]
  assert len(scales) == 6
  assert {float(value(n)) for n in scales} == {np.float32(0.001)}
  # The targets: one_hot(labels) x (1 - 0.2) + 0.2 / 10.
  one_hot, = [n.name for n in graph.node if n.op == 'OneHot']
  scaled, = [n for n in graph.node if n.op == 'Mul' and one_hot in n.input]
  shifted, = [n for n in graph.node if n.op in ('Add', 'AddV2') and
              scaled.name in n.input]
  factor, = [i for i in scaled.input if i != one_hot]
  offset, = [i for i in shifted.input if i != scaled.name]
  assert (float(value(factor)), float(value(offset))) == (
      np.float32(0.8), np.float32(0.02))
