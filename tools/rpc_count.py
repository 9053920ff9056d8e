"""Counts the RPCs a training step makes to each task, from the wire.

A CountingProxy stands in front of one task's gRPC server: the other tasks
are given its port for that task, so every call they start to it passes
through and is read off the HTTP/2 frames (HPACK for the method, TensorFlow's
own protobufs for the step and the tensor), independent of the trainer's
code. A RunGraph names its graph by a handle, which the RegisterGraph
answer gave: the proxy keeps each handle's ops, so that a run is known for
what it runs (the training step, the chief's update, a poll).

    python3 tools/rpc_count.py --data_dir=DIR [--workers=2] [--ps=1]
        [--steps=40] [--nosync]

runs a cluster with a proxy in front of every task and prints, for each
kind of run, the RPCs it made to each task, a run at a time: the table of
docs/scaling.md ("What a step costs each ps"). tests/test_rpc_count.py
pins those counts.
"""

import argparse
import collections
import os
import re
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

import hpack

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from training.cluster import ports  # pylint: disable=wrong-import-position
from training.runtime import process  # pylint: disable=wrong-import-position

PREFACE = b'PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n'
DATA, HEADERS, CONTINUATION = 0x0, 0x1, 0x9
END_STREAM, END_HEADERS, PADDED, PRIORITY = 0x1, 0x4, 0x8, 0x20
SERVICE = '/tensorflow.WorkerService/'

# One RPC a client started: its method (RunGraph, RecvTensor, ...), the step
# it belongs to (0: none), the graph it runs (RunGraph) or the tensor it asks
# for (RecvTensor, the rendezvous key's name part), and when.
Call = collections.namedtuple('Call', 'method step_id what time')


def _fields(message):
  """{field number: [values]} of a protobuf message's wire bytes: varints
  as ints, length-delimited fields as bytes (TensorFlow's Python package
  ships no worker_pb2, and these few fields need no more)."""
  fields, i = collections.defaultdict(list), 0

  def varint():
    nonlocal i
    value, shift = 0, 0
    while True:
      byte = message[i]
      i += 1
      value |= (byte & 0x7f) << shift
      shift += 7
      if byte < 0x80:
        return value
  while i < len(message):
    key = varint()
    number, wire = key >> 3, key & 7
    if wire == 0:
      fields[number].append(varint())
    elif wire == 2:
      length = varint()
      fields[number].append(message[i:i + length])
      i += length
    elif wire in (1, 5):
      i += 8 if wire == 1 else 4
    else:
      break  # Groups: not in these messages.
  return fields


class _Frames:
  """Splits one direction of an HTTP/2 connection into frames."""

  def __init__(self, client):
    self._buffer = b''
    self._preface = client

  def feed(self, data):
    """Yields (type, flags, stream, payload) of the frames data completes."""
    self._buffer += data
    if self._preface:
      if len(self._buffer) < len(PREFACE):
        return
      self._buffer, self._preface = self._buffer[len(PREFACE):], False
    while len(self._buffer) >= 9:
      length = int.from_bytes(self._buffer[:3], 'big')
      if len(self._buffer) < 9 + length:
        return
      kind, flags = self._buffer[3], self._buffer[4]
      stream = struct.unpack('>I', self._buffer[5:9])[0] & 0x7fffffff
      payload, self._buffer = (self._buffer[9:9 + length],
                               self._buffer[9 + length:])
      yield kind, flags, stream, payload


def _unpad(flags, payload, kind):
  if flags & PADDED:
    payload = payload[1:len(payload) - payload[0]]
  if kind == HEADERS and flags & PRIORITY:
    payload = payload[5:]
  return payload


def _task(device):
  """'ps0', 'worker1', from a device's name."""
  job = re.search(r'/job:(\w+)', device).group(1)
  return job + re.search(r'/task:(\d+)', device).group(1)


def _message(body):
  """The protobuf bytes of a gRPC message (one, uncompressed)."""
  return body[5:5 + struct.unpack('>I', body[1:5])[0]]


