"""--optimizer=momentum: its updates in a synchronous cluster as in one
process and by its rule, and resumes across optimizers. (Where its
accumulators live: test_placement.py; float16's skipped steps:
test_precision.py; bad flags: test_cluster.py.)"""

import concurrent.futures
import contextlib
import glob
import json
import os
import re

from google.protobuf import text_format
import numpy as np
import pytest
import tensorflow as tf

from helpers import SERVERS, cluster_flags, free_ports
from helpers import single_process_flags, start_cluster

import cifar10_model
import train_graph
from training.graph import learning_rate
from training.graph import ps_gradients
from training.session import hooks

tf1 = tf.compat.v1

RATE = 0.1  # CONSTANT's, at every step here.
CONSTANT = learning_rate.Schedule('exponential', RATE, 128, 'none', 0, 1000,
                                  1000, 0.1)
UPDATES = 3
WORKERS = 2  # In a cluster.


def batch():
  rng = np.random.default_rng(0)
  return (rng.normal(size=(8, 32, 32, 3)).astype(np.float32),
          rng.integers(0, 10, size=8).astype(np.int32))


def worker_graph(*, rule, cluster, worker, packed=True):
  """The trainer's graph of worker on batch(), in a graph of its own: for
  one process (cluster None), or over cluster's ps tasks through
  SyncReplicasOptimizer, each update averaging WORKERS gradients; packed
  (in a cluster) as the trainer packs by default: one accumulator a ps,
  the step's end as one tensor."""
  images, labels = batch()
  graph = tf.Graph()
  with graph.as_default():
    inputs, variables = train_graph.devices(cluster=cluster,
                                            task_index=worker, num_gpus=0)
    with tf1.device(inputs):
      images, labels = tf.constant(images), tf.constant(labels)
    with tf1.device(variables):
      built = train_graph.build(
          images=images, labels=labels,
          num_ps=cluster.num_tasks('ps') if cluster else 0, worker=worker,
          schedule=CONSTANT, rule=rule,
          sync=(WORKERS, WORKERS) if cluster else None,
          pack_transfers=packed and cluster is not None)
  return graph, built


def train(out, rule, initial=None, spec=None, packed=True):
  """UPDATES updates of the trainer's graph with rule on batch(), from the
  checkpoint initial (None: its own initial values, saved as out-0): in one
  process, or on the gRPC servers of spec (its ps tasks and WORKERS
  workers, each worker a session of its own, on the same batch). Saves
  out-N after update N; returns ([out-0 or initial, out-1, ...], [{weight:
  its gradient in update N}], {node: the task it ran on in update 1's
  trace of the chief's update})."""
  cluster = tf.train.ClusterSpec(spec) if spec else None
  graph, built = worker_graph(rule=rule, cluster=cluster, worker=0,
                              packed=packed)
  config = tf1.ConfigProto(operation_timeout_in_ms=120000)  # No hang.
  trace = tf1.RunOptions(trace_level=tf1.RunOptions.FULL_TRACE)
  metadata = tf1.RunMetadata()
  with graph.as_default(), contextlib.ExitStack() as stack:
    saver = tf1.train.Saver(sharded=bool(cluster))
    names = [v.op.name for v in tf1.trainable_variables()]
    sess = stack.enter_context(tf1.Session(
        'grpc://' + spec['worker'][0] if spec else '', config=config))
    pool = stack.enter_context(concurrent.futures.ThreadPoolExecutor(2))
    sess.run(tf1.global_variables_initializer())
    sess.run(tf1.local_variables_initializer())
    paths = [saver.save(sess, out, global_step=0) if initial is None
             else initial]
    saver.restore(sess, paths[0])
    opt = built.sync_opt
    if opt:  # The chief's SyncReplicasHook, without the first tokens: the
      # workers' steps take theirs from the update of their gradients.
      sess.run([opt.chief_init_op,
                ps_gradients.fill_joined_weights(chief=True)])
      sess.run(ps_gradients.fill_pulled_weights())
      sync_op = opt.get_chief_queue_runner().enqueue_ops[0]
      other, other_built = worker_graph(rule=rule, cluster=cluster, worker=1,
                                        packed=packed)
      with other.as_default():
        local_init = tf1.local_variables_initializer()
        # The worker's own start: its local step, the joined weights where
        # none are, then its copy of them.
        start = hooks.SyncReplicasHook(other_built.sync_opt, False,
                                       other_built.global_step)
      worker1 = stack.enter_context(tf1.Session(
          'grpc://' + spec['worker'][1], graph=other, config=config))
      worker1.run(local_init)
      start.after_create_session(worker1, None)
    gradients = []
    for update in range(1, UPDATES + 1):
      # One update (the chief's sync thread runs it in a loop), traced once.
      traced = {'options': trace, 'run_metadata': metadata} if (
          update == 1) else {}
      synced = opt and pool.submit(sess.run, sync_op, **traced)
      # Worker 1's step, then the chief's gradient; each waits for a token.
      theirs = opt and pool.submit(worker1.run, other_built.step_after)
      reached, values = sess.run([built.step_after, built.gradients])
      gradients.append(dict(zip(names, values)))
      if opt:  # One update of the 2 gradients: both reach the same step.
        synced.result()
        assert reached == theirs.result() == update
      paths.append(saver.save(sess, out, global_step=update))
  ran_on = {node.node_name: (where.job, where.task)
            for where, device in ((tf.DeviceSpec.from_string(d.device), d)
                                  for d in metadata.step_stats.dev_stats)
            for node in device.node_stats}
  return paths, gradients, ran_on


