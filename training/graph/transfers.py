"""The transfer packing: each kind of tensor crosses once per ps a step.

Every tensor that crosses between a worker and a ps costs both ends CPU of
its own (docs/scaling.md, "What a step costs each ps"). pack() rewires a worker's built
graph so that a step sends the weights of each ps as one tensor, their
gradients back as one, the BatchNorm batch statistics as one, and each
variable's value once to each task that reads it. The arithmetic is the same
ops on the same values: tests/test_transfers.py checks that a packed and a
plain step make the same update. --nopack_transfers leaves the graph as the
article builds it.

The packing's rewiring uses TensorFlow's private API (the suite's other
uses, which it cannot do without, are in tf_compat.py). Each use says what
breaks if TensorFlow changes it; tests/test_transfers.py fails then and
names the transfers that are no longer packed.
"""

import collections

import tensorflow as tf

from training.graph import ps_gradients
from training.graph import sync_protocol
from training.runtime import tf_compat

tf1 = tf.compat.v1

# A graph collection: the ops that end a synchronous step
# (read_back_once's train op and the read of the global step after it).
STEP_DONE = 'step_done'


def pack(*, fetches, gradients, statistics, transfer_dtype, sync):
  """Packs what a worker's training step sends; call once, after the whole
  training graph is built and before its session.

  Args:
    fetches: What a step runs (the train op, the tensors the loop fetches):
      only the edges of their ops are packed.
    gradients: The gradient tensors the optimizer applies (on the worker).
    statistics: The BatchNorm batch statistics the step sends to the ps
      tasks (on the worker); [] if none.
    transfer_dtype: What the weights and gradients cross as: tf.float32, or
      tf.bfloat16 (cast beside the sender, back to float32 beside the
      receiver; the ps accumulates and applies in float32).
    sync: Whether the graph has a SyncReplicasOptimizer.
  """
  tf_compat.one_step_read(tf1.train.get_global_step())
  consumers = _consumers(_ops_run_by(fetches))
  trainable = {v.ref() for v in tf1.trainable_variables()}
  groups = collections.OrderedDict()
  for var in tf1.global_variables() + tf1.local_variables():
    reads = [op.outputs[0] for op, _ in consumers.get(var.handle.ref(), ())
             if op.type == 'ReadVariableOp' and not op.control_inputs]
    cast = transfer_dtype if var.ref() in trainable else None
    _add_crossings(groups, reads, var.ref(), cast, consumers)
  for tensor in gradients:
    _add_crossings(groups, [tensor], tensor.ref(), transfer_dtype, consumers)
  for tensor in statistics:
    _add_crossings(groups, [tensor], tensor.ref(), None, consumers)
  links = collections.OrderedDict()
  for (source, dest, dtype, cast), by_key in groups.items():
    # What a worker sends a ps goes as one tensor: the gradients, the local
    # step, the statistics (each waits for the gradients: the ps uses none
    # before them). Pulls keep a tensor a kind: the weights come first.
    push = _task(source)[0] == 'worker' and _task(dest)[0] == 'ps'
    links.setdefault((source, dest) if push else (source, dest, dtype, cast),
                     []).extend((t, edges, cast, key) for key, (t, edges) in
                                by_key.items())
  for link, pieces in links.items():
    joined = _joined_weights(pieces, link[0]) if sync else None
    kept = None if joined is None else _kept_from_step_end(
        joined, pieces, dest=link[1])
    send_packed([p[:3] for p in pieces], source=link[0], dest=link[1],
                joined=None if joined is None or kept is not None else
                ps_gradients.read_joined(joined), received=kept)
  if sync:
    _group_token_waits(tf1.get_default_graph())


