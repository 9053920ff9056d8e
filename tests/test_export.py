"""scripts/export_model.py and scripts/classify_images.py, run as a user runs
them, on tiny trained runs: the export is the model the evaluator tests
(its probabilities, its accuracy), loads in plain TensorFlow 2 and in
saved_model_cli, and carries the class names of its data; the classifier
names an image's class; each bad input is one line."""

import json
import os
import shlex
import shutil
import subprocess
import sys

import numpy as np
from PIL import Image
import pytest
import tensorflow as tf

import cifar10_eval
import helpers
from helpers import ROOT, single_process_flags
import make_cifar_binary
import make_synthetic_cifar10

tf1 = tf.compat.v1

EXPORT = os.path.join(ROOT, 'scripts', 'export_model.py')
CLASSIFY = os.path.join(ROOT, 'scripts', 'classify_images.py')
STEPS = 60
NAMES = make_synthetic_cifar10.CLASS_NAMES

# In a fresh interpreter that imports only TensorFlow (and numpy): the
# export's answers to the images in argv[2] (.npy), and the suite's modules
# it loaded (none).
SERVE = """
import json, sys
import numpy as np
import tensorflow as tf
serve = tf.saved_model.load(sys.argv[1]).signatures['serving_default']
out = serve(images=tf.constant(np.load(sys.argv[2])))
print(json.dumps({
    'dtypes': {k: v.dtype.name for k, v in out.items()},
    'probabilities': out['probabilities'].numpy().tolist(),
    'class_index': out['class_index'].numpy().tolist(),
    'class_name': [n.decode() for n in out['class_name'].numpy()],
    'ours': sorted(m for m in sys.modules if m.split('.')[0] in (
        'tf_slim', 'training', 'cifar10_model', 'cifar10_input'))}))
"""


def run_all(*commands, cwd=ROOT):
  """Runs each command (its argv) at the same time; returns [(exit status,
  stdout, stderr)], in order. Kills any left on a failure."""
  procs = [subprocess.Popen(list(c), cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=helpers.suite_env())
           for c in commands]
  try:
    outputs = [p.communicate(timeout=300) for p in procs]
    return [(p.returncode, out, err) for p, (out, err) in zip(procs, outputs)]
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.wait()


def run(*args, cwd=ROOT):
  """Runs python3 with args; returns (exit status, stdout, stderr)."""
  return run_all([sys.executable] + list(args), cwd=cwd)[0]


def saved_model_cli():
  """The saved_model_cli TensorFlow installs: beside this python3 (a
  virtual environment's), else on the PATH."""
  beside = os.path.join(os.path.dirname(sys.executable), 'saved_model_cli')
  return beside if os.path.isfile(beside) else shutil.which('saved_model_cli')


def read_records(data_dir, name='test_batch.bin'):
  """(uint8 images [n, 32, 32, 3], labels) of one of data_dir's files."""
  records = np.fromfile(os.path.join(data_dir, name), np.uint8).reshape(
      -1, 3073)
  return (records[:, 1:].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1),
          records[:, 0].astype(np.int64))


def evaluator_probabilities(data_dir, checkpoint, standardize, averages=True):
  """The softmax of the logits of cifar10_eval's own graph, on every test
  record in order, the checkpoint restored as the evaluator restores it
  (averages=False: its raw weights)."""
  with tf.Graph().as_default() as graph:
    _, (averaged, raw), local_init = cifar10_eval.build_eval_graph(
        data_dir, batch_size=16, standardize=standardize)
    probabilities = tf.nn.softmax(graph.get_tensor_by_name(
        'InceptionResnetV2/Logits/BiasAdd:0'))
    found = []
    with tf1.Session() as sess:
      (averaged if averages else raw).restore(sess, checkpoint)
      sess.run(local_init)
      coord = tf1.train.Coordinator()
      threads = tf1.train.start_queue_runners(sess, coord)
      try:
        while True:
          found.append(sess.run(probabilities))
      except tf.errors.OutOfRangeError:
        pass
      finally:
        coord.request_stop()
        coord.join(threads)
  return np.concatenate(found)


def serve_in_plain_tf2(export_dir, images, tmp_path):
  """SERVE's answers, in a fresh interpreter in tmp_path."""
  np.save(str(tmp_path / 'images.npy'), images)
  code, out, err = run('-c', SERVE, export_dir, str(tmp_path / 'images.npy'),
                       cwd=str(tmp_path))
  assert code == 0, err
  return json.loads(out)


