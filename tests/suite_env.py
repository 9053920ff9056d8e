"""The suite's environment, set up once on import, before anything else of
the tests: the variables the caller's shell exported that could change a
result removed (from_caller), SIGINT delivered, the checkout, its scripts/
and its tools/ on sys.path, each pytest-xdist worker's own range of free
ports; and a task's environment (suite_env).
"""

import os
import signal
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, 'scripts'))
sys.path.insert(0, os.path.join(ROOT, 'tools'))

from training.cluster import ports  # pylint: disable=g-import-not-at-top,wrong-import-position

TRAINER = os.path.join(ROOT, 'train_distributed.py')
LOCAL_CLUSTER_SCRIPT = os.path.join(ROOT, 'scripts', 'run_local_cluster.sh')

# The suite's environment. What the caller's shell exports must not change
# a result: a TF_CONFIG would give every task a cluster, TF_CPP_MIN_LOG_LEVEL
# what TensorFlow prints (and the fork server's TensorFlow a level the tasks
# did not ask for), CUDA_VISIBLE_DEVICES the devices a task sees, a GRPC_
# variable or a proxy how the tasks talk; the others TensorFlow's logs,
# kernels, memory or Keras. A test that needs one sets it itself
# (procs.start's env, monkeypatch).
CALLER_PREFIXES = ('TF_', 'XLA_', 'CUDA_', 'GRPC_')
CALLER_VARIABLES = ('http_proxy', 'https_proxy', 'all_proxy', 'grpc_proxy',
                    'HTTP_PROXY', 'HTTPS_PROXY', 'ALL_PROXY')


def from_caller(name):
  """Whether the suite drops the variable `name` the caller exported."""
  return name.startswith(CALLER_PREFIXES) or name in CALLER_VARIABLES


# A suite started in the background by a shell without job control (`pytest
# &` in a script, nohup) inherits SIGINT ignored, and so would every process
# it starts: the tests of Ctrl-C need it delivered, as in a terminal.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
  signal.signal(signal.SIGINT, signal.default_int_handler)

# What the caller exported and the suite dropped (pytest's header says it).
DROPPED_FROM_CALLER = {k: os.environ.pop(k) for k in list(os.environ)
                       if from_caller(k)}

def free_ports(n):
  """Returns n distinct TCP ports, free now, that no other connection takes
  before the tasks bind them (see training/cluster/ports.py)."""
  return ports.free_ports(n)


def worker_port_range(worker, count):
  """pytest-xdist's worker 'gwK' of count: its share of ports.port_range(),
  as FREE_PORT_RANGE gives it, so that tests run side by side never pick
  the same free port (a slot listed but not started stays free a while)."""
  low, high = ports.port_range()
  k, width = int(worker[2:]), (high - low) // count
  return '%d-%d' % (low + k * width, low + (k + 1) * width)


if 'PYTEST_XDIST_WORKER' in os.environ:  # For the scripts and tools too.
  os.environ['FREE_PORT_RANGE'] = worker_port_range(
      os.environ['PYTEST_XDIST_WORKER'],
      int(os.environ['PYTEST_XDIST_WORKER_COUNT']))


def suite_env(env=None):
  """The environment of a task: the suite's, unbuffered, no TF_CONFIG."""
  full_env = dict(os.environ, PYTHONUNBUFFERED='1')
  full_env.pop('TF_CONFIG', None)  # A cluster comes only from the test.
  full_env.update(env or {})
  return full_env


