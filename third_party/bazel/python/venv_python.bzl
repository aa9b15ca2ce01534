"""A repository rule that registers the project's venv Python as Bazel's Python toolchain.

The interpreter is `$SEEDACME_PYTHON` if set (also settable with
`--repo_env=SEEDACME_PYTHON=/path/to/python`), else `<workspace>/.venv/bin/python`
(created by scripts/setup). The path is used as given, not resolved: a venv's
`bin/python` is a symlink, and Python finds the venv's site-packages only through it.

Why a toolchain: `--python_path` is silently ignored while Python toolchains are on (the
default), and Bazel would then pick whatever `python3` is on PATH. `stub_shebang` makes the
generated launcher start with the venv Python instead of `#!/usr/bin/env python`.
"""

_ENV_VAR = "SEEDACME_PYTHON"

_CHECK = """\
import sys
print(sys.version.split()[0])
sys.exit(0 if sys.version_info >= (3, 8) else 1)
"""

_BUILD = """\
load("@bazel_tools//tools/python:toolchain.bzl", "py_runtime_pair")

package(default_visibility = ["//visibility:public"])

# {version}
py_runtime(
    name = "py3_runtime",
    interpreter_path = "{python}",
    python_version = "PY3",
    stub_shebang = "#!{python}",
)

py_runtime_pair(
    name = "runtime_pair",
    py3_runtime = ":py3_runtime",
)

toolchain(
    name = "toolchain",
    toolchain = ":runtime_pair",
    toolchain_type = "@bazel_tools//tools/python:toolchain_type",
)
"""

def _venv_python_impl(rctx):
    python = rctx.os.environ.get(_ENV_VAR, "")
    if python:
        source = "$%s" % _ENV_VAR
    else:
        workspace_root = rctx.path(Label("@//:WORKSPACE")).dirname
        python = "%s/.venv/bin/python" % workspace_root
        source = "the default (%s unset)" % _ENV_VAR
    if not python.startswith("/"):
        fail("seedacme: %s=%r must be an absolute path to a Python interpreter." %
             (_ENV_VAR, python))
    if not rctx.path(python).exists:
        fail(("seedacme: no Python interpreter at %s, from %s. Create the venv with " +
              "scripts/setup, or point %s (or --repo_env=%s=...) at a Python 3.10 " +
              "interpreter that has the project's requirements.") %
             (python, source, _ENV_VAR, _ENV_VAR))
    result = rctx.execute([python, "-c", _CHECK])
    if result.return_code != 0:
        fail("seedacme: %s (from %s) is not a working Python >= 3.8: %s%s" %
             (python, source, result.stdout, result.stderr))
    rctx.file("WORKSPACE", 'workspace(name = "%s")\n' % rctx.name)
    rctx.file("BUILD", _BUILD.format(
        python = python,
        version = "Python %s from %s" % (result.stdout.strip(), source),
    ))

venv_python = repository_rule(
    implementation = _venv_python_impl,
    environ = [_ENV_VAR],
    local = True,
    doc = "Declares a Python toolchain for the venv interpreter (see the docstring above).",
)