def exported_lines(checkpoint, export_dir, standardize, names):
  """What the exporter prints, written out."""
  return ('Exported %s (global step %d, the moving averages of its weights) '
          'to %s\nserving_default: images uint8 [N,32,32,3]%s -> '
          'probabilities [N,%d], class_index [N], class_name [N] of %d '
          'classes: %s\n' % (checkpoint, int(checkpoint.rsplit('-', 1)[1]),
                             export_dir, ', standardized' if standardize
                             else '', len(names), len(names),
                             ', '.join(names)))


def classified(path, probabilities, names):
  """The classifier's line, worked out from the export's probabilities."""
  top = np.argsort(-np.asarray(probabilities), kind='stable')[:3]
  return '%s: %s' % (path, ', '.join('%s %.2f' % (names[i], probabilities[i])
                                      for i in top))


def train(procs, name, data_dir, train_dir, *flags):
  procs.trainer(name, *single_process_flags(data_dir, train_dir), *flags)
  assert procs.wait_all(timeout=300)[name] == 0, procs.tails()


@pytest.fixture(scope='module')
def trained(tiny_data, tmp_path_factory):
  """A run of STEPS steps on tiny_data; its export, made while the
  evaluator tests the same checkpoint. Returns a dict: train_dir,
  export_dir, checkpoint, what the exporter printed (exported), the
  evaluator's log."""
  root = tmp_path_factory.mktemp('export')
  procs = helpers.Processes(str(root))
  try:
    train_dir, export_dir = str(root / 'train'), str(root / 'export')
    train(procs, 'train', tiny_data, train_dir, '--max_steps=%d' % STEPS)
    procs.trainer('evaluator', '--job_name=evaluator', '--run_once',
                  '--data_dir=' + tiny_data, '--train_dir=' + train_dir)
    code, out, err = run(EXPORT, '--train_dir=' + train_dir,
                         '--export_dir=' + export_dir)
    assert (code, err) == (0, ''), err
    assert procs.wait_all(timeout=300)['evaluator'] == 0, procs.tails()
    return {'train_dir': train_dir, 'export_dir': export_dir,
            'checkpoint': os.path.join(train_dir, 'model.ckpt-%d' % STEPS),
            'exported': out, 'evaluator': procs.log('evaluator')}
  finally:
    procs.kill_all()


@pytest.mark.slow
def test_the_export_is_the_evaluators_model_in_plain_tensorflow(
    trained, tiny_data, tmp_path):
  assert trained['exported'] == exported_lines(
      trained['checkpoint'], trained['export_dir'], True, NAMES)
  with open(os.path.join(trained['train_dir'], 'export.json')) as f:
    assert json.load(f) == {'standardize': True, 'class_names': NAMES}
  images, labels = read_records(tiny_data)
  served = serve_in_plain_tf2(trained['export_dir'], images, tmp_path)
  assert served['ours'] == []  # Neither tf-slim nor this suite.
  assert served['dtypes'] == {'probabilities': 'float32',
                              'class_index': 'int64', 'class_name': 'string'}
  probabilities = np.array(served['probabilities'], np.float32)
  expected = evaluator_probabilities(tiny_data, trained['checkpoint'], True)
  assert probabilities.shape == (50, 10)
  np.testing.assert_allclose(probabilities, expected, rtol=0, atol=1e-6)
  # The averages, not the raw weights, which answer otherwise.
  assert np.abs(probabilities - evaluator_probabilities(
      tiny_data, trained['checkpoint'], True, averages=False)).max() > 1e-3
  assert served['class_index'] == np.argmax(expected, 1).tolist()
  assert served['class_name'] == [NAMES[i] for i in served['class_index']]
  accuracy = np.mean(np.array(served['class_index']) == labels)
  assert 'step %d, loss = ' % STEPS in trained['evaluator']
  assert ',Test accuracy = %.4f (50 examples)' % accuracy in (
      trained['evaluator'])

  # The test records as PNG files, classified in one call (one batch, as
  # above): each line the export's answer; those it gets right name the
  # record's class.
  photos = [str(tmp_path / ('record%d.png' % i)) for i in range(len(images))]
  for photo, image in zip(photos, images):
    Image.fromarray(image).save(photo)
  code, out, err = run(CLASSIFY, '--model_dir=' + trained['export_dir'],
                       *photos)
  assert (code, err) == (0, '')
  assert out.splitlines() == [classified(photo, p, NAMES)
                              for photo, p in zip(photos, probabilities)]
  right = np.flatnonzero(np.array(served['class_index']) == labels)
  assert right.size
  for i in right:
    assert out.splitlines()[i].startswith('%s: %s ' % (photos[i],
                                                       NAMES[labels[i]]))

  (code, out, err), = run_all([saved_model_cli(), 'show', '--dir',
                                trained['export_dir'], '--all'])
  assert code == 0, err
  for line in ["MetaGraphDef with tag-set: 'serve' contains the following "
               "SignatureDefs:", "signature_def['serving_default']:",
               "    inputs['images'] tensor_info:\n        dtype: DT_UINT8\n"
               "        shape: (-1, 32, 32, 3)",
               "    outputs['class_index'] tensor_info:\n"
               "        dtype: DT_INT64\n        shape: (-1)",
               "    outputs['class_name'] tensor_info:\n"
               "        dtype: DT_STRING\n        shape: (-1)",
               "    outputs['probabilities'] tensor_info:\n"
               "        dtype: DT_FLOAT\n        shape: (-1, 10)",
               '  Method name is: tensorflow/serving/predict']:
    assert line in out, out


