"""Several hosts: each task in its own network namespace, joined over veth.

Every host gets its own address on a bridge (tools/network_namespaces.py),
and is started the way Kubernetes starts it: TF_CONFIG only, every task on
port 2222. Needs root and iproute2 (as CI has); skipped otherwise.
"""

import json
import os
import time

import pytest

import cifar10_model
import network_namespaces
from helpers import FAST, checkpoint_step, last_step, steps, wait_until

# A worker's read of the model, per step.
MODEL_BYTES = cifar10_model.MODEL_BYTES


@pytest.fixture
def network():
  """A Network; skips the test, saying why, where namespaces can't be made."""
  why = network_namespaces.why_unavailable()
  if why:
    pytest.skip(why)
  net = network_namespaces.Network()
  try:
    try:
      net.make_hub()
    except RuntimeError as e:
      pytest.skip('cannot make network namespaces here: %s' % e)
    yield net
  finally:
    net.close()


@pytest.mark.slow
@pytest.mark.parametrize('replicas_to_aggregate', [2, 1])
def test_cluster_over_veth_survives_a_cut_link(network, procs, tiny_data,
                                               tmp_path,
                                               replicas_to_aggregate):
  # `network` comes first, so `procs` kills the tasks before the namespaces
  # go away.
  hosts = {'ps': network.add_host('ps', 10),
           'chief': network.add_host('chief', 11),
           'worker': network.add_host('worker', 12),
           'eval': network.add_host('eval', 13)}
  cluster = {'ps': [hosts['ps']], 'chief': [hosts['chief']],
             'worker': [hosts['worker']]}
  train_dir = str(tmp_path / 'train')
  # With a backup, the chief runs on alone while the link is down: leave
  # steps for the cut-off worker to take once it is back.
  max_steps = 60 if replicas_to_aggregate == 2 else 300
  flags = ['--data_dir=' + tiny_data, '--train_dir=' + train_dir,
           '--max_steps=%d' % max_steps, '--save_checkpoint_steps=1000',
           '--eval_interval_secs=1',
           '--replicas_to_aggregate=%d' % replicas_to_aggregate] + FAST

  def start(host, task_type, job=cluster):
    procs.trainer(host, *flags, prefix=network.exec_prefix(host), env={
        'TF_CONFIG': json.dumps({'cluster': job, 'task': {
            'type': task_type, 'index': 0}})})

  start('ps', 'ps')
  start('worker', 'worker')
  start('chief', 'chief')
  start('eval', 'evaluator', job={'evaluator': [hosts['eval']]})

  wait_until(lambda: last_step(procs, 'chief') >= 15, 120, 'step 15', procs)
  network.set_link('worker', 'down')
  cut_at, chief_at = last_step(procs, 'worker'), last_step(procs, 'chief')
  if replicas_to_aggregate == 2:
    # Full sync: each step needs the cut-off worker's gradients, so the
    # chief waits. Not a synchronization: a stall is observed over a time.
    # (+5: one progress line for a step whose gradients were already in.)
    time.sleep(8)
    assert last_step(procs, 'chief') <= chief_at + 5, procs.tails()
    assert chief_at < max_steps
  else:
    # The cut-off worker is a backup: the chief goes on alone.
    wait_until(lambda: last_step(procs, 'chief') >= chief_at + 20, 60,
               'the chief advancing without worker 1', procs)
  # Cut off, the worker takes no step (but may print one that was done).
  stalled_at = last_step(procs, 'worker')
  assert stalled_at <= cut_at + 5
  network.set_link('worker', 'up')
  # Back on the network, the worker trains again.
  wait_until(lambda: last_step(procs, 'worker') > stalled_at, 60,
             'worker 1 training after the link is back', procs)

  codes = procs.wait_all(timeout=180)
  assert codes == {'ps': 0, 'worker': 0, 'chief': 0, 'eval': 0}, procs.tails()
  assert 'Cluster from TF_CONFIG: --ps_hosts=%s --worker_hosts=%s,%s ' \
         '--job_name=worker --task_index=1' % (
             hosts['ps'], hosts['chief'], hosts['worker']) in procs.log(
                 'worker')
  assert 'Worker 1: training finished at global step %d' % max_steps in (
      procs.log('worker'))
  assert checkpoint_step(train_dir) == max_steps
  assert 'ps 0: all 2 worker(s) finished; exiting' in procs.log('ps')
  # The evaluator, from its own host, read the chief's final checkpoint.
  with open(os.path.join(train_dir, 'eval', 'results.jsonl')) as f:
    assert json.loads(f.read().splitlines()[-1])['step'] == max_steps
  # The model crossed the links: in each local step a worker read it from
  # the ps and sent back a gradient of the same size. A progress line comes
  # every 5 local steps.
  for host in ('chief', 'worker'):
    local_steps = 5 * len(steps(procs, host))
    received, sent = network.eth0_bytes(host)
    assert min(received, sent) > local_steps * MODEL_BYTES, (
        host, local_steps, received, sent)