def read_back_once(*, global_step, worker, update, statistics, mark):
  """Ends a synchronous step with one transfer from the global step's ps.

  SyncReplicasOptimizer's step puts its token, taken on that ps, into the
  worker's local step; the article's loop then reads the global step after
  the step, and the progress mark and BatchNorm's updates, on the ps tasks,
  are the worker's train op's to wait for: a tensor or a control edge across
  each. Here the ps tasks wait for them: the mark for the statistics (and,
  as before, the gradients), the token for the mark; and the global step's
  ps sends the token, the step and the aside flag as one tensor
  (sync_protocol.step_end).

  Args:
    global_step: The global step.
    worker: This worker's index.
    update: SyncReplicasOptimizer's train op: the local step's assign.
    statistics: BatchNorm's updates on the ps tasks ([] but the chief's).
    mark: sync_protocol.mark_progress's op.

  Returns:
    (the train op, the global step after it), on this worker.
  """
  update = update if isinstance(update, tf.Operation) else update.op
  dequeue = sync_protocol.token_dequeue(update.graph)
  waits = next(op for op in update.graph.get_operations()
               if sync_protocol.is_progress_mark(op))
  # Private: Operation._add_control_inputs / _remove_all_control_inputs, as
  # in _group_token_waits. If they go, this raises AttributeError;
  # --nopack_transfers runs without.
  waits._add_control_inputs([  # pylint: disable=protected-access
      s if isinstance(s, tf.Operation) else s.op for s in statistics])
  dequeue._remove_all_control_inputs()  # pylint: disable=protected-access
  dequeue._add_control_inputs([mark])  # pylint: disable=protected-access
  token = dequeue.outputs[0]
  with tf1.device(_device(update)):  # The local step's: this worker.
    here, step = sync_protocol.step_end(global_step, worker)
  for index, tensor in enumerate(update.inputs):
    if tensor is token:
      # Private: Operation._update_input, as in send_packed. If it goes,
      # this raises AttributeError; --nopack_transfers runs without.
      update._update_input(index, here)  # pylint: disable=protected-access
  # Not tf.group: it would put the op where the assign's device string
  # says (the global step's ps), not beside the local step it assigns.
  with tf1.device(_device(update)), tf.control_dependencies([update]):
    train_op, after = tf.no_op(name='train_op'), tf.identity(
        step, name='step_after')
  tf1.add_to_collection(STEP_DONE, train_op)
  tf1.add_to_collection(STEP_DONE, after.op)
  return train_op, after


def _joined_weights(pieces, source):
  """A synchronous pull of a ps's weights, all of them: the variable the
  chief's update joins them into (ps_gradients), or None."""
  ordered = ps_gradients.largest_first(
      pieces, lambda p: p[0].shape.num_elements())
  return ps_gradients.joined_variable([p[3] for p in ordered], source)