def mirrored(data_dir, into):
  """A copy of data_dir whose test records are mirrored left to right."""
  shutil.copytree(data_dir, into)
  records = np.fromfile(os.path.join(into, 'test_batch.bin'), np.uint8)
  records = records.reshape(-1, 3073)
  chw = records[:, 1:].reshape(-1, 3, 32, 32)[..., ::-1]
  np.concatenate([records[:, :1], chw.reshape(-1, 3072)], 1).tofile(
      os.path.join(into, 'test_batch.bin'))
  return into


@pytest.mark.slow
def test_eval_flips_averages_the_plain_models_logits_with_the_mirrors(
    trained, tiny_data, procs, tmp_path):
  """--eval_flips, in the evaluator and the export, against the plain
  evaluator's model run twice by hand: on the photos, and on their mirrors
  (a copy of the test file flipped in numpy). Its log-probabilities are
  the logits less a constant a photo: their mean ranks the classes as the
  logits' mean does."""
  photos = evaluator_probabilities(tiny_data, trained['checkpoint'], True)
  mirrors = evaluator_probabilities(mirrored(tiny_data, str(tmp_path / 'm')),
                                    trained['checkpoint'], True)
  mean = (np.log(photos) + np.log(mirrors)) / 2
  _, labels = read_records(tiny_data)
  plain = float(np.mean(np.argmax(photos, 1) == labels))
  flips = float(np.mean(np.argmax(mean, 1) == labels))
  # The mirrors change some answers: the photos tell the two apart.
  assert (np.argmax(mean, 1) != np.argmax(photos, 1)).any()
  procs.trainer('flips', '--job_name=evaluator', '--run_once',
                '--eval_flips', '--data_dir=' + tiny_data,
                '--train_dir=' + trained['train_dir'])
  assert procs.wait_all(timeout=300) == {'flips': 0}, procs.tails()
  log = procs.log('flips')
  # Beside the plain figure, never instead of it; evaluated again, though
  # the fixture's evaluator had this checkpoint's plain figure (its line in
  # eval/results.jsonl, which no other test of the fixture reads).
  assert ',Test accuracy = %.4f (50 examples)\n' % plain in log, log
  assert ': step %d, Test accuracy with flips averaged = %.4f (--eval_flips)' % (
      STEPS, flips) in log, log
  with open(os.path.join(trained['train_dir'], 'eval',
                         'results.jsonl')) as f:
    result = [json.loads(line) for line in f][-1]
  assert (result['accuracy'], result['accuracy_flips']) == (plain, flips)
  # The export, as an option: the softmax of the mean of the logits.
  export_dir = str(tmp_path / 'export')
  code, out, err = run(EXPORT, '--train_dir=' + trained['train_dir'],
                       '--export_dir=' + export_dir, '--eval_flips')
  assert (code, err) == (0, ''), err
  assert 'images uint8 [N,32,32,3], standardized, with their mirrors ->' in out
  images, _ = read_records(tiny_data)
  served = serve_in_plain_tf2(export_dir, images, tmp_path)
  expected = np.exp(mean) / np.exp(mean).sum(1, keepdims=True)
  np.testing.assert_allclose(served['probabilities'], expected, rtol=0,
                             atol=1e-5)


def colour(label, index):
  """The colour of image index of class label, 10 apart from any other."""
  return (60 * label + 10 * index, 90, 200 - 40 * label)


