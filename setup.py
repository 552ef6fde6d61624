"""mmdet3d-scaling: train mmdet3d detectors on one GPU or many, from stock tools.

Packaging the OpenMMLab way: the installed package carries the repository's
``configs/`` and ``tools/`` under ``mmdet3d_scaling/.mim/``, where mmengine resolves
``mmdet3d_scaling::<config>`` paths and ``mim train mmdet3d_scaling`` finds
``tools/train.py``:

- wheel / non-editable install: copied into the build tree by ``build_py``;
- sdist: copied into the release tree, so a wheel built from the sdist has them too;
- editable install (``pip install -e .``, ``setup.py develop``): relative symlinks
  ``mmdet3d_scaling/.mim/{configs,tools} -> ../../{configs,tools}`` in the checkout
  (git-ignored), so edits to a config are live.

``.mim/model-index.yml`` (a copy of the repository's ``model-index.yml``, which imports
``configs/<family>/metafile.yml``) is written in all three cases: ``mim search
mmdet3d_scaling`` lists the configs from it, and mmengine reads it before falling back to
``.mim/configs/<path>``.
"""
import os
import shutil
from pathlib import Path
from typing import Dict, List

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py
from setuptools.command.develop import develop
from setuptools.command.sdist import sdist

HERE = Path(__file__).resolve().parent
PACKAGE = 'mmdet3d_scaling'
MIM = HERE / PACKAGE / '.mim'
MIM_DIRS = ('configs', 'tools')
# Bootstrap scripts of a checkout: they install from / into the repository, which an
# installed package does not have.
CHECKOUT_ONLY_TOOLS = ('ensure_env.sh', 'run_tests.sh', 'quickstart.sh', 'check_install.sh')
MODEL_INDEX = 'model-index.yml'  # at the repository root; its paths are relative to .mim


def model_index() -> str:
    """The model index: the checkout's, else the one an unpacked sdist's ``.mim`` holds.

    Raises:
        FileNotFoundError: neither place has it (a broken source tree).
    """
    for candidate in (HERE / MODEL_INDEX, MIM / MODEL_INDEX):
        if candidate.is_file():
            return candidate.read_text()
    raise FileNotFoundError(
        f'{MODEL_INDEX} not found in {HERE} nor in {MIM}: build from a checkout of '
        'mmdet3d-scaling or from its sdist, which carry it.')


def read_version() -> str:
    namespace: dict = {}
    exec((HERE / PACKAGE / 'version.py').read_text(), namespace)
    return namespace['__version__']


def mim_sources() -> Dict[str, Path]:
    """Where ``configs/`` and ``tools/`` come from: the checkout, else an unpacked sdist.

    Raises:
        FileNotFoundError: neither place has one of them (a broken source tree).
    """
    sources = {}
    for name in MIM_DIRS:
        for candidate in (HERE / name, MIM / name):
            if candidate.is_dir():
                sources[name] = candidate
                break
        else:
            raise FileNotFoundError(
                f'{name}/ not found in {HERE} nor in {MIM}: build from a checkout of '
                'mmdet3d-scaling or from its sdist, which carry it.')
    return sources


def _ignore_under(root: Path):
    """``shutil.copytree`` filter: caches anywhere, checkout-only scripts at ``root``."""

    def ignore(directory: str, names: List[str]) -> List[str]:
        skipped = [n for n in names if n == '__pycache__' or n.endswith(('.pyc', '.pyo'))]
        if Path(directory) == root and root.name == 'tools':
            skipped += [n for n in names if n in CHECKOUT_ONLY_TOOLS]
        return skipped

    return ignore


def copy_mim(package_dir: Path) -> None:
    """Write ``<package_dir>/.mim/{configs,tools,model-index.yml}`` as plain files.

    Only ever called on a build or release tree, never on the checkout: stale copies
    from an earlier build there are replaced.
    """
    target = package_dir / '.mim'
    target.mkdir(parents=True, exist_ok=True)
    for name, source in mim_sources().items():
        dest = target / name
        if dest.resolve() == source.resolve():
            continue  # building from an unpacked sdist in place: already there
        if dest.is_symlink() or dest.is_file():
            dest.unlink()
        elif dest.is_dir():
            shutil.rmtree(dest)
        shutil.copytree(source, dest, ignore=_ignore_under(source))
    (target / MODEL_INDEX).write_text(model_index())


