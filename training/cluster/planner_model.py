"""How fast a cluster trains: the model of images/s the planner uses.

From one process's step on a worker machine, the model's bytes and how the
ps tasks share them, the link rate, the workers and ps, and (where given)
the machines' cores and the spread of the steps, predicts a synchronous
step, an update with a backup worker, and an asynchronous worker's step.
Used by scripts/plan_cluster.py, and by tools/ beside what they measure
(the benchmark's slow links, the scaling run on machines of their own).
Every task is assumed to have a link of its own of the same rate, as
machines on one switch have.
"""

import functools
import json
import math

# Bytes on the wire per byte of tensor: TCP/IP and Ethernet headers, and
# gRPC's framing. Measured on the benchmark's emulated links: 723 KB over
# one TCP stream took 1.033x its bytes' time from 30 Mbit/s to 1 Gbit/s.
WIRE_OVERHEAD = 1.033
# How a synchronous step grows with its transfers. The pull crosses the
# busiest link before the forward pass can start: all of it is on the
# critical path. The push runs beside the backward pass: it costs only what
# does not fit beside HIDDEN_SHARE of the fast-network step (the backward
# pass, and the ps tasks' own work). What the push costs: the worker's own
# link once more (OWN_LINK_FACTOR), and a third of the busiest link again
# (BUSIEST_LINK_EXTRA: the workers' pushes arrive at a ps at once, and TCP
# restarts slowly after every pause of a step). The three constants were
# fitted to the benchmark's slow-network runs of 1 and 2 ps + 2 workers,
# float32 and bfloat16, batch 64 and 32, at 30 and 100 Mbit/s: within 3% of
# all seven (docs/scaling.md).
BUSIEST_LINK_EXTRA = 0.3
OWN_LINK_FACTOR = 1.0
HIDDEN_SHARE = 0.58
# Where the machines' cores are given, the compute fills them and takes
# long beside the bytes: the pull streams in beside the forward pass too (a
# later layer's weights arrive while an earlier one computes), so a step
# grows by what of BUSY_BUSIEST x the busiest link's transfer and BUSY_OWN x
# the worker's own (its pull and its push) does not fit beside
# BUSY_HIDDEN_SHARE of the step (fitted with the RPCs' CPU below).
BUSY_BUSIEST = 1.26
BUSY_OWN = 0.60
BUSY_HIDDEN_SHARE = 0.33
# The CPU of a step's RPCs, core-ms, where the machines' cores are given
# (--worker_cores, --ps_cores). A worker: SYNC_RPC_MS a synchronous step
# (its token, the accumulators), ASYNC_RPC_MS an asynchronous one, and
# PS_RPC_MS for each ps it reads from and writes to. Ps 0, which holds
# the global step and the token queue, whatever its share of the bytes:
# PS_WORKER_MS a worker's synchronous step, PS_UPDATE_MS an update,
# PS_ASYNC_MS an asynchronous step. A task's RPCs and its compute share its
# cores (as on a machine whose cores are all busy). Fitted to three runs'
# points together on machines of their own kept to one core each, 1-8
# workers, 1-5 ps (tools/scaling_run.py --pool, docs/scaling.md#scaling),
# with the barrier (sync_parts).
SYNC_RPC_MS = 1.3
ASYNC_RPC_MS = 0.65
PS_RPC_MS = 5.35
PS_WORKER_MS = 4.4
PS_UPDATE_MS = 9.9
PS_ASYNC_MS = 3.9
# What scripts/calibrate_planner.py measures on the user's machines and
# load_constants() puts in their place.
CPU_CONSTANTS = ('SYNC_RPC_MS', 'ASYNC_RPC_MS', 'PS_RPC_MS', 'PS_WORKER_MS',
                 'PS_UPDATE_MS', 'PS_ASYNC_MS')


def load_constants(path):
  """Puts the CPU constants of scripts/calibrate_planner.py's file in place
  of the shipped ones; returns the machine it measured them on.

  Raises:
    ValueError: the file lacks one, or one is not a number of 0 or more.
  """
  with open(path) as f:
    found = json.load(f)
  values = found.get('constants') if isinstance(found, dict) else None
  if not isinstance(values, dict):
    raise ValueError('%s holds no constants; measure them with '
                     'scripts/calibrate_planner.py' % path)
  for name in CPU_CONSTANTS:
    value = values.get(name)
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or
        not 0 <= value < math.inf):
      raise ValueError('%s: %s is %r, not a number of 0 or more; measure '
                       'again with scripts/calibrate_planner.py' % (
                           path, name, value))
  globals().update({name: float(values[name]) for name in CPU_CONSTANTS})
  return found.get('machine', 'an unnamed machine')


# Asynchronous pulls and pushes cross the busiest link at once, in both
# directions, from every worker: it carries its bytes this many times more
# slowly than one stream.
ASYNC_LINK_FACTOR = 2.34


