"""hooks.CheckpointSaverHook in one process: when it saves, what it writes
beside the checkpoints, and how a failed save ends."""

import os

import pytest
import tensorflow as tf

from helpers import free_ports
from training.runtime import process
from training.session import hooks
from training.storage import checkpoints

tf1 = tf.compat.v1


def model():
  """A global step and a weight, both +1 a step; returns the train op."""
  global_step = tf1.train.get_or_create_global_step()
  weight = tf1.get_variable('weight', [], initializer=tf1.zeros_initializer())
  return tf.group(weight.assign_add(1.0), global_step.assign_add(1))


def train(train_dir, steps, save_steps):
  """Trains steps steps with the hook; returns the events it logged for
  TensorBoard: [(kind, step)]."""
  with tf.Graph().as_default():
    train_op = model()
    scaffold = tf1.train.Scaffold()
    with tf1.train.MonitoredSession(
        session_creator=tf1.train.ChiefSessionCreator(scaffold=scaffold),
        hooks=[tf1.train.StopAtStepHook(last_step=steps),
               hooks.CheckpointSaverHook(train_dir, save_steps, scaffold,
                                         ())]) as sess:
      while not sess.should_stop():
        sess.run(train_op)
  hooks.events_writer(train_dir).close()  # Flushes and closes it.
  [events] = [f for f in os.listdir(train_dir) if f.startswith('events')]
  logged = []
  for event in tf1.train.summary_iterator(os.path.join(train_dir, events)):
    kind = event.WhichOneof('what')
    if kind == 'session_log':
      assert event.session_log.status == tf1.SessionLog.CHECKPOINT
      assert event.session_log.checkpoint_path == os.path.join(
          train_dir, 'model.ckpt')
    logged.append((kind, event.step))
  return logged


def test_saves_at_the_start_every_save_steps_and_at_the_end(tmp_path):
  train_dir = str(tmp_path)
  logged = train(train_dir, steps=9, save_steps=2)
  # Saved at 0, 2, 4, 6, 8 and 9; the Saver's 5 newest are kept.
  state = tf.train.get_checkpoint_state(train_dir)
  assert state.all_model_checkpoint_paths == [
      os.path.join(train_dir, 'model.ckpt-%d' % s) for s in (2, 4, 6, 8, 9)]
  assert sorted(os.listdir(train_dir)) == sorted(
      ['checkpoint', 'graph.pbtxt'] +
      ['model.ckpt-%d.%s' % (s, ext) for s in (2, 4, 6, 8, 9)
       for ext in ('data-00000-of-00001', 'index', 'meta')] +
      [f for f in os.listdir(train_dir) if f.startswith('events')])
  path = os.path.join(train_dir, 'model.ckpt-9')
  assert tf.train.load_variable(path, 'global_step') == 9
  assert tf.train.load_variable(path, 'weight') == 9.0
  with open(os.path.join(train_dir, 'graph.pbtxt')) as f:
    assert 'name: "weight"' in f.read()
  # The hook's graph and meta graph at the session's creation, once (not
  # also FileWriterCache's), then one checkpoint note a save.
  assert logged == [('file_version', 0), ('graph_def', 0),
                    ('meta_graph_def', 0)] + [
                        ('session_log', s) for s in (0, 2, 4, 6, 8, 9)]


def test_no_second_save_of_the_step_saved_last(tmp_path):
  logged = train(str(tmp_path), steps=4, save_steps=2)
  assert [s for kind, s in logged if kind == 'session_log'] == [0, 2, 4]


class Session:
  """The hook in a plain session, its methods called as MonitoredSession
  would; save_fails(error) makes checkpoints.save raise it from then on."""

  def __init__(self, train_dir, monkeypatch, ps_hosts=()):
    self.graph = tf.Graph()
    with self.graph.as_default():
      self.train_op = model()
      self.scaffold = tf1.train.Scaffold()
      self.hook = hooks.CheckpointSaverHook(train_dir, 2, self.scaffold,
                                            ps_hosts)
      self.hook.begin()
      self.scaffold.finalize()
    self.sess = tf1.Session(graph=self.graph)
    self.sess.run(self.scaffold.init_op)
    self._monkeypatch = monkeypatch
    self.exits = []
    monkeypatch.setattr(process, 'exit_now', self.exits.append)

  def save_fails(self, error):
    def save(*args, **kwargs):
      raise error
    self._monkeypatch.setattr(checkpoints, 'save', save)

  def create(self):
    with self.graph.as_default():
      self.hook.after_create_session(self.sess, None)

  def step(self):
    """One step as MonitoredSession runs it: the hook's fetches in it."""
    with self.graph.as_default():
      context = tf1.train.SessionRunContext(tf1.train.SessionRunArgs(None),
                                            self.sess)
      args = self.hook.before_run(context)
      _, results = self.sess.run([self.train_op, args.fetches])
      self.hook.after_run(context, tf1.train.SessionRunValues(
          results=results, options=None, run_metadata=None))

  def end(self):
    with self.graph.as_default():
      self.hook.end(self.sess)


def test_a_failed_save_raises_one_line(tmp_path, monkeypatch):
  train_dir = str(tmp_path)
  run = Session(train_dir, monkeypatch)
  run.create()
  run.save_fails(tf.errors.ResourceExhaustedError(
      None, None, '%s/model.ckpt-2_temp/part-00000-of-00001.data-00000-of-'
      '00001.tempstate123; No space left on device' % train_dir))
  run.step()
  with pytest.raises(checkpoints.WriteError) as raised:
    run.step()
  assert str(raised.value) == (
      'cannot write the checkpoint of step 2 in %s: No space left on device. '
      'The last good checkpoint, %s/model.ckpt-0, is kept; free space or fix '
      'the directory, then restart to resume' % (train_dir, train_dir))


def test_a_ps_lost_at_a_save_is_recovered_but_not_at_the_end(
    tmp_path, monkeypatch, capsys):
  train_dir = str(tmp_path)
  host = 'localhost:%d' % free_ports(1)[0]  # A ps that takes no connection.
  run = Session(train_dir, monkeypatch, ps_hosts=[host])
  run.create()
  run.step()
  lost = tf.errors.UnavailableError(None, None, 'Socket closed')
  run.save_fails(lost)
  # During training: TensorFlow's own error, which MonitoredSession
  # recovers from.
  with pytest.raises(tf.errors.UnavailableError):
    run.step()
  assert not run.exits
  # At the end: one line that names the ps, and exit status 3.
  run.step()
  run.end()
  assert run.exits == [3]
  assert capsys.readouterr().err == (
      'Error: cannot write the checkpoint of step 3 in %s: ps 0 at %s '
      '(Connection refused). The last good checkpoint, %s/model.ckpt-0, is '
      'kept; start the lost task again, then this one: it resumes from '
      'there\n' % (train_dir, host, train_dir))