def link_mim() -> None:
    """Editable install: ``mmdet3d_scaling/.mim/<dir>`` -> ``../../<dir>`` in the checkout.

    Raises:
        FileExistsError: ``.mim/<dir>`` is a real folder (not made by this setup.py):
            it is left alone and the install stops, naming it.
    """
    MIM.mkdir(exist_ok=True)
    for name in MIM_DIRS:
        source, link = HERE / name, MIM / name
        if not source.is_dir():
            continue  # an unpacked sdist: .mim already holds real copies
        target = os.path.relpath(source, MIM)
        if link.is_symlink():
            if os.readlink(link) == target:
                continue
            link.unlink()
        elif link.exists():
            raise FileExistsError(
                f'{link} is a real {"folder" if link.is_dir() else "file"}, not the '
                f'symlink to {source} an editable install needs; move it away and '
                'install again.')
        link.symlink_to(target, target_is_directory=True)
    (MIM / MODEL_INDEX).write_text(model_index())


class BuildPyWithMim(build_py):
    """``build_py`` that also ships ``.mim`` (symlinks when building an editable wheel)."""

    def run(self) -> None:
        super().run()
        if getattr(self, 'editable_mode', False):
            link_mim()
        else:
            copy_mim(Path(self.build_lib) / PACKAGE)


class DevelopWithMim(develop):
    """Legacy ``setup.py develop`` (pip's editable install without pyproject.toml)."""

    def run(self) -> None:
        if not self.uninstall:
            link_mim()
        super().run()


class SdistWithMim(sdist):
    """``sdist`` whose release tree holds ``mmdet3d_scaling/.mim`` as plain files."""

    def make_release_tree(self, base_dir: str, files: List[str]) -> None:
        super().make_release_tree(base_dir, files)
        copy_mim(Path(base_dir) / PACKAGE)


setup(
    name='mmdet3d-scaling',
    version=read_version(),
    description='Scaling plugin for mmdetection3d 1.4: gradient accumulation, AMP, '
    'auto batch size, GPU monitoring, multi-GPU recipes, BEVFusion without torchpack.',
    long_description=(HERE / 'README.md').read_text(encoding='utf-8'),
    long_description_content_type='text/markdown',
    license='Apache License 2.0',
    classifiers=[
        'License :: OSI Approved :: Apache Software License',
        'Programming Language :: Python :: 3',
        'Operating System :: POSIX :: Linux',
        'Topic :: Scientific/Engineering :: Artificial Intelligence',
    ],
    packages=find_packages(include=[PACKAGE, f'{PACKAGE}.*']),
    cmdclass={'build_py': BuildPyWithMim, 'develop': DevelopWithMim,
              'sdist': SdistWithMim},
    python_requires='>=3.9',
    # torch and mmcv (with compiled ops) are the user's: their CUDA build decides them.
    install_requires=[
        'mmengine>=0.10.0,<0.11',
        'mmcv>=2.0.0rc4,<2.2.0',
        'mmdet>=3.0.0,<3.4.0',
        'mmdet3d==1.4.0',
        'numpy',
        'nvidia-ml-py',
        'packaging',  # patch version ranges (patches/patching.py)
        'tqdm',
    ],
    extras_require={
        # spconv flavours: the CPU package, or the one matching the user's CUDA.
        'spconv': ['spconv>=2.3'],
        'spconv-cu113': ['spconv-cu113>=2.3'],
        'spconv-cu118': ['spconv-cu118>=2.3'],
        'spconv-cu120': ['spconv-cu120>=2.3'],
        'spconv-cu121': ['spconv-cu121>=2.3'],
        'spconv-cu124': ['spconv-cu124>=2.3'],
        'spconv-cu126': ['spconv-cu126>=2.3'],  # measured on the H200 (torch 2.11 + CUDA 13)
        'tests': ['pytest>=8', 'matplotlib', 'build'],
    },
)