def busiest_bytes(model_bytes, share, num_workers, dtype_bytes=4):
  """The tensor bytes the busiest link carries each way per step.

  A worker's own link carries the whole model each way (the weights in,
  the gradients out); a ps's link carries its share for every worker.
  """
  return model_bytes * dtype_bytes / 4.0 * max(1.0, num_workers * share)


def transfer_ms(tensor_bytes, mbit):
  """How long tensor_bytes take on a link of mbit Mbit/s, headers and all."""
  return tensor_bytes * WIRE_OVERHEAD * 8 / (mbit * 1e6) * 1e3


def link_ms(model_bytes, share, num_workers, mbit, dtype_bytes=4):
  """The busiest link's transfer, ms each way per step."""
  return transfer_ms(busiest_bytes(model_bytes, share, num_workers,
                                   dtype_bytes), mbit)


def predict_step_ms(step_ms, model_bytes, share, num_workers, mbit,
                    dtype_bytes=4, busy=False):
  """Predicts a synchronous step, ms: step_ms, the pull, and what of the
  push does not hide beside the step (see BUSIEST_LINK_EXTRA); busy: the
  machines' compute fills their cores (see BUSY_OWN).

  Args:
    step_ms: A worker's step when the network costs nothing.
    model_bytes: The trainable variables' float32 bytes.
    share: The largest share of them one ps holds.
    num_workers: Workers (all synchronous).
    mbit: Every task's link rate, Mbit/s.
    dtype_bytes: Bytes per value on the wire (2: --transfer_dtype=bfloat16).
    busy: Whether the compute fills the machines' cores (their cores are
      given).
  """
  busiest = link_ms(model_bytes, share, num_workers, mbit, dtype_bytes)
  own = transfer_ms(model_bytes * dtype_bytes / 4.0, mbit)
  if busy:
    return step_ms + max(0.0, BUSY_BUSIEST * busiest + BUSY_OWN * own -
                         BUSY_HIDDEN_SHARE * step_ms)
  push = BUSIEST_LINK_EXTRA * busiest + OWN_LINK_FACTOR * own
  return step_ms + busiest + max(0.0, push - HIDDEN_SHARE * step_ms)


@functools.lru_cache(maxsize=None)
def expected_order(k, n):
  """The mean of the k-th smallest of n standard normal draws (k = n: the
  largest), by the trapezoid rule over [-8, 8]."""
  if n == 1:
    return 0.0
  ways = math.comb(n, k) * k
  total, steps = 0.0, 4000
  for i in range(steps + 1):
    x = -8 + 16.0 * i / steps
    below = 0.5 * (1 + math.erf(x / math.sqrt(2)))
    density = math.exp(-x * x / 2) / math.sqrt(2 * math.pi)
    term = x * ways * below ** (k - 1) * (1 - below) ** (n - k) * density
    total += term * (0.5 if i in (0, steps) else 1.0)
  return total * 16.0 / steps


def sync_parts(*, step_ms, model_bytes, share, num_workers, num_ps, mbit,
               mode='sync', worker_cores=None, ps_cores=None, step_cv=0.0,
               dtype_bytes=4):
  """{part: ms} of a synchronous update: 'compute' (step_ms), 'bytes' (the
  links: predict_step_ms beyond step_ms), 'RPCs' (their CPU on a worker),
  'barrier' (the wait for the slowest worker, or with a backup for the
  second slowest), and 'ps 0' (how long its CPU for the update takes; the
  update takes at least that)."""
  parts = {'compute': step_ms,
           'bytes': predict_step_ms(step_ms, model_bytes, share, num_workers,
                                    mbit, dtype_bytes,
                                    busy=bool(worker_cores)) - step_ms,
           'RPCs': 0.0, 'ps 0': 0.0,
           'barrier': step_cv * step_ms * expected_order(
               num_workers - (mode == 'backup'), num_workers)}
  if worker_cores:
    parts['RPCs'] = (SYNC_RPC_MS + PS_RPC_MS * num_ps) / worker_cores
  if ps_cores:
    parts['ps 0'] = (PS_UPDATE_MS + num_workers * PS_WORKER_MS) / ps_cores
  return parts


