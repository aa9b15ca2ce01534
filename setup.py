"""seedacme: SEED RL's central-inference architecture on Acme, Reverb and Launchpad.

Installs ONE top-level name, `seedacme`. The repository's top-level `agents/`, `envs/`
and `launchers/` become `seedacme.agents`, `seedacme.envs`, `seedacme.launchers`
(setuptools `package_dir`), so no generic names land in site-packages.
"""

import setuptools

_MAPPED = {'seedacme.agents': 'agents', 'seedacme.envs': 'envs',
           'seedacme.launchers': 'launchers'}


def _packages():
  packages = ['seedacme'] + [f'seedacme.{p}' for p in setuptools.find_packages('seedacme')]
  for name, directory in _MAPPED.items():
    packages.append(name)
    packages += [f'{name}.{p}' for p in setuptools.find_packages(directory)]
  return packages


def _requirements():
  with open('requirements/base.in') as f:
    lines = [line.split('#')[0].strip() for line in f]
  tooling = ('pytest', 'pytest-timeout', 'ruff')
  return [line for line in lines if line and not line.startswith(tooling)]


setuptools.setup(
    name='seedacme',
    version='0.1.0',
    description=__doc__.splitlines()[0],
    python_requires='>=3.10,<3.11',
    packages=_packages(),
    package_dir={'seedacme': 'seedacme', **_MAPPED},
    install_requires=_requirements(),
    extras_require={'test': ['pytest', 'pytest-timeout', 'ruff']},
    entry_points={'console_scripts': ['run_local=seedacme.launchers.local:run']},
)
