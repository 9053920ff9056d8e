"""The house: one responsibility per module, rooms that import one way, no
cycles, short functions."""

import ast
import glob
import os
import re

from helpers import ROOT

PACKAGE = os.path.join(ROOT, 'training')
# training/'s rooms: its subpackages.
ROOMS = sorted(d for d in os.listdir(PACKAGE) if d != '__pycache__' and
               os.path.isdir(os.path.join(PACKAGE, d)))


def module_name(path):
  """The module a file is: training/graph/__init__.py is training.graph."""
  name = os.path.relpath(path, ROOT)[:-3].replace('/', '.')
  return name[:-len('.__init__')] if name.endswith('.__init__') else name


# {module: its file}: the article's files, the package and its rooms.
PATHS = {module_name(p): p for p in glob.glob(os.path.join(ROOT, '*.py')) +
         glob.glob(os.path.join(PACKAGE, '*.py')) +
         glob.glob(os.path.join(PACKAGE, '*', '*.py'))}
MODULES = sorted(PATHS)
SOURCES = [PATHS[m] for m in MODULES] + sorted(
    glob.glob(os.path.join(ROOT, 'scripts', '*.py')) +
    glob.glob(os.path.join(ROOT, 'tools', '*.py')))


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
  # train_flags.py defines the flags, and only the entry point imports it.
  assert readers == ['train_distributed.py', 'train_flags.py']
  assert [os.path.relpath(p, ROOT) for p in SOURCES
          if 'train_flags' in imports(p)] == ['train_distributed.py']


def test_no_import_cycle():
  graph = {m: imports(PATHS[m]) & set(MODULES) for m in MODULES}
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


def test_training_is_six_rooms_or_fewer_and_every_module_in_one():
  """Nothing the checks cannot see: each room a package of modules, none
  deeper, none loose beside the rooms."""
  assert 1 <= len(ROOMS) <= 6, ROOMS
  found = []
  for folder, dirs, files in os.walk(PACKAGE):
    dirs[:] = [d for d in dirs if d != '__pycache__']
    found += [os.path.join(folder, f) for f in files if f.endswith('.py')]
  assert sorted(found) == sorted(p for m, p in PATHS.items()
                                 if m.startswith('training'))
  assert [os.path.relpath(p, PACKAGE) for p in found
          if os.path.dirname(p) == PACKAGE] == ['__init__.py']
  for room in ROOMS:
    assert os.path.isfile(os.path.join(PACKAGE, room, '__init__.py')), room


def may_import(room):
  """The rooms a room's __init__ docstring says it may import."""
  doc = ast.get_docstring(tree(PATHS['training.' + room]))
  said = re.search(r'^May import: (.+)\.$', doc, re.M)
  assert said, 'training/%s/__init__.py says not what it may import' % room
  return set() if said.group(1) == 'nothing of training' else set(
      said.group(1).split(', '))


def test_rooms_import_only_what_their_init_allows_one_way():
  allowed = {room: may_import(room) for room in ROOMS}
  order = []  # One way: each room allows only rooms before it here.
  while len(order) < len(ROOMS):
    ready = [r for r in ROOMS if r not in order and allowed[r] <= set(order)]
    assert ready, 'rooms that allow each other: %s' % sorted(
        set(ROOMS) - set(order))
    order += ready
  for module in MODULES:
    parts = module.split('.')
    if parts[0] == 'training':  # Absolute imports: the rooms by name.
      assert not [n for n in ast.walk(tree(PATHS[module]))
                  if isinstance(n, ast.ImportFrom) and n.level], module
    if parts[0] == 'training' and len(parts) == 3:
      used = {n.split('.')[1] for n in imports(PATHS[module])
              if n.startswith('training.')}
      assert used <= allowed[parts[1]] | {parts[1]}, (module, used)


def test_no_function_over_60_lines():
  long = ['%s:%s (%d lines)' % (os.path.relpath(p, ROOT), n.name,
                                n.end_lineno - n.lineno + 1)
          for p in SOURCES for n in ast.walk(tree(p))
          if isinstance(n, ast.FunctionDef)
          and n.end_lineno - n.lineno + 1 > 60]
  assert not long