def predict_images_per_sec(*, step_ms, model_bytes, share, num_workers,
                           num_ps, mbit, batch_size, mode='sync',
                           worker_cores=None, ps_cores=None, step_cv=0.0,
                           dtype_bytes=4):
  """Predicts a cluster's images/s, all workers together.

  Args:
    step_ms: One process's step on one worker machine.
    share: The largest share of the model one of the num_ps ps holds.
    mode: 'sync' (every update a gradient per worker), 'backup' (one
      backup worker: the first num_workers - 1), 'async'.
    worker_cores, ps_cores: The machines' cores (None: their RPCs' CPU is
      not counted).
    step_cv: The spread of a worker's steps (their standard deviation over
      their mean): a synchronous update waits for the slowest of the
      workers' steps, with a backup worker for the second slowest.
    The rest: as predict_step_ms.
  """
  if mode == 'async':
    # Each worker steps on its own; ps 0 and the busiest link serve them in
    # turn.
    rpc = (ASYNC_RPC_MS + PS_RPC_MS * num_ps) / worker_cores if (
        worker_cores) else 0.0
    cycle = max(predict_step_ms(step_ms, model_bytes, share, 1, mbit,
                                dtype_bytes, busy=bool(worker_cores))
                + rpc,
                ASYNC_LINK_FACTOR * link_ms(model_bytes, share, num_workers,
                                            mbit, dtype_bytes),
                num_workers * PS_ASYNC_MS / ps_cores if ps_cores else 0.0)
    return num_workers * batch_size * 1e3 / cycle
  parts = sync_parts(step_ms=step_ms, model_bytes=model_bytes, share=share,
                     num_workers=num_workers, num_ps=num_ps, mbit=mbit,
                     mode=mode, worker_cores=worker_cores, ps_cores=ps_cores,
                     step_cv=step_cv, dtype_bytes=dtype_bytes)
  ms = max(sum(v for k, v in parts.items() if k != 'ps 0'), parts['ps 0'])
  return (num_workers - (mode == 'backup')) * batch_size * 1e3 / ms


def bound(**kwargs):
  """What lengthens a synchronous update most beyond its compute (takes
  sync_parts' arguments): 'bytes', 'RPCs', 'the barrier', or 'ps 0' where
  its CPU is longer than the rest of the update."""
  parts = sync_parts(**kwargs)
  if parts['ps 0'] > sum(v for k, v in parts.items() if k != 'ps 0'):
    return 'ps 0'
  parts = {k: v for k, v in parts.items() if k not in ('compute', 'ps 0')}
  name = max(parts, key=parts.get)
  return 'the barrier' if name == 'barrier' else name


def update_ms(step_ms, model_bytes, share, slots, running, mbit,
              dtype_bytes=4):
  """Predicts an update of `slots` gradients made by `running` workers, ms.

  Each of the update's tokens gives one gradient at its global step, and
  the next update's tokens come after it: the workers make the gradients in
  rounds, slots // running of every worker, then one of the slots % running
  left (the others wait). Each round is predict_step_ms of its workers.
  """
  full, rest = divmod(slots, running)
  ms = full * predict_step_ms(step_ms, model_bytes, share, running, mbit,
                              dtype_bytes)
  if rest:
    ms += predict_step_ms(step_ms, model_bytes, share, rest, mbit,
                          dtype_bytes)
  return ms


def running_rows(step_ms, slots, mbit, share, batch_size, model_bytes,
                 dtype_bytes):
  """Returns [(workers running, ms per update, updates/s, images/s)] for
  1..slots of them, every update taking a gradient per slot."""
  times = [update_ms(step_ms, model_bytes, share, slots, running, mbit,
                     dtype_bytes) for running in range(1, slots + 1)]
  return [(running, ms, 1e3 / ms, slots * batch_size * 1e3 / ms)
          for running, ms in enumerate(times, 1)]


def workers_series(step_ms, max_workers, mbit, shares, batch_size,
                   model_bytes, dtype_bytes, ps_counts=(1, 2, 4, 8, 16)):
  """{num_ps: [predicted images/s of 1..max_workers workers]}, for the
  ps_counts within shares (the planner's --plot draws these)."""
  return {num_ps: [n * batch_size * 1e3 / predict_step_ms(
      step_ms, model_bytes, shares[num_ps], n, mbit, dtype_bytes)
                   for n in range(1, max_workers + 1)]
          for num_ps in ps_counts if num_ps in shares}


# The float32 copies of each weight the ps tasks hold: the weight and its
# moving average; momentum adds its accumulator (the BatchNorm statistics,
# 800 floats here, left out).
VARIABLE_COPIES = {'sgd': 2, 'momentum': 3}


def variables_line(model_bytes, shares, num_ps, optimizer):
  """What the ps tasks hold with optimizer: a checkpoint's bytes, and the
  busiest of num_ps ps's (shares: {num_ps: its share of the model}). The
  optimizer changes none of the bytes on the wire: only the gradients and
  the weights cross, whatever updates them on the ps."""
  copies = VARIABLE_COPIES[optimizer]
  return ('Variables with --optimizer=%s (each weight, its moving average%s): '
          '%.2f MB of a checkpoint\'s data, %.2f MB on the busiest of %d ps; the '
          'bytes on the wire are the same with either optimizer.' % (
              optimizer, ' and its accumulator' if optimizer == 'momentum'
              else '', model_bytes * copies / 1e6,
              model_bytes * shares[num_ps] * copies / 1e6, num_ps))
