"""The synthetic KITTI generator writes the same data on every CPU.

numpy picks SIMD kernels by the CPU (its trigonometry, exp / log), OpenBLAS picks its
kernels by the CPU (``@``, norms), and glibc picks FMA variants of its math functions:
each can change the last bits of a float64 and, through a threshold or a float32
rounding, the data. The generator's geometry uses ``synthetic.exact`` instead. Here a
subprocess generates the same set with every numpy SIMD target switched off
(``NPY_DISABLE_CPU_FEATURES``), OpenBLAS on its oldest x86-64 kernels, glibc without
its AVX2 / FMA variants and OpenCV without its SIMD paths, and must produce the same
fingerprint; a pinned fingerprint
catches any change of the generated content.
"""
import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mmdet3d_scaling.datasets.synthetic import exact
from mmdet3d_scaling.datasets.synthetic.fingerprint import generate_and_fingerprint

REPO = Path(__file__).resolve().parents[2]
FRAMES, VAL_FRAMES, SEED = 3, 2, 0
# The content of generate_and_fingerprint(3, 0, 2): change only with a deliberate
# change of the generator, and say so in the CHANGELOG (demo figures move with it).
PINNED = {
    'points': '6bdc6881eac1dfad4299653921ef389708726d32720eaeca7d72e4b1514efd79',
    'labels': 'c78966c007476aba3818e7ef6c8571ca1715631fdfbe303e721c1ec2f1abf6eb',
    'calib': 'c717aa2e5f429bab65b49d25bde79cb961ba5beff7cdda86071d0d0d65b4d9ad',
    'images': '055030a720567e1eeebf7beaa1c630f1125ddce456083d6e1de28ff05a5df5cf',
    'infos': '1e957ce1e253ee9c11f3dd6b9cf58903f3974a6db3c5fec914d7751ae3fc94ec',
}


def _plain_cpu_env() -> dict:
    """Environment of a process that runs on the plainest kernels this CPU allows."""
    try:  # numpy 2
        from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__
    except ImportError:  # numpy 1
        from numpy.core._multiarray_umath import __cpu_dispatch__, __cpu_features__
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env['NPY_DISABLE_CPU_FEATURES'] = ' '.join(
        f for f in __cpu_dispatch__ if __cpu_features__.get(f))
    env['OPENBLAS_CORETYPE'] = 'Nehalem'
    env['GLIBC_TUNABLES'] = 'glibc.cpu.hwcaps=-AVX2,-FMA,-AVX512F'
    env['OPENCV_CPU_DISABLE'] = 'AVX2,FMA3,AVX,POPCNT,SSSE3'
    return env


def _in_plain_process(code: str) -> dict:
    done = subprocess.run([sys.executable, '-c', code], env=_plain_cpu_env(), cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_generated_set_is_pinned():
    result = generate_and_fingerprint(FRAMES, SEED, VAL_FRAMES)
    assert {k: result[k] for k in PINNED} == PINNED


@pytest.mark.slow
def test_plain_cpu_kernels_generate_the_same_set():
    here = generate_and_fingerprint(FRAMES, SEED, VAL_FRAMES)
    there = _in_plain_process(
        'import json; from mmdet3d_scaling.datasets.synthetic.fingerprint import '
        f'generate_and_fingerprint as g; print(json.dumps(g({FRAMES}, {SEED}, {VAL_FRAMES})))')
    assert there == here


_EXACT_CASES = '''
import hashlib, json
import numpy as np
from mmdet3d_scaling.datasets.synthetic import exact
x = np.linspace(-60.0, 60.0, 20001)
y = np.linspace(-3.0, 5.0, 20001)[::-1].copy()
v = np.stack([x, y, x * 0.5 - y], 1)
m = np.array([[0.0, -1.0, 0.0, 0.5], [0.0, 0.0, -1.0, -0.1], [1.0, 0.0, 0.0, -0.3],
              [0.0, 0.0, 0.0, 1.0]])
outputs = {'sincos': exact.sincos(x), 'arctan2': exact.arctan2(y, x),
           'exp': exact.exp(x / 10), 'log': exact.log(np.abs(x) + 0.5),
           'hypot': exact.hypot(x, y), 'norm': exact.norm(v, axis=1),
           'matmul': exact.matmul(np.c_[v, np.ones(len(v))], m.T),
           'rigid_inverse': exact.rigid_inverse(m)}
print(json.dumps({k: hashlib.sha256(np.asarray(o).tobytes()).hexdigest()
                  for k, o in outputs.items()}))
'''


@pytest.mark.slow
def test_exact_math_is_the_same_on_plain_cpu_kernels():
    namespace: dict = {}
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        exec(_EXACT_CASES, namespace)
    here = json.loads(buffer.getvalue())
    assert _in_plain_process(_EXACT_CASES) == here


def test_exact_math_agrees_with_numpy():
    rng = np.random.default_rng(0)
    x = rng.uniform(-100, 100, 10000)
    y = rng.normal(size=10000)
    s, c = exact.sincos(x)
    np.testing.assert_allclose(s, np.sin(x), rtol=0, atol=4e-16)
    np.testing.assert_allclose(c, np.cos(x), rtol=0, atol=4e-16)
    np.testing.assert_allclose(exact.arctan2(y, x), np.arctan2(y, x), rtol=0, atol=1e-15)
    assert exact.arctan2(0.0, 0.0) == 0.0 and exact.arctan2(0.0, -1.0) == np.pi
    np.testing.assert_allclose(exact.exp(x / 5), np.exp(x / 5), rtol=5e-16)
    np.testing.assert_allclose(exact.log(np.abs(x)), np.log(np.abs(x)), rtol=0, atol=1e-15)
    v = rng.normal(size=(100, 3))
    m = rng.normal(size=(3, 3))
    np.testing.assert_allclose(exact.norm(v, axis=1), np.linalg.norm(v, axis=1), rtol=1e-15)
    np.testing.assert_allclose(exact.matmul(v, m), v @ m, rtol=0, atol=1e-14)
    np.testing.assert_allclose(exact.matmul(m, v[0]), m @ v[0], rtol=0, atol=1e-14)
    np.testing.assert_allclose(exact.cross(v[0], v[1]), np.cross(v[0], v[1]), atol=1e-15)
    assert isinstance(exact.sin(0.5), float) and isinstance(exact.hypot(3.0, 4.0), float)


def test_exact_refuses_what_it_cannot_do():
    with pytest.raises(ValueError, match='log of a value <= 0'):
        exact.log(np.array([1.0, 0.0]))
    with pytest.raises(ValueError, match='not a rigid 4x4 transform'):
        exact.rigid_inverse(np.diag([2.0, 1.0, 1.0, 1.0]))