def _kept_from_step_end(joined, pieces, *, dest):
  """The weights of the global step's ps for a synchronous step, read there
  once the step before took its token and sent back with it, inside the
  step's end (read_back_once): the step asks that ps for nothing else.

  On ps 0 the joined weights (as the wire's dtype) and the step's end (its
  bits) are joined into one tensor; the worker splits it, keeps the weights
  in a copy of its own (ps_gradients.pulled_copy) for its next step and
  passes the step's end on. Returns the copy's read on dest (a step's
  weights), or None where joined is not on the global step's ps.
  """
  graph = tf1.get_default_graph()
  end = next((op for op in graph.get_operations()
              if sync_protocol.is_step_end(op)), None)
  if end is None or _task(_device(end)) != _task(joined.device):
    return None
  dequeue = sync_protocol.token_dequeue(graph)
  wire = pieces[0][2] or pieces[0][0].dtype
  size = joined.shape.num_elements()
  with tf1.device(_device(end)):
    with tf.control_dependencies([dequeue]):  # The weights of its token.
      weights = ps_gradients.read_joined(joined)
    bits = tf.reshape(tf.bitcast(end.outputs[0], wire), [-1])
    both = tf.concat([tf.cast(weights, wire), bits], 0,
                     name='step_end_weights')
  with tf1.device(dest):
    copy = ps_gradients.pulled_copy(joined, wire, dest)
    kept = copy.read_value()
    # Kept once this step's weights are read.
    with tf.control_dependencies([kept.op]):
      keep = copy.assign(tf.slice(both, [0], [size]), read_value=False)
    values = tf.bitcast(tf.reshape(tf.slice(both, [size], bits.shape), [
        -1, tf.int64.size // wire.size]), tf.int64)
  for op in end.outputs[0].consumers():  # The worker's split of the end.
    if _task(_device(op)) != _task(_device(end)):
      for index, tensor in enumerate(op.inputs):
        if tensor is end.outputs[0]:
          # Private: Operation._update_input, as in send_packed. If it
          # goes, this raises AttributeError; --nopack_transfers runs
          # without.
          op._update_input(index, values)  # pylint: disable=protected-access
  for op in tf1.get_collection(STEP_DONE):
    # Private: Operation._add_control_inputs, as in _group_token_waits. If
    # it goes, this raises AttributeError; --nopack_transfers runs without.
    op._add_control_inputs([keep])  # pylint: disable=protected-access
  return kept


def _ops_run_by(fetches):
  """The ops that running fetches runs."""
  ops, todo = set(), [f if isinstance(f, tf.Operation) else f.op
                      for f in fetches]
  while todo:
    op = todo.pop()
    if op not in ops:
      ops.add(op)
      todo += [t.op for t in op.inputs] + list(op.control_inputs)
  return ops


def _consumers(ops):
  """{tensor ref: [(op, input index)]} for ops."""
  found = collections.defaultdict(list)
  for op in ops:
    for index, tensor in enumerate(op.inputs):
      found[tensor.ref()].append((op, index))
  return found


def _device(op):
  """The device TensorFlow's placer puts op on: beside the resource it
  takes (a variable's read has no device of its own), else with the op
  it is colocated with, else its own."""
  for tensor in op.inputs:
    if tensor.dtype == tf.resource:
      return _device(tensor.op)
  for group in op.colocation_groups():
    name = group.decode()[len('loc:@'):]
    if name != op.name:
      return _device(op.graph.get_operation_by_name(name))
  return tf.DeviceSpec.from_string(op.device).to_string()


def _task(device):
  spec = tf.DeviceSpec.from_string(device)
  return spec.job, spec.replica or 0, spec.task


def _in_control_flow(op):
  # Private: Operation._get_control_flow_context. If it goes, every op looks
  # outside a cond and a rewired input inside one fails the graph's import;
  # --nopack_transfers runs without.
  return op._get_control_flow_context() is not None  # pylint: disable=protected-access


def _add_crossings(groups, tensors, key, cast, consumers):
  """Records the edges from tensors (one value: reads of one variable, or
  one tensor) to ops of another task, grouped by (source device,
  destination device, dtype, cast): one piece of a pack per key."""
  for tensor in tensors:
    if (tensor.dtype == tf.resource or not tensor.shape.is_fully_defined()
        or _in_control_flow(tensor.op)):
      continue
    source = _device(tensor.op)
    for op, index in consumers.get(tensor.ref(), ()):
      dest = _device(op)
      if _task(dest) == _task(source) or _in_control_flow(op):
        continue
      cast_here = cast if cast and tensor.dtype == tf.float32 else None
      group = groups.setdefault((source, dest, tensor.dtype, cast_here),
                                collections.OrderedDict())
      # The first tensor of a key is the one sent; the key's other reads'
      # consumers take it too.
      group.setdefault(key, (tensor, []))[1].append((op, index))


def send_packed(pieces, *, source, dest, cast=None, joined=None,
                received=None):
  """Sends tensors from one device to another as one tensor: flattened and
  joined on source, split and reshaped on dest, where each consumer's input
  is rewired to its piece.

  Args:
    pieces: [(tensor on source, [(op on dest that takes it, input index)])],
      each of a static shape; a third item, where given, is that piece's
      cast. A piece of another dtype than the pack's (its largest kind's)
      crosses inside it bit for bit (tf.bitcast: an int64 is 2 float32s);
      one of fewer bytes an element than the pack's in a pack of its own.
    source, dest: The two devices.
    cast: A dtype to cross as (cast back after the split), or None.
    joined: The pieces already joined on source, in the pack's order (a
      tensor), or None.
    received: The pack already on dest (nothing crosses here), or None.
  """
  pieces = [tuple(p) if len(p) == 3 else (p[0], p[1], cast) for p in pieces]
  # The largest first: it starts the pack on 64 bytes (see the split).
  pieces = ps_gradients.largest_first(pieces,
                                      lambda p: p[0].shape.num_elements())
  crossing = [c or t.dtype for t, _, c in pieces]
  elements = collections.Counter()
  for (tensor, _, _), dtype in zip(pieces, crossing):
    elements[dtype] += tensor.shape.num_elements()
  wire = elements.most_common(1)[0][0]
  apart = [p for p, d in zip(pieces, crossing) if d.size < wire.size]
  if apart:
    send_packed(apart, source=source, dest=dest)
    pieces = [p for p, d in zip(pieces, crossing) if d.size >= wire.size]
  with tf1.device(source):
    sent = [received] if received is not None else _joined_on_source(
        pieces, wire, joined)
  with tf1.device(dest):
    sizes = [(c or t.dtype).size // wire.size * t.shape.num_elements()
             for t, _, c in pieces]
    if len(pieces) > 1 and _task(dest)[0] == 'ps':
      # A slice each: one that starts and ends on 64 bytes (the gradients
      # of ps_gradients, first) shares the pack's buffer; a SplitV would
      # copy every piece, on the ps that serves every worker.
      offsets = [sum(sizes[:i]) for i in range(len(sizes))]
      received = [tf.slice(sent[0], [o], [n]) for o, n in zip(offsets, sizes)]
    elif len(pieces) > 1:
      received = tf.split(sent[0], sizes)
    else:
      received = sent
    for i, (tensor, edges, c) in enumerate(pieces):
      piece, crossed = received[i], c or tensor.dtype
      if crossed != wire:  # Back from the wire's bits.
        ratio = crossed.size // wire.size
        piece = tf.bitcast(tf.reshape(piece, tensor.shape.as_list() + (
            [ratio] if ratio > 1 else [])), crossed)
      piece = tf.reshape(piece, tensor.shape)
      if c and c != tensor.dtype:
        piece = tf.cast(piece, tensor.dtype)
      for op, index in edges:
        # Private: Operation._update_input. If it goes, nothing is packed
        # and this raises AttributeError; --nopack_transfers runs without.
        op._update_input(index, piece)  # pylint: disable=protected-access


def _joined_on_source(pieces, wire, joined):
  """[what send_packed sends]: the pieces cast, as the wire's bits, joined
  (or joined, where given, as the wire's dtype)."""
  if joined is not None and len(pieces) > 1:  # One dtype and cast: pulls.
    return [tf.cast(joined, wire) if joined.dtype != wire else joined]
  sent = [tf.cast(t, c) if c and c != t.dtype else t for t, _, c in pieces]
  sent = [tf.bitcast(t, wire) if t.dtype != wire else t for t in sent]
  if len(pieces) > 1:
    sent = [tf.concat([tf.reshape(t, [-1]) for t in sent], 0, name='packed')]
  return sent


def _group_token_waits(graph):
  """A synchronous worker dequeues its token (on the global step's ps) after
  every accumulator took its gradient, and marks its progress there: a
  control edge from each, a transfer each from another ps. One group per ps
  is the same wait, and both take it."""
  waits = [op for op in graph.get_operations()
           if sync_protocol.is_token_dequeue(op) or
           sync_protocol.is_progress_mark(op)]
  groups = {}  # {the deps' names: their groups}.
  for op in waits:
    by_device = collections.OrderedDict()
    for dep in op.control_inputs:
      by_device.setdefault(dep.device, []).append(dep)
    key = tuple(sorted(dep.name for dep in op.control_inputs))
    if key not in groups:
      groups[key] = []
      for device, deps in by_device.items():
        with tf1.device(device):
          groups[key].append(tf.group(*deps, name='gradients_taken'))
    # Private: Operation._remove_all_control_inputs / _add_control_inputs.
    # If they go, this raises AttributeError; --nopack_transfers runs
    # without.
    op._remove_all_control_inputs()  # pylint: disable=protected-access
    op._add_control_inputs(groups[key])  # pylint: disable=protected-access
