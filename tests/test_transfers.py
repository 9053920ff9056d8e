"""What a training step sends between a worker and its ps tasks.

Every tensor that crosses costs both ends CPU of its own, so a step sends
each kind once per ps: the weights packed into one tensor, their gradients
into one, the BatchNorm statistics into one (from the chief, or every
asynchronous worker), the synchronous worker's local step once. Checked in
the graph a worker builds (the tensors its step runs that cross between
tasks, named here by hand), and on a real cluster of gRPC servers: the
packed step trains exactly as one process does.
"""

import json
import re

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.training import training_util

from helpers import SERVERS, worker_graph, free_ports

import train_graph
from training.graph import learning_rate
from training.graph import sync_protocol

tf1 = tf.compat.v1

SCHEDULE = learning_rate.Schedule('exponential', 0.1, 128, 'none', 0, 100,
                                  100, 0.1)


def task_of(op, by_name):
  """(job, task) an op runs on, as TensorFlow's placer puts it: an op that
  takes a resource (a variable's handle, a queue) beside the resource,
  whatever its device says; otherwise in its colocation group, or on its
  device."""
  for tensor in op.inputs:
    if tensor.dtype == tf.resource:
      return task_of(tensor.op, by_name)
  for group in op.colocation_groups():
    name = group.decode()[len('loc:@'):]
    if name != op.name and name in by_name:
      return task_of(by_name[name], by_name)
  spec = tf.DeviceSpec.from_string(op.device)
  return spec.job, spec.task


def ancestors(op):
  """The ops op waits for, by data or control edge, op left out."""
  seen, todo = set(), list(op.inputs) + list(op.control_inputs)
  while todo:
    item = todo.pop()
    item = item if isinstance(item, tf.Operation) else item.op
    if item not in seen:
      seen.add(item)
      todo += list(item.inputs) + list(item.control_inputs)
  return seen


def step_graph(num_ps, sync, task_index, packed=True):
  """A worker's training graph on 1 ps + 2 workers (or 2 ps), not run;
  returns (graph, the ops its step runs)."""
  graph, built = worker_graph(num_ps, sync, task_index, packed)
  with graph.as_default():
    # What the session loop and TensorFlow's hooks fetch every step.
    fetches = [built.step_after, built.loss, built.accuracy] + tf1.get_collection(
        training_util.GLOBAL_STEP_READ_KEY)
  step = set()
  for tensor in fetches:
    step |= ancestors(tensor.op) | {tensor.op}
  return graph, step


def crossing(num_ps, sync, task_index, packed=True):
  """{(source task, destination task): sorted names of the tensors a step
  sends}: its data edges between tasks, but the handles of resources (they
  move no data), named by the tensor; and its control edges between tasks
  as TensorFlow's partitioner sends them: one transfer for each op another
  task's ops wait on (named ^ and the op), except where one op waits on
  several of another task's, grouped into one (named ^group: and the op
  that waits). Each name without the suffix that makes it unique in the
  graph (packed_2 is a packed)."""
  graph, step = step_graph(num_ps, sync, task_index, packed)
  by_name = {op.name: op for op in graph.get_operations()}
  sent = {}
  for op in step:
    here = '%s%d' % task_of(op, by_name)
    edges = [(t.op, t.name) for t in op.inputs if t.dtype != tf.resource]
    waits = {}
    for dep in op.control_inputs:
      waits.setdefault('%s%d' % task_of(dep, by_name), []).append(dep)
    for there, deps in waits.items():
      if there != here:
        edges.append((deps[0], '^' + deps[0].name if len(deps) == 1 else
                      '^group:' + op.name))
    for source, name in edges:
      there = '%s%d' % task_of(source, by_name)
      if there != here:
        sent.setdefault((there, here), set()).add(name)
  return {edge: sorted(re.sub(r'_\d+(?=[/:_]|$)', '', n).replace(':0', '')
                       for n in names) for edge, names in sent.items()}


# From the global step's ps once the step has its token: the token, the
# global step then, the worker's aside flag and that ps's weights (joined
# once an update), as one tensor, kept by the worker for its next step.
STEP_END = 'step_end_weights'
# The gradients, the local step (for the accumulators' staleness check) and
# the chief's 10 BatchNorm statistics, as one tensor.
PUSHED = 'packed'
# A synchronous step's weights from another ps: joined there once an update,
# by the chief's update, and read whole by every step
# (training/graph/ps_gradients.py).
JOINED = 'joined_weights'
# An asynchronous step's: joined on the ps by each step (each step updates).
WEIGHTS = 'packed'


def test_a_synchronous_chief_sends_each_kind_once():
  """1 ps: the gradients go in one tensor with the local step and the
  statistics; the token, the step after it, the aside flag and the next
  step's weights come back in one. No control edge: the ps waits for its
  own ops. Was 65 transfers a step in a trace (12 weights, 12 gradients, 12
  local steps, 20 for the statistics, 6 for the hooks' read of the global
  step...), then 9, then 3 (the weights apart), now 2."""
  assert crossing(1, True, 0) == {
      ('ps0', 'worker0'): [STEP_END],
      ('worker0', 'ps0'): [PUSHED]}


