"""The docs: every relative link resolves, and the two READMEs agree.

README.md is the short page (at most 300 lines); the depth is in docs/.
README.zh-CN.md is for the readers of the Chinese article: it must give the
same shell commands and the same flags, so that a flag or a command added
to one and not the other fails here.
"""

import glob
import os
import re

import pytest

from helpers import ROOT

PAGES = ['README.md', 'README.zh-CN.md'] + sorted(
    os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, 'docs',
                                                             '*.md')))
LINK = re.compile(r'!?\[[^\]]*\]\(([^)\s]+)\)')
FENCE = re.compile(r'^```[^\n]*\n.*?^```', re.M | re.S)


def read(page):
  with open(os.path.join(ROOT, page), encoding='utf-8') as f:
    return f.read()


def anchors(page):
  """The #anchors GitHub makes of a page's headings."""
  slugs = set()
  for title in re.findall(r'^#+ (.+)$', FENCE.sub('', read(page)), re.M):
    slug = re.sub(r'[^\w\- ]', '', title.strip().lower()).replace(' ', '-')
    slugs.add(slug)
  return slugs


def test_the_pages_are_there():
  assert {'docs/performance.md', 'docs/failures.md', 'docs/kubernetes.md',
          'docs/reference.md', 'docs/tests.md'} <= set(PAGES)


@pytest.mark.parametrize('page', PAGES)
def test_every_relative_link_and_anchor_resolves(page):
  text = FENCE.sub('', read(page))
  for target in LINK.findall(text):
    if re.match(r'^[a-z]+:', target):
      continue  # http(s), mailto: not ours to check offline.
    path, _, anchor = target.partition('#')
    resolved = os.path.normpath(os.path.join(os.path.dirname(page), path)
                                if path else page)
    assert os.path.exists(os.path.join(ROOT, resolved)), (page, target)
    if anchor:
      assert anchor in anchors(resolved), (page, target,
                                           sorted(anchors(resolved)))


def test_readme_is_short_and_keeps_the_test_command():
  text = read('README.md')
  assert len(text.splitlines()) <= 300
  assert re.search(r'^<!-- test-command: .+ -->$', text, re.M)


def shell_commands(page):
  """The commands of a page's ```sh blocks, continuations joined, without
  comments (which each README writes in its own language)."""
  commands = set()
  for block in re.findall(r'^```sh\n(.*?)^```', read(page), re.M | re.S):
    for line in block.replace('\\\n', ' ').splitlines():
      line = ' '.join(line.split())
      if line and not line.startswith('#'):
        commands.add(line)
  return commands


def table_flags(page):
  return set(re.findall(r'^\| `(--\w+)`', read(page), re.M))


def test_both_readmes_give_the_same_commands_and_flags():
  assert shell_commands('README.md') == shell_commands('README.zh-CN.md')
  assert table_flags('README.md') == table_flags('README.zh-CN.md')
  assert len(table_flags('README.md')) >= 28
  # And they point at each other first thing.
  assert '(README.zh-CN.md)' in ''.join(read('README.md').splitlines()[:4])
  assert '(README.md)' in ''.join(read('README.zh-CN.md').splitlines()[:4])


def test_readme_flags_are_the_trainers():
  import train_distributed  # pylint: disable=g-import-not-at-top
  ours = train_distributed.FLAGS.flags_by_module_dict()['train_flags']
  assert table_flags('README.md') == {'--' + f.name for f in ours}