def accumulators(path):
  reader = tf.train.load_checkpoint(path)
  return {name[:-len('/Momentum')]: reader.get_tensor(name)
          for name in reader.get_variable_to_shape_map()
          if name.endswith('/Momentum')}


@pytest.mark.slow
@pytest.mark.parametrize('num_ps, nesterov, packed',
                         [(1, False, False), (1, False, True),
                          (2, True, True)],
                         ids=['1ps_plain', '1ps', '2ps_nesterov'])
def test_momentum_in_a_sync_cluster_updates_as_one_process(
    procs, tmp_path, monkeypatch, num_ps, nesterov, packed):
  """Three updates in one process, and through ps tasks and 2 synchronous
  workers (gRPC servers, in a process of their own; 2 ps: the big kernels
  partitioned), each update the mean of the workers' 2 gradients on the
  same batch: every variable after them, accumulators included, the same
  (momentum applied once an update, not once a gradient). Each update in
  one process is momentum's rule in numpy, from the gradient the step
  computed and the saved accumulators (Nesterov's too). In the cluster's
  trace, each weight's update ran on the ps that holds the weight and its
  accumulator. Dropout off: nothing drawn at random."""
  monkeypatch.setattr(train_graph, 'DROPOUT_KEEP_PROB', 1.0)
  rule = train_graph.UpdateRule('momentum', 0.9, nesterov)
  alone, gradients, _ = train(str(tmp_path / 'alone'), rule)
  for before, after, gradient in zip(alone, alone[1:], gradients):
    weights = [tf.train.load_checkpoint(p) for p in (before, after)]
    accumulated = [accumulators(p) for p in (before, after)]
    assert len(accumulated[0]) == len(accumulated[1]) == len(gradient) == 12
    for name, acc in accumulated[1].items():
      np.testing.assert_allclose(acc, 0.9 * accumulated[0][name] +
                                 gradient[name], rtol=1e-4, atol=1e-7,
                                 err_msg=name)
      # The weight moves by RATE x acc, or with Nesterov by
      # RATE x (gradient + 0.9 acc).
      step = gradient[name] + 0.9 * acc if nesterov else acc
      np.testing.assert_allclose(
          weights[0].get_tensor(name) - weights[1].get_tensor(name),
          RATE * step, rtol=1e-3, atol=1e-7, err_msg=name)
      assert acc.any(), name
  hosts = ['localhost:%d' % p for p in free_ports(num_ps + WORKERS)]
  spec = {'ps': hosts[:num_ps], 'worker': hosts[num_ps:]}
  procs.start('servers', ['-c', SERVERS, json.dumps(spec)],
              env={'TF_CPP_MIN_LOG_LEVEL': '2'})
  procs.wait_for_line('servers', 'serving', 60)
  clustered, _, ran_on = train(str(tmp_path / 'cluster'), rule,
                               initial=alone[0], spec=spec, packed=packed)
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
  assert clustered.get_tensor('global_step') == UPDATES  # 2 gradients each.
  # Where each update ran: the weight's handle, the accumulator's and the
  # update, all on one ps; the names from the graph, the tasks from the run.
  graph, _ = worker_graph(rule=rule, cluster=tf.train.ClusterSpec(spec),
                          worker=0, packed=packed)
  updates = [op for op in graph.get_operations()
             if op.type == 'ResourceApplyMomentum']
  # 2 ps: 2 kernels in 2 parts each, each part with its own accumulator.
  assert len(updates) == 12 + 2 * (num_ps - 1)
  for op in updates:
    weight, accumulator = (t.op.name for t in op.inputs[:2])
    assert accumulator == weight + '/Momentum'
    assert ran_on[op.name] == ran_on[weight] == ran_on[accumulator], op.name
  assert {ran_on[op.name] for op in updates} == {
      ('ps', i) for i in range(num_ps)}