def test_a_synchronous_worker_sends_no_statistics():
  """Not the chief: the same tensor each way (its pack holds no
  statistics); the progress mark waits on the ps, not on the worker."""
  assert crossing(1, True, 1) == {
      ('ps0', 'worker1'): [STEP_END],
      ('worker1', 'ps0'): [PUSHED]}


def test_a_worker_taken_back_refills_its_weights_after_its_token():
  """A worker set aside keeps a copy of ps 0's weights from before; taking
  a token again (sync_protocol.take_token) fills the copy, by reading ps 0's
  joined weights only once the token is taken: the weights of that token's
  update, which its next gradient is for."""
  graph, built = worker_graph(1, True, 1)
  with graph.as_default():
    take = sync_protocol.take_token(built.global_step)
  ran = ancestors(take) | {take}
  fills = [op for op in ran if op.type == 'AssignVariableOp' and
           'pulled_weights' in op.inputs[0].op.name]
  assert len(fills) == 1
  [read] = [op for op in ancestors(fills[0])
            if op.type == 'ReadVariableOp' and
            'joined_weights' in op.inputs[0].op.name]
  # The token queue's dequeue (the queue SyncReplicasOptimizer shares).
  [dequeue] = [op for op in ancestors(read) if op.type == 'QueueDequeueV2']
  assert dequeue.inputs[0].op.get_attr('shared_name') == b'sync_token_q'


def test_with_two_ps_each_gets_its_own_packs():
  """Each ps holds its own variables and parts of the big kernels (see
  placement): one pack each way for each, the statistics and the local
  step inside each push; the step's end from ps 0 only (with ps 0's
  weights), which waits for ps 1's accumulators and statistics once (was 9
  control edges: one from each of its accumulators)."""
  assert crossing(2, True, 0) == {
      ('ps0', 'worker0'): [STEP_END],
      ('ps1', 'worker0'): [JOINED],
      ('ps1', 'ps0'): ['^gradients_taken'],
      ('worker0', 'ps0'): [PUSHED],
      ('worker0', 'ps1'): [PUSHED]}


def test_an_asynchronous_step_computes_the_rate_beside_the_global_step():
  """Asynchronous, 2 ps: no token or local step; each worker updates the
  statistics itself (in its push). The learning rate is computed on ps 0,
  beside the global step, and sent to ps 1 (not read to the worker and
  sent back). The rest are the control edges of the optimizer's groups
  (TensorFlow's, left as they are) and the read of the step after it."""
  assert crossing(2, False, 1) == {
      ('ps0', 'ps1'): ['ExponentialDecay',
                       'ExponentialMovingAverage/num_updates/ReadVariableOp',
                       '^GradientDescent'],
      ('ps0', 'worker1'): sorted([
          WEIGHTS, 'Read/ReadVariableOp', '^GradientDescent/update/NoOp',
          '^group:moving_averages', '^train_op/NoOp']),
      ('ps1', 'worker1'): sorted([
          WEIGHTS, '^GradientDescent/update/NoOp', '^moving_averages/NoOp',
          '^train_op/NoOp']),
      ('worker1', 'ps0'): sorted([PUSHED, '^GradientDescent/update',
                                  '^train_op']),
      ('worker1', 'ps1'): [PUSHED]}


def one_step(target, cluster, checkpoint, batch, out, packed=True):
  """Restores checkpoint into the trainer's graph (over cluster's 2 ps, or
  in one process with cluster None), runs one asynchronous step on batch,
  saves the result to out; returns (its path, {(source task, destination
  task): the transfers TensorFlow's partitioned graphs of the step made}).
  """
  with tf.Graph().as_default():
    if cluster:
      inputs, variables = train_graph.devices(cluster=cluster, task_index=0,
                                              num_gpus=0)
    else:
      inputs = variables = '/cpu:0'
    with tf1.device(inputs):
      images = tf.constant(batch[0])
      labels = tf.constant(batch[1])
    with tf1.device(variables):
      built = train_graph.build(
          images=images, labels=labels, num_ps=2 if cluster else 0,
          worker=0, schedule=SCHEDULE,
          pack_transfers=packed and bool(cluster))
    saver = tf1.train.Saver(sharded=bool(cluster))
    config = tf1.ConfigProto(operation_timeout_in_ms=120000)  # No hang.
    with tf1.Session(target, config=config) as sess:
      saver.restore(sess, checkpoint)
      metadata = tf1.RunMetadata()
      assert sess.run(built.step_after, options=tf1.RunOptions(
          output_partition_graphs=True), run_metadata=metadata) == 1
      return saver.save(sess, out), received(tf1.get_default_graph(),
                                             metadata.partition_graphs)


