"""The training graph of a worker, in the article's order: devices, model,
loss, learning rate, optimizer, SyncReplicasOptimizer, moving averages,
scaffold.

The reference's graph with its bugs fixed: the weight decay is in the loss,
BatchNorm's moving statistics are updated once per global step (not summed
from every worker), and the step a run reached is read after its update.
train_distributed.py builds the input between devices() and build().
"""

import collections
import functools

import tensorflow as tf

import cifar10_model
from training.graph import learning_rate
from training.graph import placement
from training.graph import precision
from training.graph import ps_gradients
from training.graph import sync_protocol
from training.graph import transfers

tf1 = tf.compat.v1

DROPOUT_KEEP_PROB = 0.8  # The reference's.

# The update rule the ps tasks apply: the reference's plain SGD ('sgd'), or
# momentum ('momentum', with its factor and whether Nesterov's).
UpdateRule = collections.namedtuple('UpdateRule', 'name momentum nesterov')
SGD = UpdateRule('sgd', 0.9, False)
# The loss's terms beyond the cross entropy (--weight_decay,
# --label_smoothing; cifar10_model.loss), and the reference's.
LossTerms = collections.namedtuple('LossTerms', 'weight_decay label_smoothing')
REFERENCE_TERMS = LossTerms(cifar10_model.WEIGHT_DECAY, 0.0)

# The tensors and ops a worker's session loop and hooks need.
TrainingGraph = collections.namedtuple(
    'TrainingGraph',
    'global_step loss accuracy step_after sync_opt loss_scaling schedule '
    'gradients')


def devices(*, cluster, task_index, num_gpus):
  """Returns (input device, variable device function or name).

  The input pipeline runs on this worker's CPU, the model on its GPU (with
  num_gpus > 0) or CPU, the variables on the ps tasks through
  replica_device_setter (or, with no cluster, beside the model).
  """
  compute = '/device:GPU:0' if num_gpus else '/cpu:0'
  if cluster is None:
    return '/cpu:0', compute
  worker = '/job:worker/task:%d' % task_index
  return worker + '/cpu:0', tf1.train.replica_device_setter(
      worker_device=worker + compute, ps_device='/job:ps/cpu:0',
      cluster=cluster,
      # Each variable to the ps holding the fewest bytes, not round-robin.
      ps_strategy=placement.GreedyByBytes(cluster.num_tasks('ps')))


def model(*, images, labels, num_ps, num_classes, terms=REFERENCE_TERMS,
          batch_norm_decay=cifar10_model.BATCH_NORM_DECAY):
  """The network on a batch, spread over num_ps ps tasks; returns (its
  loss with the weight decay, the batch's accuracy)."""
  with tf1.variable_scope('', partitioner=placement.partitioner(num_ps)):
    logits = cifar10_model.inference(images, is_training=True,
                                     dropout_keep_prob=DROPOUT_KEEP_PROB,
                                     num_class=num_classes,
                                     weight_decay=terms.weight_decay,
                                     batch_norm_decay=batch_norm_decay)
  loss = cifar10_model.loss(logits, labels, terms.label_smoothing)
  accuracy = tf.reduce_mean(tf.cast(
      tf1.nn.in_top_k(logits, labels, 1), tf.float32), name='batch_accuracy')
  return loss, accuracy


def optimizer(rule, lr, finite=None):
  """The optimizer of rule at the rate lr. Momentum's accumulators are slot
  variables, each made beside its variable (on its ps) and updated there.

  Args:
    finite: precision.LossScaled's check of a step's gradients, or None.
      Where it is false the gradients are zeros, and a rate of 0 and a
      momentum of 1 leave the weights and the accumulators as they were.
  """
  if finite is not None:
    lr = tf.where(finite, lr, 0.0)
  if rule.name == 'sgd':
    return tf1.train.GradientDescentOptimizer(lr)
  momentum = rule.momentum if finite is None else tf.where(
      finite, rule.momentum, 1.0)
  return tf1.train.MomentumOptimizer(lr, momentum, use_nesterov=rule.nesterov)