def test_no_product_module_over_400_lines():
  over = []
  for path in SOURCES + sorted(glob.glob(os.path.join(ROOT, 'scripts',
                                                      '*.sh'))):
    with open(path) as f:
      count = sum(1 for _ in f)
    if count > 400:
      over.append('%s (%d lines)' % (os.path.relpath(path, ROOT), count))
  assert not over, 'over 400 lines: ' + ', '.join(over)


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
      'def main', 'tf.train.ClusterSpec', 'tf1.train.Server',
      'train_graph.devices', 'train_graph.build',
      'tf1.train.MonitoredSession', 'while not sess.should_stop()'])


def calls_deep(files, start):
  """{landmark: the fewest calls from start to a function that has it},
  over the functions of files ({prefix: path}: a call `prefix.name` or
  `name` in the file of that prefix)."""
  functions = {}
  for prefix, path in files.items():
    for node in tree(os.path.join(ROOT, path)).body:  # Top level only.
      if isinstance(node, ast.FunctionDef):
        functions[prefix + node.name] = node
  depth, todo, found = {start: 0}, [start], {}
  while todo:
    name = todo.pop(0)
    prefix = name.rpartition('.')[0] + '.' if '.' in name else ''
    for node in ast.walk(functions[name]):
      mark = (ast.unparse(node.func) if isinstance(node, ast.Call) else
              'while ' + ast.unparse(node.test)
              if isinstance(node, ast.While) else None)
      if mark is None:
        continue
      found.setdefault(mark, depth[name])
      callee = mark if mark in functions else prefix + mark
      if callee in functions and callee not in depth:
        depth[callee] = depth[name] + 1
        todo.append(callee)
  return found


def test_the_article_is_at_most_two_calls_from_main():
  # mnist_replica.py shows each in its main(); here each is in main() or a
  # function it calls, or one that calls.
  found = calls_deep({'': 'train_distributed.py',
                      'train_graph.': 'train_graph.py'}, 'main')
  marks = ['tf.train.ClusterSpec', 'tf1.train.Server',
           'tf1.train.replica_device_setter',
           'tf1.train.SyncReplicasOptimizer', 'tf1.train.MonitoredSession',
           'while not sess.should_stop()']
  assert {m: found.get(m) for m in marks} == {
      'tf.train.ClusterSpec': 0, 'tf1.train.Server': 1,
      'tf1.train.replica_device_setter': 2,
      'tf1.train.SyncReplicasOptimizer': 2, 'tf1.train.MonitoredSession': 1,
      'while not sess.should_stop()': 2}


def test_calls_deep_counts_the_calls_between():
  # On a file written here: main -> a -> b, and a method named like a
  # function that is not the one called.
  found = calls_deep({'': 'tests/calls_deep_example.py'}, 'main')
  assert found == {'a': 0, 'b': 1, 'print': 2}


def test_one_module_names_the_queues_the_tasks_share():
  # SyncReplicasOptimizer's token queue and accumulators, the join and done
  # queues: named in sync_protocol.py alone, which gives the others ops.
  names = ('sync_token_q', 'grad_accum', 'done_queue_', 'joined_%d',
           'worker_progress', 'sync_rep_local_step')
  naming = {}
  for path in SOURCES:
    for node in ast.walk(tree(path)):
      if isinstance(node, ast.Constant) and isinstance(node.value, str):
        for name in names:
          if name in node.value:
            naming.setdefault(os.path.relpath(path, ROOT), set()).add(name)
  assert naming == {'training/graph/sync_protocol.py': set(names)}


def test_docs_code_gives_each_module_its_line():
  with open(os.path.join(ROOT, 'docs', 'code.md')) as f:
    rows = re.findall(r'^\| `([\w.]+)` \| .+ \|$', f.read(), re.M)
  listed = [p for pattern in ('*.py', 'training/*/*.py', 'scripts/*.py',
                              'scripts/*.sh', 'tools/*.py')
            for p in glob.glob(os.path.join(ROOT, pattern))
            if os.path.basename(p) != '__init__.py']
  assert sorted(os.path.basename(p) for p in listed) == sorted(rows)


def test_the_graph_reads_like_the_article():
  in_order('train_graph.py', [
      'def devices', 'tf1.train.replica_device_setter',
      'cifar10_model.inference', 'cifar10_model.loss', 'def build',
      'learning_rate.rate', 'tf1.train.SyncReplicasOptimizer',
      'def scaffold'])