class CountingProxy:
  """A TCP proxy to one gRPC server that records every call started through
  it (calls, a list of Call) and the ops of every graph registered."""

  def __init__(self, target_port, name):
    # TensorFlow's GraphDef, imported here, not in the proxy's threads: two
    # imports at once in threads fail (its protobufs' pool).
    from tensorflow.core.framework import graph_pb2  # pylint: disable=g-import-not-at-top
    self._graph_def = graph_pb2.GraphDef
    self.name, self._target = name, ('127.0.0.1', target_port)
    self.calls, self.graphs = [], {}  # graphs: {session/handle: op:names}.
    self.errors = 0  # Frames it could not read (it forwards them all).
    self._registering = {}  # {stream: the op:names of its graph}.
    self._lock = threading.Lock()
    self._listener = socket.socket()
    self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    self._listener.bind(('127.0.0.1', 0))
    self._listener.listen(64)
    self.port = self._listener.getsockname()[1]
    threading.Thread(target=self._accept, daemon=True).start()

  def _accept(self):
    while True:
      client, _ = self._listener.accept()
      try:
        server = socket.create_connection(self._target)
      except OSError:  # Not serving yet: the client tries again.
        client.close()
        continue
      methods = {}  # {stream: method}, shared by the two directions.
      for args in ((client, server, True, methods),
                   (server, client, False, methods)):
        threading.Thread(target=self._pump, args=args, daemon=True).start()

  def _pump(self, source, dest, from_client, methods):
    frames, blocks, bodies = _Frames(from_client), {}, {}
    decoder = hpack.Decoder()
    decoder.max_allowed_table_size = 1 << 20
    try:
      dest.settimeout(None)
      while True:
        data = source.recv(1 << 16)
        if not data:
          break
        try:
          self._parse(frames, data, from_client, methods, decoder, blocks,
                      bodies)
        except Exception:  # pylint: disable=broad-except
          with self._lock:  # Counted (a test wants none), never fatal.
            self.errors += 1
        dest.sendall(data)
    except OSError:
      pass
    finally:
      for end in (source, dest):
        try:
          end.shutdown(socket.SHUT_RDWR)
        except OSError:
          pass

  def _parse(self, frames, data, from_client, methods, decoder, blocks,
             bodies):
    """Records the calls whose frames data completes. Of the answers, only
    RegisterGraph's bodies are kept (the graph handle); the others (the
    tensors) are skipped."""
    for kind, flags, stream, payload in frames.feed(data):
      if from_client and kind in (HEADERS, CONTINUATION):
        blocks[stream] = (blocks.get(stream, b'') +
                          _unpad(flags, payload, kind))
        if flags & END_HEADERS:
          path = dict(decoder.decode(blocks.pop(stream))).get(':path', '')
          if path.startswith(SERVICE):
            methods[stream] = path[len(SERVICE):]
      elif kind == DATA and stream in methods and (
          from_client or methods[stream] == 'RegisterGraph'):
        bodies.setdefault(stream, []).append(_unpad(flags, payload, kind))
        if flags & END_STREAM or not from_client:
          self._body(methods, stream, bodies, from_client)
      if from_client and kind == HEADERS and flags & END_STREAM:
        self._record(methods.get(stream))  # A request with no body.

  def _body(self, methods, stream, bodies, from_client):
    body = b''.join(bodies[stream])
    if len(body) < 5 or len(body) < 5 + struct.unpack('>I', body[1:5])[0]:
      bodies[stream] = [body]
      return  # Not whole yet.
    del bodies[stream]
    method, message = methods[stream], _fields(_message(body))
    if not from_client:
      if method == 'RegisterGraph':  # RegisterGraphResponse.graph_handle.
        with self._lock:  # A handle is its worker session's: both name it.
          session, ops = self._registering.pop(stream, ('', frozenset()))
          self.graphs[session + '/' + message[1][0].decode()] = ops
      return
    if method == 'RegisterGraph':  # RegisterGraphRequest.graph_def.
      graph = self._graph_def.FromString(message[2][0])
      with self._lock:  # session_handle = 1.
        self._registering[stream] = (
            message[1][0].decode() if message[1] else '', frozenset(
                '%s:%s' % (n.op, n.name) for n in graph.node))
      self._record(method)
    elif method == 'RunGraph':  # graph_handle = 1, step_id = 2,
      # session_handle = 8.
      self._record(method, message[2][0], '%s/%s' % (
          message[8][0].decode() if message[8] else '',
          message[1][0].decode()))
    elif method == 'RecvTensor':  # step_id = 1, rendezvous_key = 2:
      # src;incarnation;dst;tensor name;frame:iteration.
      key = message[2][0].decode().split(';')
      self._record(method, message[1][0], '%s %s>%s' % (
          re.sub(r'^edge_\d+_|_\d+(?=/|$)', '', key[3]), _task(key[0]),
          _task(key[2])))
    elif method == 'CleanupGraph':  # step_id = 1.
      self._record(method, message[1][0] if message[1] else 0)
    else:
      self._record(method)

  def _record(self, method, step_id=0, what=''):
    if method is not None:
      with self._lock:
        self.calls.append(Call(method, step_id, what, time.time()))

  def seen(self):
    """(a copy of the calls so far, of the graphs so far)."""
    with self._lock:
      return list(self.calls), dict(self.graphs)

  def close(self):
    self._listener.close()


