"""The RPCs a training step makes to each task, counted on the wire.

A real cluster of the trainer's processes, every task reached by the
others through a counting proxy (tools/rpc_count.py), which reads each
call's method off its HTTP/2 headers and its step and tensor off
TensorFlow's protobufs. Each kind of step must make exactly the calls
docs/scaling.md's table lists: a change that adds an RPC to a step
fails here, naming it.
"""

import socket
import struct
import threading

import hpack
import pytest

import rpc_count
from helpers import FAST, wait_until

# {(the task that answers, method, tensor name and its way): calls a step}.
RUN = {('ps0', 'RunGraph', ''): 1, ('ps0', 'CleanupGraph', ''): 1}


def pulls(worker, *names):
  """RecvTensor calls worker makes to ps 0, one for each name."""
  return {('ps0', 'RecvTensor', '%s ps0>%s' % (n, worker)): 1 for n in names}


def pushes(worker, *names):
  """RecvTensor calls ps 0 makes to worker (what the worker sends it)."""
  return {(worker, 'RecvTensor', '%s %s>ps0' % (n, worker)): 1
          for n in names}


def counted_run(procs, tiny_data, tmp_path, *, workers, more=()):
  """Runs 1 ps + workers to step 20 behind counting proxies; returns
  rpc_count.table's {kind of step: [(its calls, steps that made them)]}."""
  proxies, hosts = rpc_count.proxied_cluster(workers=workers, ps=1)
  try:
    for name, cluster_flags in hosts.items():
      job, index = ('ps', 0) if name == 'ps0' else ('worker', int(name[6:]))
      procs.trainer(name, '--job_name=' + job, '--task_index=%d' % index,
                    '--data_dir=' + tiny_data,
                    '--train_dir=' + str(tmp_path / 'train'),
                    '--max_steps=20', *cluster_flags, *FAST, *more)
    assert procs.wait_all(timeout=300) == {name: 0 for name in hosts}
    assert [p.errors for p in proxies] == [0] * len(proxies)
    return rpc_count.table(rpc_count.steps(proxies))
  finally:
    for proxy in proxies:
      proxy.close()


def steps_of(found, prefix):
  """{worker: [(calls, steps)]} of the kinds prefix + ' of workerN' found:
  which worker makes how many steps is a race; each that stepped must make
  exactly its calls."""
  return {kind.rsplit(' ', 1)[1]: variants for kind, variants in found.items()
          if kind.startswith(prefix + ' of ')}


def assert_steps(stepped, expected):
  """Each worker that stepped made expected[worker] in every step; but the
  chief's steps that write the summaries (the first, then every
  --save_summaries_steps), which pull the learning rate for its scalar:
  at most 2 of them."""
  assert stepped and set(stepped) <= set(expected)
  summary = pulls('worker0', 'ExponentialDecay')
  for worker, variants in stepped.items():
    allowed = [expected[worker]] + (
        [{**expected[worker], **summary}] if worker == 'worker0' else [])
    assert [calls for calls, _ in variants
            if calls not in allowed] == [], worker
    # The summaries: the first step's, and at most one more (a session
    # made again); 20 steps are far from --save_summaries_steps.
    assert sum(n for calls, n in variants if calls != expected[worker]) <= 2


@pytest.mark.slow
def test_a_synchronous_step_makes_four_rpcs_to_ps0_the_chiefs_five(
    procs, tiny_data, tmp_path):
  """1 ps + 2 synchronous workers. Worker 1's step: RunGraph and its
  CleanupGraph, the step's end pulled (token, global step, aside flag and
  the next step's weights, joined once an update), one push (gradients and
  local step) that ps 0 fetches: 4. The chief's also pulls the global step
  its hooks read at the step's start: 5. Each update of the chief's sync
  thread runs on ps 0 alone: 2. Every step of each kind made exactly these.
  Before the cut: 10, 12, 4."""
  found = counted_run(procs, tiny_data, tmp_path, workers=2)
  expected = {
      'worker1': {**RUN, **pulls('worker1', 'step_end_weights'),
                  **pushes('worker1', 'packed')},
      'worker0': {**RUN, **pulls('worker0', 'step_end_weights',
                                 'global_step_read'),
                  **pushes('worker0', 'packed')}}
  assert_steps(steps_of(found, 'step'), expected)
  assert [calls for calls, _ in found['update']] == [RUN]
  # The 20 updates to step 20, and the one the sync thread starts as the
  # run ends (cancelled, or run with the last gradients).
  assert 20 <= sum(n for _, n in found['update']) <= 21