def test_the_package_does_not_import_the_article():
  for module in MODULES:
    if module.startswith('training.'):
      assert not imports(PATHS[module]) & ARTICLE, module


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


def test_only_the_packing_and_the_compat_module_use_private_api():
  # The packing's uses (--nopack_transfers runs without them), and what the
  # suite cannot do without: tf-slim's ops.Tensor, the Chrome trace writer,
  # a partitioned slice's saved name, the global step read of the hooks.
  users = {os.path.relpath(p, ROOT): private_uses(p) for p in SOURCES}
  assert {p: sorted(set(u)) for p, u in users.items() if u} == {
      'training/graph/transfers.py': sorted([
          '_get_control_flow_context', '_update_input',
          '_remove_all_control_inputs', '_add_control_inputs']),
      'training/runtime/tf_compat.py': sorted([
          'tensorflow.python.client', 'tensorflow.python.framework',
          'tensorflow.python.training', '_save_slice_info'])}


def private_comments(path):
  """The comments in a file that open with `# Private:`, each joined into
  one line."""
  found = []
  with open(path) as f:
    lines = [l.strip() for l in f]
  for i, line in enumerate(lines):
    if line.startswith('# Private: '):
      block = [line]
      for more in lines[i + 1:]:
        if not more.startswith('#'):
          break
        block.append(more[1:].strip())
      found.append(' '.join(block))
  return found


def test_each_private_use_says_what_breaks():
  for path in ('training/graph/transfers.py', 'training/runtime/tf_compat.py'):
    comments = private_comments(os.path.join(ROOT, path))
    for use in set(private_uses(os.path.join(ROOT, path))):
      assert [c for c in comments if use in c.split(' If ', 1)[0]], (
          path, use)
    assert all(' If it goes' in c or ' If they go' in c
               for c in comments), (path, comments)
  # The packing's uses all have a way round: its flag.
  assert all('--nopack_transfers runs without' in c for c in private_comments(
      os.path.join(ROOT, 'training/graph/transfers.py')))


# What users run to train and use the model; the developers' tools (the
# benchmark, the elastic run and what they use) are in tools/.
USER_SCRIPTS = {'run_local_cluster.sh', 'download_cifar10.py',
                'make_synthetic_cifar10.py', 'make_cifar_binary.py',
                'show_inputs.py', 'plan_cluster.py', 'calibrate_planner.py',
                'export_model.py', 'classify_images.py', 'tensorboard.sh'}


def test_scripts_hold_only_what_users_run():
  scripts = os.path.join(ROOT, 'scripts')
  assert {f for f in os.listdir(scripts) if os.path.isfile(
      os.path.join(scripts, f))} == USER_SCRIPTS
  # Tools may use scripts (the planner, the synthetic data); a script never
  # needs tools/: it imports no tool and runs none.
  tools = {os.path.basename(p)[:-3]
           for p in glob.glob(os.path.join(ROOT, 'tools', '*.py'))}
  for name in USER_SCRIPTS:
    path = os.path.join(scripts, name)
    if name.endswith('.py'):
      assert not {n.split('.')[0] for n in imports(path)} & (
          tools | {'tools'}), name
      assert not [n.value for n in ast.walk(tree(path))
                  if isinstance(n, ast.Constant) and isinstance(n.value, str)
                  and 'tools' in re.split(r'[/\\]', n.value)], name
    else:
      with open(path) as f:
        assert 'tools/' not in f.read(), name


def test_no_test_file_imports_another():
  # Shared helpers live in tests/helpers.py; conftest.py holds fixtures.
  tests = glob.glob(os.path.join(ROOT, 'tests', '*.py'))
  leaning = {os.path.basename(p): sorted(
      n for n in imports(p) if n.split('.')[0].startswith('test_') or
      n.split('.')[0] == 'conftest') for p in tests}
  assert {p: n for p, n in leaning.items() if n} == {}


def slow(node):
  """Whether a test function's decorators mark it slow."""
  return any('slow' in ast.unparse(d) for d in node.decorator_list)


ALL_PATHS = {module_name(p): p for p in SOURCES}
ALL_MODULES = set(ALL_PATHS)
# scripts/ and tools/ are on the tests' path: imported by bare name.
BARE = {m.split('.')[-1]: m for m in ALL_MODULES
        if m.split('.')[0] in ('scripts', 'tools')}