def test_each_session_start_fills_the_joined_weights(procs):
  """A synchronous step pulls each ps's weights from the variable the
  chief's update joins them into (training/graph/ps_gradients.py; that each
  update refreshes it, the test above: its updates through the cluster
  match one process only if each did). A session's start fills it: another
  worker's only where a new ps has none (one joining mid-run leaves an
  update's refresh alone), the chief's always (it may have just restored
  other weights). 1 ps + 2 workers' gRPC servers; the weights joined here
  by numpy."""
  hosts = ['localhost:%d' % p for p in free_ports(1 + WORKERS)]
  spec = {'ps': hosts[:1], 'worker': hosts[1:]}
  procs.start('servers', ['-c', SERVERS, json.dumps(spec)],
              env={'TF_CPP_MIN_LOG_LEVEL': '2'})
  procs.wait_for_line('servers', 'serving', 60)
  graph, _ = worker_graph(rule=train_graph.SGD,
                          cluster=tf.train.ClusterSpec(spec), worker=1)
  with graph.as_default():
    [(joined, weights)] = tf1.get_collection(ps_gradients.JOINED_WEIGHTS)
    assert {w.ref() for w in weights} == {
        v.ref() for v in tf1.trainable_variables()}  # Every weight, 1 ps.
    other, chief = (ps_gradients.fill_joined_weights(chief=c)
                    for c in (False, True))
    # Stands for the chief's restore of other weights.
    restore = tf.group(*[w.assign_add(tf.ones_like(w)) for w in weights])
    config = tf1.ConfigProto(operation_timeout_in_ms=120000)  # No hang.
    with tf1.Session('grpc://' + spec['worker'][1], config=config) as sess:
      sess.run(tf1.global_variables_initializer())

      def by_numpy():
        return np.concatenate([v.ravel() for v in sess.run(weights)])

      first = by_numpy()
      assert not sess.run(tf1.is_variable_initialized(joined))
      sess.run(other)  # A new ps: filled.
      np.testing.assert_array_equal(sess.run(joined), first)
      sess.run(restore)
      sess.run(other)  # Filled already: left as it was.
      np.testing.assert_array_equal(sess.run(joined), first)
      sess.run(chief)
      np.testing.assert_array_equal(sess.run(joined), by_numpy())
      np.testing.assert_array_equal(by_numpy(), first + 1)


def checkpoint(train_dir, step):
  """{name: value} of every tensor in train_dir's model.ckpt-step."""
  reader = tf.train.load_checkpoint('%s/model.ckpt-%d' % (train_dir, step))
  return {name: reader.get_tensor(name)
          for name in reader.get_variable_to_shape_map()}


