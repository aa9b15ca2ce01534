"""A launcher builds every agent's program without importing TensorFlow (seedacme.lazy).

The launcher's TF import (5 s here quiet, 10-12 s at load 3) came before any node
started; the nodes that need TF import it themselves. Each case runs in a fresh
interpreter, since this test process may have imported TF already.
"""

import subprocess
import sys
import textwrap

import pytest

from seedacme import lazy

_BUILD = textwrap.dedent('''
    import os, sys
    os.environ['CUDA_VISIBLE_DEVICES'] = ''
    import launchpad as lp
    from seedacme.launchers import local, program_flags
    from seedacme.nodes import program as program_lib
    args = local.parse_args(sys.argv[1:])
    factory, spec, builder, config = program_flags.make_program_inputs(args, sys.argv[-1])
    program_lib.make_program(builder, factory, spec, config, stop_program=lambda: None)
    print(sorted(m for m in ('tensorflow', 'sonnet', 'reverb') if m in sys.modules))
''')


@pytest.mark.timeout(120)
@pytest.mark.parametrize('argv', [['catch', 'vtrace', '2'], ['catch', 'r2d2', '2'],
                                  ['cartpole', 'ppo', '2'],
                                  ['mujoco', 'sac', '2', '--level', 'InvertedPendulum-v5']])
def test_the_launcher_builds_the_program_without_tensorflow(argv, tmp_path):
  out = subprocess.run([sys.executable, '-c', _BUILD, *argv, '--logdir', str(tmp_path)],
                       capture_output=True, text=True, timeout=100, check=False)
  assert out.returncode == 0, out.stderr[-3000:]
  assert out.stdout.strip().splitlines()[-1] == '[]', (argv, out.stdout[-500:])


def test_a_lazy_module_imports_at_its_first_attribute_read():
  module = lazy.load('json')  # a real module: the attribute comes from it
  assert 'not imported yet' in repr(module)
  assert module.dumps([1]) == '[1]'
  assert repr(module) == "<lazy module 'json', imported>"
  missing = lazy.load('seedacme.no_such_module_here')
  # Probes for dunders (copy, pickle, inspect) do not import; a real read does.
  assert getattr(missing, '__wrapped__', None) is None
  with pytest.raises(ModuleNotFoundError):
    _ = missing.anything