def steps(proxies):
  """[(kind, [(where, method, what)])]: every step's calls, each sorted,
  a step being the calls of one step id at every task. Its kind is read
  off the graph its RunGraph on ps 0 runs: 'step' where gradients go into
  SyncReplicasOptimizer's accumulators, 'update' where they are taken out,
  'async step' where the weights are applied at once, else 'other'; and
  the worker whose step it is (the task ps 0's transfers were with)."""
  calls = collections.defaultdict(list)
  graphs = {}
  for proxy in proxies:
    seen, registered = proxy.seen()
    # A handle is its task's (each numbers its own): keyed by the task too.
    graphs.update({(proxy.name, k): v for k, v in registered.items()})
    for call in seen:
      if call.step_id:
        calls[call.step_id].append((proxy.name, call.method, call.what))
  found = []
  for step_calls in calls.values():
    ops = set()
    for where, method, what in step_calls:
      if where == 'ps0' and method == 'RunGraph':
        ops |= {o.split(':')[0] for o in graphs.get(('ps0', what), ())}
    if ops & {'AccumulatorApplyGradient', 'ResourceAccumulatorApplyGradient'}:
      kind = 'step'
    elif ops & {'AccumulatorTakeGradient', 'ResourceAccumulatorTakeGradient'}:
      kind = 'update'
    elif any(o.startswith('ResourceApply') for o in ops):
      kind = 'async step'
    else:
      kind = 'other'
    peers = {t for _, m, what in step_calls if m == 'RecvTensor'
             for t in what.split()[1].split('>') if t.startswith('worker')}
    if peers and kind != 'update':
      kind += ' of ' + '+'.join(sorted(peers))
    found.append((kind, sorted((w, m, what if m == 'RecvTensor' else '')
                               for w, m, what in step_calls)))
  return found


def table(found):
  """{kind: [(a Counter of (where, method, what): calls a step, the steps
  that made just those)]}, the most common first."""
  by_kind = collections.defaultdict(collections.Counter)
  for kind, step_calls in found:
    by_kind[kind][frozenset(collections.Counter(step_calls).items())] += 1
  return {kind: [(collections.Counter(dict(calls)), n)
                 for calls, n in sets.most_common()]
          for kind, sets in by_kind.items()}


def proxied_cluster(*, workers, ps):
  """A CountingProxy in front of each task of a local cluster; returns
  (the proxies, {task name: its --ps_hosts and --worker_hosts flags}): each
  task its own port, every other task's proxy's."""
  real = ports.free_ports(ps + workers)
  tasks = list(zip(['ps%d' % i for i in range(ps)] +
                   ['worker%d' % i for i in range(workers)], real))
  proxies = {n: CountingProxy(p, n) for n, p in tasks}

  def hosts(me, part):
    return ','.join('localhost:%d' % (p if n == me else proxies[n].port)
                    for n, p in part)
  return list(proxies.values()), {
      name: ['--ps_hosts=' + hosts(name, tasks[:ps]),
             '--worker_hosts=' + hosts(name, tasks[ps:])]
      for name, _ in tasks}


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--data_dir', required=True)
  parser.add_argument('--workers', type=int, default=2)
  parser.add_argument('--ps', type=int, default=1)
  parser.add_argument('--steps', type=int, default=40)
  parser.add_argument('--nosync', action='store_true')
  parser.add_argument('--flags', default='--batch_size=16',
                      help='more trainer flags, one string')
  args = parser.parse_args(argv)
  work = tempfile.mkdtemp(prefix='rpc_count_')
  proxies, hosts = proxied_cluster(workers=args.workers, ps=args.ps)
  processes = []
  for name, cluster_flags in hosts.items():
    job, index = re.match(r'([a-z]+)(\d+)', name).groups()
    with open(os.path.join(work, name + '.log'), 'w') as log:
      processes.append(subprocess.Popen(
          [sys.executable, os.path.join(ROOT, 'train_distributed.py'),
           '--job_name=' + job, '--task_index=' + index,
           '--data_dir=' + args.data_dir,
           '--train_dir=' + os.path.join(work, 'train'),
           '--max_steps=%d' % args.steps] + cluster_flags +
          args.flags.split() + (['--nosync_replicas'] if args.nosync else []),
          stdout=log, stderr=subprocess.STDOUT))
  try:
    codes = [p.wait() for p in processes]
  finally:
    for p in processes:
      if p.poll() is None:
        p.kill()
  if any(codes):
    sys.exit('a task failed (exit codes %s): logs in %s' % (codes, work))
  for kind, variants in sorted(table(steps(proxies)).items()):
    for calls, n in variants:
      print('%s (%d of them): %d RPCs' % (kind, n, sum(calls.values())))
      for (where, method, what), count in sorted(calls.items()):
        print('  at %-8s %-12s %s%s' % (where, method, what,
                                       ' x%d' % count if count > 1 else ''))
  errors = sum(p.errors for p in proxies)
  if errors:
    print('%d frames could not be read: the counts may miss calls' % errors)


if __name__ == '__main__':
  process.start()  # Before TensorFlow loads.
  main()
