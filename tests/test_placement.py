"""Variables over the ps tasks: by bytes, the big kernels partitioned."""

import pytest
import tensorflow as tf

import cifar10_model
import train_graph
from helpers import worker_graph
from training.graph import placement
from training.storage import checkpoints
from training.storage import partial_restore

tf1 = tf.compat.v1

TOTAL_BYTES = 723056  # 179,962 trainable + 800 BatchNorm statistics, float32;
# the int64 global step.


def build(num_ps):
  """The trainer's model graph placed over num_ps ps tasks; returns it."""
  graph = tf.Graph()
  cluster = tf.train.ClusterSpec({
      'ps': ['ps%d:1' % i for i in range(num_ps)], 'worker': ['w:1']})
  with graph.as_default(), tf1.device(train_graph.devices(
      cluster=cluster, task_index=0, num_gpus=0)[1]):
    tf1.train.get_or_create_global_step()
    with tf1.variable_scope('', partitioner=placement.partitioner(num_ps)):
      cifar10_model.inference(tf1.placeholder(tf.float32, [1, 32, 32, 3]))
  return graph


@pytest.mark.parametrize('num_ps', [1, 2, 3, 4])
def test_bytes_are_spread_evenly(num_ps):
  with build(num_ps).as_default():
    loads = placement.ps_loads(tf1.global_variables(), num_ps)
    step = tf1.train.get_global_step()
  sizes = [size for _, size in loads]
  assert sum(sizes) == TOTAL_BYTES
  # Round-robin by creation order would put 77% on one ps. By bytes, with
  # the large kernels split, no ps holds more than its share plus 10%.
  assert max(sizes) <= TOTAL_BYTES * (1.0 / num_ps + 0.1), sizes
  assert all(count > 0 for count, _ in loads)
  # The global step, and so SyncReplicasOptimizer's queues, on ps 0.
  assert step.device == '/job:ps/task:0/device:CPU:0'


def test_only_the_big_variables_are_split_and_saved_whole():
  with build(2).as_default():
    parts = {}
    for var in tf1.global_variables():
      name, shape = checkpoints.saved_name_and_shape(var)
      parts.setdefault(name, []).append(var.shape.as_list())
      if name.endswith('Conv2d_4a_3x3/weights'):
        assert shape == [3, 3, 80, 192]
  # Split along the output channels, one slice per ps.
  assert parts['InceptionResnetV2/Conv2d_4a_3x3/weights'] == [[3, 3, 80, 96]] * 2
  assert parts['InceptionResnetV2/Conv2d_2b_3x3/weights'] == [[3, 3, 32, 32]] * 2
  assert parts['InceptionResnetV2/Logits/weights'] == [[768, 10]]
  assert parts['global_step'] == [[]]
  assert len(parts) == 25 - 2  # Two variables in two slices each.


def test_one_ps_keeps_the_reference_variables():
  with build(1).as_default():
    names = [v.op.name for v in tf1.global_variables()]
  assert 'InceptionResnetV2/Conv2d_4a_3x3/weights' in names
  assert not [n for n in names if '/part_' in n]


def test_describe_loads_names_every_ps():
  with build(2).as_default():
    lines = placement.describe_loads(tf1.global_variables(), 2)
  assert lines == ['ps 0 holds 8 variables, 350640 bytes (48.5%)',
                   'ps 1 holds 17 variables, 372416 bytes (51.5%)']


def resolved_task(op, by_name):
  """(job, task) an op runs on: its own device, its colocation group's, or,
  for a variable read built with no device (ResourceVariable.value() clears
  the device stack), its variable's, where the placer puts it."""
  for group in op.colocation_groups():
    name = group.decode()[len('loc:@'):]
    if name != op.name and name in by_name:
      return resolved_task(by_name[name], by_name)
  if not op.device:
    for tensor in op.inputs:
      if tensor.dtype == tf.resource:
        return resolved_task(tensor.op, by_name)
  spec = tf.DeviceSpec.from_string(op.device)
  return spec.job, spec.task