@pytest.mark.slow
def test_an_export_of_your_own_images_names_their_classes(procs, tmp_path):
  # Three classes of one-colour PNG and JPEG images of 40x30, converted by
  # make_cifar_binary, trained on raw pixels (--nostandardize) with
  # momentum, whose accumulators the export leaves out.
  names = ['apple', 'pear', 'plum']
  source = tmp_path / 'photos'
  for label, name in enumerate(names):
    os.makedirs(str(source / name))
    for i in range(4):
      Image.new('RGB', (40, 30), colour(label, i)).save(
          str(source / name / ('%d.%s' % (i, 'jpg' if i % 2 else 'png'))))
  data_dir, train_dir = str(tmp_path / 'data'), str(tmp_path / 'train')
  with open(os.devnull, 'w') as quiet:
    make_cifar_binary.convert(str(source), data_dir, test_fraction=0.25,
                              out=quiet)
  train(procs, 'train', data_dir, train_dir, '--max_steps=4',
        '--nostandardize', '--optimizer=momentum')
  with open(os.path.join(train_dir, 'export.json')) as f:
    assert json.load(f) == {'standardize': False, 'class_names': names}
  saved = tf.train.load_checkpoint(os.path.join(train_dir, 'model.ckpt-4'))
  assert len([n for n in saved.get_variable_to_shape_map()
              if n.endswith('/Momentum')]) == 12
  export_dir = str(tmp_path / 'export')
  code, out, err = run(EXPORT, '--train_dir=' + train_dir,
                       '--export_dir=' + export_dir)
  assert (code, err) == (0, '')
  assert out == exported_lines(os.path.join(train_dir, 'model.ckpt-4'),
                               export_dir, False, names)
  with open(os.path.join(export_dir, 'assets', 'class_names.txt')) as f:
    assert f.read() == 'apple\npear\nplum\n'
  exported = tf.train.load_checkpoint(os.path.join(export_dir, 'variables',
                                                   'variables'))
  assert not [n for n in exported.get_variable_to_shape_map()
              if 'Momentum' in n]
  images, _ = read_records(data_dir)
  probabilities = evaluator_probabilities(
      data_dir, os.path.join(train_dir, 'model.ckpt-4'), False)
  serve = tf.saved_model.load(export_dir).signatures['serving_default']
  answers = serve(images=tf.constant(images))
  np.testing.assert_allclose(answers['probabilities'].numpy(), probabilities,
                             rtol=0, atol=1e-6)
  assert [n.decode() for n in answers['class_name'].numpy()] == [
      names[i] for i in np.argmax(probabilities, 1)]
  # The photos are classified as the records the converter made of them:
  # those of their colours in the data files.
  photos = [str(source / 'pear' / '2.png'), str(source / 'plum' / '3.jpg')]
  records = np.concatenate([read_records(data_dir, n)[0] for n in sorted(
      os.listdir(data_dir)) if n.endswith('.bin')])
  found = records[[np.argmin(np.abs(records.reshape(-1, 1024, 3).mean(1) -
                                    colour(*c)).sum(1)) for c in [(1, 2),
                                                                  (2, 3)]]]
  code, out, err = run(CLASSIFY, '--model_dir=' + export_dir, *photos)
  assert (code, err) == (0, '')
  answers = serve(images=tf.constant(found))['probabilities'].numpy()
  assert out.splitlines() == [classified(photo, p, names)
                              for photo, p in zip(photos, answers)]


def test_nothing_to_export_or_classify_is_one_line(tmp_path):
  """The quick tier's: an empty --train_dir for the export, an empty
  --model_dir for the classifier: one line each, exit 2."""
  empty = str(tmp_path / 'empty')
  os.makedirs(empty)
  photo = str(tmp_path / 'photo.png')
  with open(photo, 'w') as f:
    f.write('not an image\n')
  results = run_all(
      [sys.executable, EXPORT, '--train_dir=' + empty,
       '--export_dir=' + str(tmp_path / 'export')],
      [sys.executable, CLASSIFY, '--model_dir=' + empty, photo])
  assert results == [(2, '', 'Error: %s\n' % line) for line in [
      'no readable checkpoint in %s: train first, or point --train_dir at '
      "the chief's" % empty,
      '--model_dir=%s is not a model exported by scripts/export_model.py (it '
      'has no saved_model.pb with a serving_default signature and '
      'assets/class_names.txt): pass the --export_dir it wrote' % empty]]