@pytest.mark.slow
def test_an_asynchronous_step_makes_five_rpcs_to_ps0_the_chiefs_six(
    procs, tiny_data, tmp_path):
  """1 ps + 2 asynchronous workers. Worker 1's step: RunGraph and its
  CleanupGraph, the weights and the global step after the step pulled, one
  push (gradients and the BatchNorm statistics, which every asynchronous
  worker updates): 5; the chief's also pulls its hooks' global step: 6.
  Before the cut: 9 and 10 (the learning rate's round trip, the
  statistics apart, StopAtStepHook's read)."""
  found = counted_run(procs, tiny_data, tmp_path, workers=2,
                      more=['--nosync_replicas'])
  expected = {
      'worker1': {**RUN, **pulls('worker1', 'packed', 'Read/ReadVariableOp'),
                  **pushes('worker1', 'packed')},
      'worker0': {**RUN, **pulls('worker0', 'packed', 'Read/ReadVariableOp',
                                 'global_step_read'),
                  **pushes('worker0', 'packed')}}
  assert_steps(steps_of(found, 'async step'), expected)


def frame(kind, flags, stream, payload):
  """One HTTP/2 frame, its header by hand (RFC 7540 4.1)."""
  return (len(payload).to_bytes(3, 'big') + bytes([kind, flags]) +
          struct.pack('>I', stream) + payload)


def test_the_proxy_reads_a_call_off_the_wire():
  """A RecvTensor call written by hand (HTTP/2 frames, HPACK headers, the
  gRPC message's length prefix and the protobuf's bytes), sent through a
  CountingProxy over real sockets to a server that reads it: recorded with
  its step and tensor, and forwarded whole; then the header of a frame that
  never completes, forwarded all the same (the proxy reads a copy)."""
  server, received = socket.socket(), []
  server.bind(('127.0.0.1', 0))
  server.listen(1)

  def serve():
    conn, _ = server.accept()
    while data := conn.recv(1 << 16):
      received.append(data)

  threading.Thread(target=serve, daemon=True).start()
  proxy = rpc_count.CountingProxy(server.getsockname()[1], 'ps0')
  key = (b'/job:ps/replica:0/task:0/device:CPU:0;1234;'
         b'/job:worker/replica:0/task:1/device:CPU:0;edge_12_packed_3;0:0')
  # RecvTensorRequest: step_id (field 1, a varint) 77, rendezvous_key
  # (field 2, bytes).
  message = bytes([0x08, 77, 0x12, len(key)]) + key
  headers = hpack.Encoder().encode([
      (':method', 'POST'), (':scheme', 'http'),
      (':path', '/tensorflow.WorkerService/RecvTensor'),
      (':authority', 'localhost')])
  sent = (rpc_count.PREFACE + frame(0x1, 0x4, 1, headers) +
          frame(0x0, 0x1, 1, b'\0' + struct.pack('>I', len(message)) +
                message))
  client = socket.create_connection(('127.0.0.1', proxy.port))
  try:
    client.sendall(sent)
    wait_until(lambda: sum(map(len, received)) >= len(sent), 60,
               'the call at the server', None)
    assert [(c.method, c.step_id, c.what) for c in proxy.seen()[0]] == [
        ('RecvTensor', 77, 'packed ps0>worker1')]
    assert proxy.errors == 0
    client.sendall(b'\xff' * 9 + b'junk')  # A 16 MB frame's first bytes.
    wait_until(lambda: sum(map(len, received)) >= len(sent) + 13, 60,
               'the rest at the server', None)
    assert b''.join(received) == sent + b'\xff' * 9 + b'junk'
  finally:
    client.close()
    proxy.close()
    server.close()