def received(graph, partition_graphs):
  """{(source task, destination task): (sorted names of the tensors sent,
  how many control transfers)} in the partitions of a step of graph, from
  their _Recv nodes (named as crossing() names them)."""
  sent = {}
  for partition in partition_graphs:
    for node in partition.node:
      if node.op != '_Recv':
        continue
      ends = tuple('%s%d' % (spec.job, spec.task) for spec in (
          tf.DeviceSpec.from_string(node.attr[key].s.decode())
          for key in ('send_device', 'recv_device')))
      if ends[0] == ends[1]:
        continue
      names, control = sent.get(ends, ([], 0))
      source = re.sub(r'^edge_\d+_', '', node.attr['tensor_name'].s.decode())
      if source.startswith('GroupCrossDeviceControlEdges') or (
          not graph.get_operation_by_name(source).outputs):  # Control.
        control += 1
      else:
        names = sorted(names + [re.sub(r'_\d+(?=[/:_]|$)', '', source)])
      sent[ends] = (names, control)
  return sent


@pytest.mark.slow
@pytest.mark.parametrize('packed', [True, False], ids=['packed', 'plain'])
def test_a_cluster_step_trains_as_one_process(procs, tmp_path, monkeypatch,
                                              packed):
  """One step on 2 ps and a worker (gRPC servers, in a process of their
  own), through the packs or the article's plain graph (--nopack_transfers),
  the BatchNorm updates on the ps and the partitioned kernels, from the
  same weights and on the same batch as one process: every variable after
  it (weights, statistics, averages) the same. Dropout off, so that the
  two steps draw nothing at random."""
  monkeypatch.setattr(train_graph, 'DROPOUT_KEEP_PROB', 1.0)
  ports = free_ports(3)
  hosts = ['localhost:%d' % p for p in ports]
  spec = {'ps': hosts[:2], 'worker': hosts[2:]}
  procs.start('servers', ['-c', SERVERS, json.dumps(spec)],
              env={'TF_CPP_MIN_LOG_LEVEL': '2'})
  procs.wait_for_line('servers', 'serving', 60)
  rng = np.random.default_rng(0)
  batch = (rng.normal(size=(8, 32, 32, 3)).astype(np.float32),
           rng.integers(0, 10, size=8).astype(np.int32))
  initial = str(tmp_path / 'initial')
  with tf.Graph().as_default():
    train_graph.build(images=tf.constant(batch[0]),
                      labels=tf.constant(batch[1]), num_ps=0, worker=0,
                      schedule=SCHEDULE)
    saver = tf1.train.Saver()
    with tf1.Session() as sess:
      sess.run(tf1.global_variables_initializer())
      initial = saver.save(sess, initial)
  alone, _ = one_step('', None, initial, batch, str(tmp_path / 'alone'))
  clustered, transfers = one_step('grpc://' + hosts[2],
                                  tf.train.ClusterSpec(spec), initial, batch,
                                  str(tmp_path / 'cluster'), packed)
  # The tensors TensorFlow sent are those the graph says it sends (see
  # crossing; named by hand in the asynchronous test above, for worker 1,
  # whose graph is worker 0's); its control transfers are fewer than
  # crossing counts (its graph optimizer merges the NoOps of groups): 1-2.
  # (The plain graph's many transfers are TensorFlow's to shape: its graph
  # optimizer drops identities and merges reads; not named here.)
  if packed:
    static = crossing(2, False, 0)
    # (A _Recv names the op, not which of its outputs it sends.)
    assert {edge: names for edge, (names, _) in transfers.items()} == {
        edge: sorted(re.sub(r':\d+$', '', n) for n in names
                     if not n.startswith('^'))
        for edge, names in static.items()}
    assert {edge: control for edge, (_, control) in transfers.items()} == {
        ('ps0', 'ps1'): 1, ('ps0', 'worker0'): 2, ('ps1', 'worker0'): 2,
        ('worker0', 'ps0'): 2, ('worker0', 'ps1'): 0}
  alone = tf.train.load_checkpoint(alone)
  clustered = tf.train.load_checkpoint(clustered)
  names = alone.get_variable_to_shape_map()
  assert names == clustered.get_variable_to_shape_map()
  assert len(names) == 1 + 12 + 10 + 12  # Step, weights, statistics, averages.
  initial = tf.train.load_checkpoint(initial)
  for name in names:
    start = initial.get_tensor(name)
    moved = alone.get_tensor(name) - start
    assert moved.any(), name  # Each moved by the step...
    # ...and by as much through the cluster (the change compared, not the
    # values: a moving variance near 1 moves by 0.005 a step).
    np.testing.assert_allclose(clustered.get_tensor(name) - start, moved,
                               rtol=1e-4, atol=1e-8, err_msg=name)


def test_the_plain_graph_packs_nothing_and_sends_the_weights_apart():
  """--nopack_transfers: the article's graph as built, nothing packed or
  rewired: each of the 12 weights crosses by itself to the worker."""
  graph, _ = step_graph(1, True, 0, packed=False)
  assert not [op for op in graph.get_operations() if 'packed' in op.name]
  weights = [n for n in crossing(1, True, 0, packed=False)[('ps0', 'worker0')]
             if n.endswith('ReadVariableOp') and 'InceptionResnetV2/' in n]
  assert len({n.split('/')[1] for n in weights}) == 6  # Every layer's.
  assert len(weights) >= 12
