"""The ps task's life: serve the variables until the workers are done; and
the workers' side of that end (tell_cluster_done).

The reference's ps blocked in server.join() forever. Here a ps serves until
each worker has posted to its done queue (sync_protocol), or, once training
is over, is gone (liveness: its port refuses for --lost_worker_secs), then
exits 0. While it waits it says for whom, at liveness's Cadence: before
any worker has reached it, the workers whose ports take no connection
(NoWorkerYet); at the end, the workers not done yet.
"""

import sys
import threading
import time

import tensorflow as tf

from training.graph import sync_protocol
from training.health import liveness
from training.runtime import log_filter

tf1 = tf.compat.v1

# How long a ps that has every done post waits for the workers to exit,
# beyond the time they may take to post to the other ps tasks.
WORKERS_EXIT_SECS = 3


def serve(server, *, cluster, task_index, config):
  """Serves until every worker is done or gone; returns the exit status.

  Once a worker said it is done (training is over), a worker that has not
  and that is lost (liveness.Tracker: a listed slot never started, a worker
  lost for good or stopped) is not waited for.
  """
  workers = cluster.job_tasks('worker')
  print('ps %d: serving on %s; waiting for %d worker(s) to finish' %
        (task_index, cluster.task_address('ps', task_index), len(workers)),
        flush=True)
  tracker = liveness.Tracker(workers)
  with tf.Graph().as_default():
    # This ps's queue alone: its device filter hides the other ps tasks.
    dequeue = sync_protocol.done_queue(task_index).dequeue()
    with tf1.Session(server.target, config=config) as sess:
      done = wait_for_done(sess, dequeue, tracker, task_index)
  late = set(range(len(workers))) - done
  if late:
    print('ps %d: %d of %d worker(s) finished; not waiting for %s, gone; '
          'exiting' % (task_index, len(done), len(workers), ', '.join(
              'worker %d at %s (%s for %d s)' % (
                  i, workers[i], tracker.why(i), tracker.lost_secs)
              for i in sorted(late))), flush=True)
  else:
    print('ps %d: all %d worker(s) finished; exiting' % (task_index,
                                                        len(workers)),
          flush=True)
  # The last worker may still be posting to the other ps tasks.
  wait_for_exit([w for i, w in enumerate(workers) if i not in late],
                DONE_TIMEOUT_SECS * (cluster.num_tasks('ps') - 1)
                + WORKERS_EXIT_SECS)
  return 0


def wait_for_done(sess, dequeue, tracker, task_index):
  """Takes the workers' done posts until each is done or lost once one is
  done; returns the indices of those done."""
  workers = tracker.hosts
  done, cadence = set(), liveness.Cadence()
  first = NoWorkerYet(workers, task_index)
  while len(done) < len(workers):
    try:
      done.add(int(sess.run(dequeue, options=tf1.RunOptions(
          timeout_in_ms=1000))))
      continue
    except tf.errors.DeadlineExceededError:
      if not done:
        first.check()
        continue
    # Training is over: who else is still there?
    late = set(range(len(workers))) - done
    tracker.probe(sorted(late))
    gone = {i for i in late if tracker.lost(i)}
    if gone == late:
      break
    if cadence.due():
      print('ps %d: %d of %d worker(s) finished; still waiting for %s '
            'to finish (Ctrl-C stops this ps; the chief\'s checkpoints '
            'hold the model)' % (task_index, len(done), len(workers),
                                 liveness.workers_named(late - gone, workers)),
            flush=True)
  return done


class NoWorkerYet:
  """Names the workers while none has reached this ps, at the Cadence.

  A worker's server takes connections from its start, before its session
  reaches the ps tasks: once any worker's port has answered, a worker is
  there and this ps says no more; until then, a ps started first and alone
  (the workers failed at their start, or --worker_hosts is wrong) says
  which addresses it expects and what each probe got.
  """

  def __init__(self, workers, task_index):
    self._workers, self._task_index = workers, task_index
    self._cadence = liveness.Cadence()
    self._said = 0  # Lines so far: the n-th comes at first x (2n - 1) s.
    self.reached = False

  def check(self):
    """Probes the workers when a line is due; says it if none answers."""
    if self.reached or not self._cadence.due():
      return
    missing = liveness.unreachable(self._workers, timeout=1.0)
    if len(missing) < len(self._workers):
      self.reached = True
      return
    self._said += 1
    print('ps %d: no worker has reached this ps after %g s; %s: start %s, '
          'or check --worker_hosts' % (
              self._task_index,
              self._cadence.first_secs * (2 * self._said - 1),
              ', '.join('worker %d at %s (%s)' % m for m in missing),
              'it' if len(missing) == 1 else 'them'), flush=True)