# What starts the trainer (helpers.TRAINER, Processes.trainer,
# helpers.start_cluster): a test that uses one runs train_distributed.py.
RUNS_TRAINER = {'TRAINER', 'trainer', 'start_cluster'}


def product_imports(path):
  """The product modules (ALL_MODULES) a file imports."""
  return {BARE.get(m, m) for m in imports(path)} & ALL_MODULES


def uses(node):
  """(the names and attributes node's code uses, the strings it holds),
  its docstring left out."""
  names, strings = set(), set()
  body = getattr(node, 'body', None)
  skip = body[0].value if (isinstance(body, list) and body and isinstance(
      body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)) else None
  for sub in ast.walk(node):
    if isinstance(sub, ast.Name):
      names.add(sub.id)
    elif isinstance(sub, ast.Attribute):
      names.add(sub.attr)
    elif (isinstance(sub, ast.Constant) and isinstance(sub.value, str) and
          sub is not skip):
      strings.add(sub.value)
  return names, strings


def imported_in(node):
  """The product modules a function imports in its own body."""
  found = set()
  for sub in ast.walk(node):
    if isinstance(sub, (ast.Import, ast.ImportFrom)):
      for alias in sub.names:
        full = (alias.name if isinstance(sub, ast.Import) else
                '%s.%s' % (sub.module, alias.name))
        found |= {BARE.get(n, n) for n in (full, alias.name)} & ALL_MODULES
  return found


def quick_modules(path):
  """The product modules path's quick tests (not marked slow, nor their
  file) use: the modules they name through an import (the file's or their
  own), the scripts and tools they run by their file's name, the trainer
  they start; through the file's own functions and constants too."""
  module = tree(path)
  if any(isinstance(n, ast.Assign) and 'pytestmark' in ast.unparse(n) and
         'slow' in ast.unparse(n) for n in module.body):
    return set()
  local_imports = {}  # {a function of the file: what it imports itself}.
  local = {}  # {a name the file binds: the product module it stands for}.
  for node in module.body:
    if isinstance(node, (ast.Import, ast.ImportFrom)):
      for alias in node.names:
        full = (alias.name if isinstance(node, ast.Import) else
                '%s.%s' % (node.module, alias.name))
        for name in (full, alias.name):
          if BARE.get(name, name) in ALL_MODULES:
            local[alias.asname or alias.name.split('.')[0]] = BARE.get(
                name, name)
  defined = {}  # {a function or constant of the file: its uses}.
  for node in module.body:
    if isinstance(node, ast.FunctionDef):
      defined[node.name] = uses(node)
      local_imports[node.name] = imported_in(node)
    elif isinstance(node, ast.Assign):
      for target in node.targets:
        if isinstance(target, ast.Name):
          defined[target.id] = uses(node.value)
  found = set()
  for node in module.body:
    if not (isinstance(node, ast.FunctionDef) and
            node.name.startswith('test_') and not slow(node)):
      continue
    names, strings = uses(node)
    found |= imported_in(node)  # What the test imports in its own body.
    todo = set(names)
    while todo:  # Through the file's own functions and constants.
      name = todo.pop()
      found |= local_imports.get(name, set())
      if name in defined:
        more, held = defined.pop(name)
        todo |= more - names
        names |= more
        strings |= held
    found |= {local[n] for n in names if n in local}
    if names & RUNS_TRAINER:
      found.add('train_distributed')
    for source in SOURCES:
      base = os.path.basename(source)
      if any(re.search(r'\b%s\b' % re.escape(base), t) for t in strings):
        found.add(module_name(source))
  return found


# Modules no test needs to reach: the package's marker.
NO_QUICK_TEST = {'training'}


def test_every_module_has_a_quick_test():
  """The quick tier (README: -m 'not slow') reaches every module: each is
  used by a quick test (imported, run by its file's name, or, for the
  trainer, started), or imported by a module so used. This file's own
  tests are not counted: they read every module without running any."""
  todo = set()
  for path in glob.glob(os.path.join(os.path.dirname(__file__),
                                     'test_*.py')):
    if os.path.basename(path) != 'test_structure.py':
      todo |= quick_modules(path)
  reached = set()
  while todo:
    module = todo.pop()
    reached.add(module)
    todo |= product_imports(ALL_PATHS[module]) - reached
  assert sorted(ALL_MODULES - reached - NO_QUICK_TEST) == []
