"""The house: one responsibility per module, no cycles, short functions."""

import ast
import glob
import os

from helpers import ROOT

MODULES = sorted(os.path.relpath(p, ROOT)[:-3].replace('/', '.')
                 for p in glob.glob(os.path.join(ROOT, '*.py')) +
                 glob.glob(os.path.join(ROOT, 'training', '*.py')))
SOURCES = [os.path.join(ROOT, m.replace('.', '/') + '.py')
           for m in MODULES] + sorted(
    glob.glob(os.path.join(ROOT, 'scripts', '*.py')))


def tree(path):
  with open(path) as f:
    return ast.parse(f.read(), path)


def imports(path):
  """Every module name the file imports."""
  names = set()
  for node in ast.walk(tree(path)):
    if isinstance(node, ast.Import):
      names.update(a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module:
      names.add(node.module)
      names.update(node.module + '.' + a.name for a in node.names)
  return names


def test_every_module_opens_with_a_docstring():
  for path in SOURCES:
    assert ast.get_docstring(tree(path)), path


def test_only_the_entry_point_reads_absl_flags():
  readers = [os.path.relpath(p, ROOT) for p in SOURCES
             if any(n.split('.')[0] == 'absl' for n in imports(p))]
  assert readers == ['train_distributed.py']


def test_no_import_cycle():
  graph = {m: imports(os.path.join(ROOT, m.replace('.', '/') + '.py')) &
           set(MODULES)
           for m in MODULES}
  done, path = set(), []

  def visit(module):
    assert module not in path, 'import cycle: %s' % ' -> '.join(
        path[path.index(module):] + [module])
    if module in done:
      return
    path.append(module)
    for imported in graph[module]:
      visit(imported)
    path.pop()
    done.add(module)

  for module in MODULES:
    visit(module)


def test_no_function_over_60_lines():
  long = ['%s:%s (%d lines)' % (os.path.relpath(p, ROOT), n.name,
                                n.end_lineno - n.lineno + 1)
          for p in SOURCES for n in ast.walk(tree(p))
          if isinstance(n, ast.FunctionDef)
          and n.end_lineno - n.lineno + 1 > 60]
  assert not long


ARTICLE = {'train_distributed', 'train_graph', 'cifar10_input',
           'cifar10_model', 'cifar10_eval'}


def landmarks(path):
  """{landmark: its first line} in a file's code (not its comments or
  strings): each call by its callee (`tf.train.ClusterSpec`), each function
  by `def NAME`, each while loop by `while TEST`."""
  found = {}
  for node in ast.walk(tree(os.path.join(ROOT, path))):
    if isinstance(node, ast.Call):
      mark = ast.unparse(node.func)
    elif isinstance(node, ast.FunctionDef):
      mark = 'def ' + node.name
    elif isinstance(node, ast.While):
      mark = 'while ' + ast.unparse(node.test)
    else:
      continue
    found[mark] = min(found.get(mark, node.lineno), node.lineno)
  return found


def in_order(path, marks):
  """Whether each landmark is in the file's code, in this order."""
  found = landmarks(path)
  assert not [m for m in marks if m not in found], sorted(found)
  lines = [found[m] for m in marks]
  assert lines == sorted(lines), list(zip(marks, lines))


def test_the_entry_point_reads_top_to_bottom():
  # mnist_replica.py's order: flags, the cluster, its server, the graph,
  # the session, the loop.
  in_order('train_distributed.py', [
      'flags.DEFINE_string', 'def main', 'tf.train.ClusterSpec',
      'cluster_runtime.session_target', 'train_graph.devices',
      'train_graph.build', 'tf1.train.MonitoredSession',
      'while not sess.should_stop()'])


def test_the_graph_reads_like_the_article():
  in_order('train_graph.py', [
      'def devices', 'tf1.train.replica_device_setter',
      'cifar10_model.inference', 'cifar10_model.loss', 'learning_rate.rate',
      'def optimizer', 'tf1.train.SyncReplicasOptimizer', 'def scaffold'])


def test_the_package_does_not_import_the_article():
  for module in MODULES:
    if module.startswith('training.'):
      path = os.path.join(ROOT, module.replace('.', '/') + '.py')
      assert not imports(path) & ARTICLE, module


NAMEDTUPLE_API = ('_asdict', '_fields', '_replace', '_make')


def private_uses(path):
  """TensorFlow's private API in a file: imports of tensorflow.python and
  attributes with a leading underscore on anything but self, cls or os
  (os._exit and a namedtuple's _asdict are public)."""
  found = []
  for node in ast.walk(tree(path)):
    if isinstance(node, (ast.Import, ast.ImportFrom)):
      names = [a.name for a in node.names] + [getattr(node, 'module', '')]
      found += [n for n in names if n and n.startswith('tensorflow.python')]
    elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
          and node.func.id in ('getattr', 'hasattr', 'setattr')
          and len(node.args) > 1 and isinstance(node.args[1], ast.Constant)
          and str(node.args[1].value).startswith('_')):
      found.append(node.args[1].value)  # getattr(var, '_private').
    elif (isinstance(node, ast.Attribute) and node.attr.startswith('_')
          and not node.attr.startswith('__')
          and node.attr not in NAMEDTUPLE_API
          and not (isinstance(node.value, ast.Name) and
                   node.value.id in ('self', 'cls', 'os'))):
      found.append(node.attr)
  return found


def test_only_the_packing_module_uses_tensorflows_private_api():
  users = {os.path.relpath(p, ROOT): private_uses(p) for p in SOURCES}
  assert {p: sorted(set(u)) for p, u in users.items() if u} == {
      'training/transfers.py': sorted([
          'tensorflow.python.client', 'tensorflow.python.framework',
          'tensorflow.python.training', '_get_control_flow_context',
          '_update_input', '_remove_all_control_inputs',
          '_add_control_inputs', '_save_slice_info'])}


def test_no_test_file_imports_another():
  # Shared helpers live in tests/helpers.py; conftest.py holds fixtures.
  tests = glob.glob(os.path.join(ROOT, 'tests', '*.py'))
  leaning = {os.path.basename(p): sorted(
      n for n in imports(p) if n.split('.')[0].startswith('test_') or
      n.split('.')[0] == 'conftest') for p in tests}
  assert {p: n for p, n in leaning.items() if n} == {}