def wait_for_exit(workers, secs):
  """Waits, at most secs, until no worker takes a connection.

  A worker's session cleans up on the ps tasks after its done posts, in the
  background; a ps that went first would fail that clean-up, loudly, in
  the worker's log. A worker exits right after its posts, and its port
  then refuses connections.
  """
  deadline = time.time() + secs
  while (len(liveness.unreachable(workers, timeout=0.2)) < len(workers) and
         time.time() < deadline):
    time.sleep(0.05)


# How long a worker at the end waits for each ps to take its done post.
DONE_TIMEOUT_SECS = 10


def tell_cluster_done(*, master, config, task_index, ps_hosts, global_step,
                      close):
  """Releases the other workers, tells each ps, reads the global step.

  The chief of a synchronous run closes the token queue, so that workers
  blocked waiting for a token stop instead of hanging. Every worker then
  posts to each ps's done queue; a ps exits when all workers have posted.
  One ps at a time, each in a session and a graph of its own (a session
  waits, with no timeout, for every task its device filters name, and
  places every op of its graph) bounded by DONE_TIMEOUT_SECS: a ps that is
  lost or does not answer is named, and the others still hear.

  Args:
    master, config: This worker's session target and config.
    task_index: This worker's index, which it posts.
    ps_hosts: The ps tasks.
    global_step: The training graph's global step (a resource variable,
      read here through its name on its ps).
    close: Whether to close the token queue (the synchronous chief).

  Returns:
    The global step, or None when its ps could not be reached. (A session
    left waiting on a ps that does not answer is a daemon thread's: it
    does not keep the process from exiting.)
  """
  step_ps = tf.DeviceSpec.from_string(global_step.device).task or 0
  step = None
  for i, host in enumerate(ps_hosts):
    lost = liveness.unreachable([host])
    if lost:
      why = 'it cannot be reached (%s)' % lost[0][2]
    else:
      ops, read = [], None
      with tf.Graph().as_default():  # The shared queue and step, by name.
        if i == step_ps:
          with tf.device(global_step.device):
            read = tf1.get_variable(
                global_step.op.name, [], global_step.dtype.base_dtype,
                trainable=False, use_resource=True)
          if close:
            ops.append(sync_protocol.close_tokens(read))
          ops.append(read.read_value().op)
          read = ops[-1]
        ops.append(sync_protocol.done_queue(i).enqueue(task_index))
      why, results = _run_bounded(master, config, task_index, i, ops)
      if read in results:
        step = int(results[read])
      if close and i == step_ps and ops[0] not in results:
        print('Warning: could not release the workers waiting for a token '
              'on ps %d: %s' % (i, why), file=sys.stderr, flush=True)
      if ops[-1] in results:
        continue
    print('Warning: could not tell ps %d at %s that worker %d is done: %s; '
          'it waits for that until it is stopped (Ctrl-C; the chief\'s '
          'checkpoints hold the model)' % (i, host, task_index, why),
          file=sys.stderr, flush=True)
  return step


def _run_bounded(master, config, task_index, ps_index, ops):
  """Runs each of ops, in order, in a session of worker task_index that
  sees only ps ps_index, for at most DONE_TIMEOUT_SECS in all.

  Returns:
    (why the first that failed did, or None; {op: its result} of those
    that ran).
  """
  filtered = tf1.ConfigProto()
  filtered.CopyFrom(config)
  del filtered.device_filters[:]
  filtered.device_filters.extend(['/job:ps/task:%d' % ps_index,
                                  '/job:worker/task:%d' % task_index])
  results, errors = {}, []

  def run():
    try:
      with tf1.Session(master, graph=ops[0].graph, config=filtered) as sess:
        for op in ops:
          try:
            results[op] = sess.run(op.outputs[0] if op.outputs else op)
          except tf.errors.OpError as e:
            errors.append(log_filter.first_line(e))
    except Exception as e:  # pylint: disable=broad-except
      errors.append('%s: %s' % (type(e).__name__, log_filter.first_line(e)))

  thread = threading.Thread(target=run, daemon=True, name='done_%d' % ps_index)
  thread.start()
  thread.join(DONE_TIMEOUT_SECS)
  if thread.is_alive():
    return 'it did not answer in %d s' % DONE_TIMEOUT_SECS, dict(results)
  return (errors[0] if errors else None), results
