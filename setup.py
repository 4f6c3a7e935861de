"""Only what pyproject.toml cannot say: install `specresearch-lm-eval.pth` beside the package, so the
plain `lm_eval --model specresearch` command finds our model (see specresearch/evaluation/plugin.py)."""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel

PTH = Path(__file__).resolve().parent / "specresearch-lm-eval.pth"


class BuildPy(build_py):
    """Regular installs: the .pth goes into the wheel's root (site-packages)."""

    def run(self):
        super().run()
        self.copy_file(str(PTH), str(Path(self.build_lib) / PTH.name))

    def get_outputs(self, include_bytecode=1):
        return super().get_outputs(include_bytecode) + [str(Path(self.build_lib) / PTH.name)]


class EditableWheel(editable_wheel):
    """`pip install -e .`: setuptools writes the editable wheel's extra root files (its namespace
    .pth files) in `_install_namespaces`; ours joins them there."""

    def _install_namespaces(self, installation_dir, pth_prefix):
        super()._install_namespaces(installation_dir, pth_prefix)
        (Path(installation_dir) / PTH.name).write_text(PTH.read_text())


setup(cmdclass={"build_py": BuildPy, "editable_wheel": EditableWheel})
