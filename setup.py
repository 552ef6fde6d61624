"""mmdet3d-scaling: train mmdet3d detectors on one GPU or many, from stock tools."""
from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).parent


def read_version() -> str:
    namespace: dict = {}
    exec((HERE / 'mmdet3d_scaling' / 'version.py').read_text(), namespace)
    return namespace['__version__']


setup(
    name='mmdet3d-scaling',
    version=read_version(),
    description='Scaling plugin for mmdetection3d 1.4: gradient accumulation, AMP, '
    'auto batch size, GPU monitoring, multi-GPU recipes, BEVFusion without torchpack.',
    long_description=(HERE / 'README.md').read_text(encoding='utf-8'),
    long_description_content_type='text/markdown',
    packages=find_packages(include=['mmdet3d_scaling', 'mmdet3d_scaling.*']),
    python_requires='>=3.9',
    # torch and mmcv (with compiled ops) are the user's: their CUDA build decides them.
    install_requires=[
        'mmengine>=0.10.0,<0.11',
        'mmcv>=2.0.0rc4,<2.2.0',
        'mmdet>=3.0.0,<3.4.0',
        'mmdet3d==1.4.0',
        'numpy',
        'nvidia-ml-py',
        'tqdm',
    ],
    extras_require={
        # spconv flavours: the CPU package, or the one matching the user's CUDA.
        'spconv': ['spconv>=2.3'],
        'spconv-cu113': ['spconv-cu113>=2.3'],
        'spconv-cu118': ['spconv-cu118>=2.3'],
        'spconv-cu120': ['spconv-cu120>=2.3'],
        'tests': ['pytest>=8', 'matplotlib'],
    },
)