@pytest.mark.slow
@pytest.mark.parametrize('num_ps', [0, 2], ids=['one_process', '2ps'])
def test_resumes_across_optimizers(procs, tiny_data, tmp_path, num_ps):
  """SGD's checkpoint resumed with Nesterov's momentum, its weights as SGD
  left them and its accumulators at zero; then momentum's resumed with SGD,
  which leaves them unused. In one process, and with 2 ps (a worker), the
  big kernels' accumulators in 2 parts each."""
  train_dir = str(tmp_path / 'train')
  nesterov = ['--optimizer=momentum', '--nesterov']
  for name, more in [('sgd', ['--max_steps=10']),
                     ('momentum', ['--max_steps=11'] + nesterov),
                     ('sgd_again', ['--max_steps=20'])]:
    more.append('--initial_learning_rate=%g' % RATE)  # Through step 20.
    if num_ps:
      start_cluster(procs, cluster_flags(tiny_data, train_dir, num_workers=1,
                                         num_ps=num_ps) + more,
                    num_workers=1, num_ps=num_ps, suffix='_' + name)
    else:
      procs.trainer('worker0_' + name,
                    *single_process_flags(tiny_data, train_dir), *more)
    assert set(procs.wait_all(timeout=120).values()) == {0}, procs.tails()
    if name == 'sgd':
      sgd_ten = checkpoint(train_dir, 10)
  assert procs.log('worker0_momentum').splitlines().count(
      'Worker 0: %s/model.ckpt-10 has no momentum accumulators '
      '(--optimizer=sgd wrote it): resuming from it, the 12 accumulators '
      'starting at zero' % train_dir) == 1
  assert procs.log('worker0_sgd_again').splitlines().count(
      "Worker 0: %s/model.ckpt-11 holds momentum's 12 accumulators "
      '(--optimizer=momentum wrote it); --optimizer=sgd leaves them '
      'unused' % train_dir) == 1
  # Written again as the momentum run started: SGD's tensors as they were,
  # and the accumulators at zero.
  ten = checkpoint(train_dir, 10)
  at_ten = accumulators('%s/model.ckpt-10' % train_dir)
  assert sorted(ten) == sorted(list(sgd_ten) + [
      name + '/Momentum' for name in at_ten])
  for name, value in sgd_ten.items():
    np.testing.assert_array_equal(ten[name], value, err_msg=name)
  assert len(at_ten) == 12 and not any(a.any() for a in at_ten.values())
  # From zero, one Nesterov update moves a weight by the rate x (1 + 0.9)
  # x the accumulator (the gradient); from any other start, not.
  eleven = checkpoint(train_dir, 11)
  accumulated = accumulators('%s/model.ckpt-11' % train_dir)
  assert len(accumulated) == 12
  for name, acc in accumulated.items():
    np.testing.assert_allclose(ten[name] - eleven[name], RATE * 1.9 * acc,
                               rtol=1e-3, atol=1e-7, err_msg=name)
    assert acc.any(), name
  assert not accumulators('%s/model.ckpt-20' % train_dir)
  # The checkpoints' float32 bytes, in all their files: the accumulators
  # add the model's (docs/scaling.md).
  sizes = [sum(map(os.path.getsize, glob.glob(
      '%s/model.ckpt-%d.data-*' % (train_dir, n)))) for n in (11, 20)]
  assert sizes == [2162752, 1442904]
  assert sizes[0] - sizes[1] == cifar10_model.MODEL_BYTES
  if num_ps:  # The chiefs' lines: what the ps tasks held, parts counted.
    held = [re.findall(r'^Worker 0: ps \d holds (\d+) variables, (\d+) bytes',
                       procs.log('worker0_' + name), re.M)
            for name in ('momentum', 'sgd_again')]
    # The step, 10 statistics, and 14 weights, 14 averages (and 14
    # accumulators): 12 each, 2 kernels in 2 parts.
    assert [tuple(sum(int(n) for n in column) for column in zip(*lines))
            for lines in held] == [(53, sizes[0]), (39, sizes[1])]


def test_the_flags_reach_the_trainers_graph(procs, tiny_data, tmp_path):
  """--momentum, --nesterov, --weight_decay, --label_smoothing and
  --batch_norm_decay, read from the graph the chief wrote (graph.pbtxt):
  each update's factor and kind, the factor of each of the 6 L2 terms, the
  smoothed targets, and the rates of the 10 updates of BatchNorm's moving
  statistics the train op runs (placement rebuilds slim's)."""
  train_dir = str(tmp_path / 'train')
  procs.trainer('single', *single_process_flags(tiny_data, train_dir),
                '--max_steps=2', '--optimizer=momentum', '--momentum=0.5',
                '--nesterov', '--weight_decay=0.001', '--label_smoothing=0.2',
                '--batch_norm_decay=0.9')
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
  run, todo = set(), ['train_op']  # What the train op runs.
  while todo:
    name = re.sub(r'^\^|:\d+$', '', todo.pop())
    if name not in run:
      run.add(name)
      todo += nodes[name].input
  moves = [nodes[n] for n in run if nodes[n].op == 'AssignSubVariableOp' and
           re.search(r'/BatchNorm/moving_(mean|variance)$', nodes[n].input[0])]
  assert len(moves) == 10
  rates = [i for m in moves for i in nodes[m.input[1]].input
           if nodes[i].op == 'Const']
  assert len(rates) == 10
  assert {float(value(r)) for r in rates} == {np.float32(1 - 0.9)}