MOMENTUM = train_graph.UpdateRule('momentum', 0.9, True)


@pytest.mark.parametrize('sync, loss_scale, rule', [
    (True, None, None), (False, None, None), (True, 2.0**15, None),
    (False, 2.0**15, None), (True, None, MOMENTUM), (False, 2.0**15, MOMENTUM)],
                         ids=['sync', 'async', 'sync_float16', 'async_float16',
                              'sync_momentum', 'async_float16_momentum'])
def test_the_moving_averages_stay_on_their_ps(sync, loss_scale, rule):
  """Each weight's moving average is updated on the ps that holds both.

  Built where ExponentialMovingAverage.apply is called (the worker, or in
  SyncReplicasOptimizer the global step's ps), each update read the weight
  and its average across the network and wrote the average back: with
  2 ps + 2 sync workers the ps tasks sent each other 1.1 MB a step; async,
  each worker moved the model twice more per step. Now only scalars (the
  global step, for the decay) cross between two ps tasks. So with
  float16's loss scaling: each gradient is checked for overflow on its ps,
  and only the verdict crosses; so with momentum, whose accumulators are
  updated beside their variables (only its rate and factor cross).
  """
  graph, _ = worker_graph(2, sync, loss_scale=loss_scale, rule=rule)
  by_name = {op.name: op for op in graph.get_operations()}
  averaged = 0
  for op in graph.get_operations():
    here = resolved_task(op, by_name)
    for tensor in op.inputs:
      there = resolved_task(tensor.op, by_name)
      if here[0] == there[0] == 'ps' and here != there:
        assert tensor.shape.num_elements() == 1, (tensor.name, there,
                                                  op.name, here)
    if op.name.startswith('ExponentialMovingAverage'):
      # Every op of an update, reads and arithmetic included, on a ps.
      assert here[0] == 'ps', (op.name, here)
      if op.type == 'AssignSubVariableOp':
        averaged += 1
        average = resolved_task(op.inputs[0].op, by_name)
        assert average == here, (op.name, average, here)
  assert averaged == len(graph.get_collection(
      tf1.GraphKeys.TRAINABLE_VARIABLES))


@pytest.mark.parametrize('num_ps', [1, 2, 3])
@pytest.mark.parametrize('sync', [True, False], ids=['sync', 'async'])
def test_momentums_accumulators_sit_beside_their_variables(num_ps, sync):
  """One accumulator for each variable the optimizer updates (each part of
  a partitioned one), on that variable's ps; the ps tasks hold the
  model's float32 bytes once more."""
  graph, _ = worker_graph(num_ps, sync, rule=MOMENTUM)
  by_name = {op.name: op for op in graph.get_operations()}
  with graph.as_default():
    variables = tf1.global_variables()
    weights = tf1.trainable_variables()
  accumulators = [v for v in variables if partial_restore.is_accumulator(v)]
  assert sorted(v.op.name for v in accumulators) == sorted(
      w.op.name + '/Momentum' for w in weights)
  for accumulator in accumulators:
    weight = by_name[accumulator.op.name[:-len('/Momentum')]]
    assert resolved_task(accumulator.op, by_name) == resolved_task(
        weight, by_name) == ('ps', resolved_task(weight, by_name)[1])
  # Each update beside its weight and accumulator (in a running cluster:
  # test_optimizer.py's trace).
  updates = [op for op in graph.get_operations()
             if op.type == 'ResourceApplyMomentum']
  assert len(updates) == len(accumulators)
  for op in updates:
    assert resolved_task(op, by_name) == resolved_task(
        op.inputs[0].op, by_name) == resolved_task(op.inputs[1].op, by_name)
  sgd, _ = worker_graph(num_ps, sync)
  with sgd.as_default():
    before = placement.ps_loads(tf1.global_variables(), num_ps)
  after = placement.ps_loads(variables, num_ps)
  assert sum(b for _, b in after) - sum(b for _, b in before) == (
      cifar10_model.MODEL_BYTES)