def build(*, images, labels, num_ps, worker, schedule, sync=None, rule=SGD,
          terms=REFERENCE_TERMS, num_classes=cifar10_model.NUM_CLASSES,
          loss_scale=None, pack_transfers=False, transfer_dtype=tf.float32,
          loss_scale_period=precision.LossScaled.INCREMENT_PERIOD,
          batch_norm_decay=cifar10_model.BATCH_NORM_DECAY):
  """Builds the model, loss and train op in the current device scope.

  Args:
    images, labels, schedule: A training batch; the learning_rate.Schedule.
    num_ps, worker: The ps tasks the variables are spread over (0: none);
      this worker's index (0: the chief).
    sync: (replicas_to_aggregate, workers) for SyncReplicasOptimizer, or None.
    rule, terms: The UpdateRule, and the loss's LossTerms.
    num_classes, batch_norm_decay: The logits' size (the data's classes);
      what each update of BatchNorm's moving statistics keeps of them.
    loss_scale, loss_scale_period: float16's initial loss scale (None for
      none), and the good steps in a row that double it.
    pack_transfers, transfer_dtype: Whether to pack what a step sends
      between the tasks (transfers.pack; in a cluster), and as what.

  Returns: a TrainingGraph. Running step_after runs one training step.
  """
  global_step = tf1.train.get_or_create_global_step()
  loss, accuracy = model(images=images, labels=labels, num_ps=num_ps,
                         num_classes=num_classes, terms=terms,
                         batch_norm_decay=batch_norm_decay)
  with tf1.device(global_step.device):  # Where the update takes it.
    lr = learning_rate.rate(schedule, global_step)
  opt, scaled = optimizer(rule, lr), None
  if loss_scale:  # It makes the optimizer for each outcome of its check.
    opt = scaled = precision.LossScaled(functools.partial(optimizer, rule, lr),
                                        loss_scale, loss_scale_period)
  averages = placement.ColocatedAverages(
      cifar10_model.moving_averages(global_step))
  joined = sync and pack_transfers  # One accumulator a ps: ps_gradients.
  if sync:  # Its chief applies the aggregated gradients, then the averages.
    opt = tf1.train.SyncReplicasOptimizer(
        ps_gradients.SplitOptimizer(opt) if joined else opt,
        replicas_to_aggregate=sync[0], total_num_replicas=sync[1],
        variable_averages=averages,
        variables_to_average=tf1.trainable_variables(),
        name='cifar10_sync_replicas')
  grads_and_vars = opt.compute_gradients(loss)
  if joined:
    grads_and_vars = ps_gradients.join(grads_and_vars)
  gradients = [g for g, _ in grads_and_vars if g is not None]
  update = opt.apply_gradients(grads_and_vars, global_step=global_step)
  train_op, step_after, batches = step_end(
      global_step=global_step, worker=worker, update=update, sync=sync,
      averages=averages, read_back=joined)
  if scaled:  # For the chief's line on skipped steps.
    scaled.after = scaled.reads_after(train_op)
  if pack_transfers:
    transfers.pack(fetches=[step_after, loss, accuracy], gradients=gradients,
                   statistics=batches, transfer_dtype=transfer_dtype,
                   sync=bool(sync))
  summaries(loss=loss, accuracy=accuracy, lr=lr, scaled=scaled)
  return TrainingGraph(global_step, loss, accuracy, step_after,
                       opt if sync else None, scaled, schedule, gradients)


def step_end(*, global_step, worker, update, sync, averages, read_back):
  """What a step runs after the gradients' update: an asynchronous worker's
  moving averages, BatchNorm's statistics, a synchronous worker's progress
  mark (who applied what, for the chief's watch on hung and slow workers).

  Args:
    read_back: A packed synchronous step reads the global step back with
      its token, in one transfer (transfers.read_back_once).

  Returns: (the train op, the global step it reached, read after it, the
    batch statistics the step sends).
  """
  marks = [sync_protocol.mark_progress(global_step, worker)] if sync else []
  if not sync:
    with tf.control_dependencies([update]):
      update = averages.apply(tf1.trainable_variables())
  statistics, batches = statistics_updates(sync=sync, worker=worker)
  if read_back:
    return transfers.read_back_once(
        global_step=global_step, worker=worker, update=update,
        statistics=statistics, mark=marks[0]) + (batches,)
  train_op = tf.group(update, *statistics, *marks, name='train_op')
  with tf.control_dependencies([train_op]):
    return train_op, global_step.read_value(), batches


def statistics_updates(*, sync, worker):
  """BatchNorm's moving statistics' updates, once per global step: from
  every step of an asynchronous worker, from the synchronous chief's only
  (N workers update them N times fewer an epoch: --batch_norm_decay).
  Returns placement.colocated_statistics_updates' (ops, batches)."""
  return placement.colocated_statistics_updates(
      [] if sync and worker else tf1.get_collection(tf1.GraphKeys.UPDATE_OPS))


def summaries(*, loss, accuracy, lr, scaled):
  """The scalars the chief writes for TensorBoard."""
  tf1.summary.scalar('loss', loss)
  # Not the op's name: a summary named like an op gets a suffix (accuracy_1).
  tf1.summary.scalar('accuracy', accuracy)
  tf1.summary.scalar('learning_rate', lr)
  if scaled:
    tf1.summary.scalar('loss_scale', scaled.scale.read_value())


def scaffold(graph):
  """The Scaffold a worker's session is made from.

  With SyncReplicasOptimizer, its own readiness check (every global
  variable exists) before the local init; with float16, the loss scaling's
  initializer (LossScaled.local_init_op) after the default local init.
  """
  local_init = tf1.train.Scaffold.default_local_init_op()
  if graph.loss_scaling:
    local_init = tf.group(local_init, graph.loss_scaling.local_init_op())
  return tf1.train.Scaffold(
      ready_for_local_init_op=(graph.sync_opt.ready_for_local_init_op
                               if graph.sync_opt else None),
      local_init_op=local_init)