@pytest.mark.slow
def test_bad_inputs_are_one_line(trained, tmp_path):
  empty = str(tmp_path / 'empty')
  os.makedirs(empty)
  # A checkpoint of another model, with this one's record.
  other = str(tmp_path / 'other')
  with tf.Graph().as_default():
    tf1.get_variable('InceptionResnetV2/Logits/biases', [10])
    tf1.get_variable('dense/kernel', [4, 4])
    with tf1.Session() as sess:
      sess.run(tf1.global_variables_initializer())
      tf1.train.Saver().save(sess, os.path.join(other, 'model.ckpt-7'))
  shutil.copy(os.path.join(trained['train_dir'], 'export.json'), other)
  # A run of an earlier release: no export.json.
  earlier = str(tmp_path / 'earlier')
  shutil.copytree(trained['train_dir'], earlier)
  os.remove(os.path.join(earlier, 'export.json'))
  export = str(tmp_path / 'export')
  text = str(tmp_path / 'photo.png')
  with open(text, 'w') as f:
    f.write('not an image\n')
  results = run_all(*[[sys.executable] + c for c in [
      [EXPORT, '--train_dir=' + empty, '--export_dir=' + export],
      [EXPORT, '--train_dir=' + other, '--export_dir=' + export],
      [EXPORT, '--train_dir=' + earlier, '--export_dir=' + export],
      [EXPORT, '--train_dir=' + earlier, '--export_dir=' + trained[
          'train_dir']],
      [CLASSIFY, '--model_dir=' + trained['export_dir'], text],
      [CLASSIFY, '--model_dir=' + trained['train_dir'], text]]])
  assert results == [(2, '', 'Error: %s\n' % line) for line in [
      'no readable checkpoint in %s: train first, or point --train_dir at '
      "the chief's" % empty,
      '%s/model.ckpt-7 is a checkpoint of a different model '
      '(InceptionResnetV2/Conv2d_1a_3x3/weights: missing in the checkpoint, '
      '[3, 3, 3, 32] here): point --train_dir at a training run of this '
      'model' % other,
      '%s has no export.json (an earlier release trained it): pass '
      "--standardize (the trainer's default) or --nostandardize, as it "
      'trained, and --class_names=NAME,NAME,... in the order of its '
      "data's batches.meta.txt" % earlier,
      '--export_dir=%s already holds files: give a new folder (TF Serving '
      'reads numbered versions, EXPORT/1, EXPORT/2), or delete it first' %
      trained['train_dir'],
      '%s cannot be read as an image (cannot identify image file %r): give '
      'PNG or JPEG files' % (text, text),
      '--model_dir=%s is not a model exported by scripts/export_model.py '
      '(it has no saved_model.pb with a serving_default signature and '
      'assets/class_names.txt): pass the --export_dir it wrote' %
      trained['train_dir']]]
  assert not os.path.exists(export)
  # Given what the record would say, the earlier run exports.
  code, out, err = run(EXPORT, '--train_dir=' + earlier, '--export_dir=' +
                       export, '--standardize', '--class_names=' +
                       ','.join(NAMES))
  assert (code, err) == (0, '')
  assert out == exported_lines(os.path.join(earlier, 'model.ckpt-%d' % STEPS),
                               export, True, NAMES)


def test_the_docs_draw_the_readmes_two_photos(tmp_path):
  """docs/running.md's command draws what the README classifies: a 96x96
  PNG of a ring (hollow: black at its centre) and a 128x96 JPEG of a disc
  (white at its centre), white on black."""
  with open(os.path.join(ROOT, 'README.md')) as f:
    assert ' --model_dir=./export ring.png disc.jpg\n' in f.read()
  with open(os.path.join(ROOT, 'docs', 'running.md')) as f:
    [draw] = [line for line in f if line.startswith('python3 -c "from PIL')]
  done = subprocess.run([sys.executable] + shlex.split(draw)[1:],
                        cwd=str(tmp_path), capture_output=True, text=True,
                        timeout=60)
  assert (done.returncode, done.stderr) == (0, '')
  ring, disc = (Image.open(str(tmp_path / n)) for n in ('ring.png',
                                                        'disc.jpg'))
  assert (ring.format, ring.size, disc.format, disc.size) == (
      'PNG', (96, 96), 'JPEG', (128, 96))
  assert ring.getpixel((48, 48)) == (0, 0, 0)
  assert ring.getpixel((48, 26)) == (255, 255, 255)  # On the ring.
  assert min(disc.getpixel((64, 48))) > 240  # JPEG: near white.
  assert max(disc.getpixel((5, 5))) < 15
