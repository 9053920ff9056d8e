"""training/session/creator.py in one process: a cancelled step is
recovered, a lost task is said in one line."""

import logging
import threading

import pytest
import tensorflow as tf

from training.health import liveness
from training.session import creator

tf1 = tf.compat.v1


class Creator(tf1.train.SessionCreator):
  """Creates local sessions and keeps them; fills the queue in the first."""

  def __init__(self, fill):
    self.sessions = []
    self._fill = fill

  def create_session(self):
    sess = tf1.Session()
    if not self.sessions:
      sess.run(self._fill)  # Capacity 1: the next enqueue blocks.
    self.sessions.append(sess)
    return sess


def cancel_in(sess, op, secs):
  """Runs op in sess after secs, in a thread; returns the thread."""
  def run():
    try:
      sess.run(op)
    except tf.errors.CancelledError:
      pass  # The recovery closed sess before this run call returned.

  timer = threading.Timer(secs, run)
  timer.start()
  return timer


@pytest.mark.parametrize('run', ['MonitoredSession.run',
                                 'creator.run_step'])
def test_a_cancelled_step_is_recovered_like_a_lost_task(run):
  # A real CancelledError from a real step: an enqueue blocked on a full
  # queue that is closed with cancel_pending_enqueues, as a step blocked on
  # a ps is cancelled when the ps goes away.
  with tf.Graph().as_default():
    queue = tf1.FIFOQueue(1, tf.int32, shapes=[])
    enqueue = queue.enqueue(7)
    made = Creator(enqueue)
    with tf1.train.MonitoredSession(session_creator=made) as sess:
      timer = cancel_in(made.sessions[0],
                        queue.close(cancel_pending_enqueues=True), 0.5)
      try:
        if run == 'MonitoredSession.run':
          # TensorFlow's own recovery covers AbortedError and
          # UnavailableError only: the step's error ends the training.
          with pytest.raises(tf.errors.CancelledError):
            sess.run(enqueue)
          assert len(made.sessions) == 1
          return
        creator.run_step(sess, enqueue)
      finally:
        timer.join()
      # The broken session was closed, a new one created, and the step ran
      # again in it: its queue holds exactly that step's element.
      assert len(made.sessions) == 2
      assert made.sessions[0]._closed  # pylint: disable=protected-access
      assert creator.run_step(sess, queue.size()) == 1
      assert not sess.should_stop()


# TensorFlow's messages for a lost task, as MonitoredSession logged them in
# tests/test_faults.py and the CI run that found the cancelled step.
LOST_TASK_ERRORS = {
    '2_ps_one_killed': (
        'Graph execution error:\n\nFrom /job:ps/replica:0/task:1:\n'
        'Socket closed\nAdditional GRPC error information from remote target '
        '/job:ps/replica:0/task:1 while calling /tensorflow.WorkerService/'
        'RunGraph:\n:UNKNOWN:Error received from peer  {grpc_status:14, '
        'grpc_message:"Socket closed"}',
        'From /job:ps/replica:0/task:1: Socket closed'),
    'several_statuses': (
        'Graph execution error:\n\n=====================\nUNAVAILABLE: From '
        '/job:worker/replica:0/task:1:\nSocket closed\n\t [[{{node Read/'
        'ReadVariableOp_S221}}]]\nRecent warning and error logs:\n'
        'UNAVAILABLE: From /job:ps/replica:0/task:0:\nSocket closed\n'
        '=====================',
        'UNAVAILABLE: From /job:worker/replica:0/task:1: Socket closed'),
    'cancelled': (
        'Graph execution error:\n\n=====================\nCANCELLED: From '
        '/job:ps/replica:0/task:0:\nRecvFromRemoteAsync is cancelled.\n\t '
        '[[{{node InceptionResnetV2/Conv2d_3b_1x1/BatchNorm/beta/'
        'ReadVariableOp_S109}}]]\nABORTED: From /job:ps/replica:0/task:1:\n'
        'Session handle is not found: f9d95d5c67ec995e.\n=====',
        'CANCELLED: From /job:ps/replica:0/task:0: RecvFromRemoteAsync is '
        'cancelled.'),
    'one_line': (
        'Graph execution error:\n\nfailed to connect to all addresses; last '
        'error: UNAVAILABLE: ipv4:127.0.0.1:12708: recvmsg:Connection reset '
        'by peer\nAdditional GRPC error information',
        'failed to connect to all addresses; last error: UNAVAILABLE: '
        'ipv4:127.0.0.1:12708: recvmsg:Connection reset by peer'),
}


@pytest.mark.parametrize('case', sorted(LOST_TASK_ERRORS))
def test_a_lost_task_is_reported_by_its_cause(case, capsys):
  error, cause = LOST_TASK_ERRORS[case]
  report = liveness.ReportLostTask(task_index=1)
  record = logging.LogRecord(
      'tensorflow', logging.INFO, __file__, 0,
      'An error was raised. This may be due to a preemption in a connected '
      'worker or parameter server. The current session will be closed and a '
      'new session will be created. [...] Error: %s', (error,), None)
  assert not report.filter(record)  # Hidden from TensorFlow's log.
  assert capsys.readouterr().err == (
      'Worker 1: lost a task of the cluster (%s); waiting for it to come '
      'back\n' % cause)
