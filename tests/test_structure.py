"""The house: one responsibility per module, no cycles, short functions."""

import ast
import glob
import os

from conftest import ROOT

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


def test_the_entry_point_is_short():
  # Its flags grow with the suite (the learning rate's three took it past
  # 400); the rest stays in the modules it calls.
  with open(os.path.join(ROOT, 'train_distributed.py')) as f:
    assert len(f.read().splitlines()) <= 425
