"""Float64 math that gives the same bits on every CPU, for the synthetic generators.

numpy picks its kernels by the CPU it runs on: ``sin``, ``cos``, ``arctan2``, ``exp``,
``log`` have AVX-512 versions, and ``@``, ``linalg.norm`` of a vector, ``linalg.inv`` and
``cross`` go to BLAS / LAPACK, whose kernels (OpenBLAS picks one per CPU) sum in other
orders. Their results differ in the last bits between machines, and a last bit can
flip a threshold (a point kept or dropped) or a float32 rounding of the data.

Here every function uses only IEEE-754 operations that are correctly rounded on every
CPU (``+ - * /`` and ``sqrt`` as separate numpy ufuncs, so nothing can be fused into an
FMA), in a fixed order: range reduction, then a fixed number of series terms. Accuracy
is a few units in the last place, plenty for synthetic data; the point is that it is
the same everywhere.
"""
import math
from typing import Tuple, Union

import numpy as np

ArrayLike = Union[float, np.ndarray]

PI = 3.141592653589793          # float64 nearest to pi
HALF_PI = 1.5707963267948966
# pi/2 as the sum of three parts; the first has 33 significant bits, so k * part is
# exact for |k| < 2**20 (Cody-Waite reduction)
_HALF_PI_1 = 1.5707963267341256   # 33 significant bits
_HALF_PI_2 = 6.077100506506192e-11
_HALF_PI_3 = 2.0222662487959506e-21
LN2 = 0.6931471805599453
_LN2_HI = 0.6931471803691238      # 32 significant bits: k * _LN2_HI is exact
_LN2_LO = 1.9082149292705877e-10
_TAN_PI_8 = 0.41421356237309503


def _f64(x: ArrayLike) -> np.ndarray:
    return np.asarray(x, np.float64)


def _like(value: np.ndarray, *inputs: ArrayLike) -> ArrayLike:
    """A Python float when every input was a scalar, else the array."""
    return float(value) if all(np.ndim(i) == 0 for i in inputs) else value


def _horner(x: np.ndarray, coefficients: Tuple[float, ...]) -> np.ndarray:
    """sum(c_i x^i) with ``coefficients`` highest power first, one ufunc at a time."""
    result = np.full_like(x, coefficients[0])
    for c in coefficients[1:]:
        result = result * x
        result = result + c
    return result


def _series(terms) -> Tuple[float, ...]:
    """Coefficients lowest power first -> highest first, for :func:`_horner`."""
    return tuple(reversed([float(c) for c in terms]))


# sin(r) / r and cos(r) in r^2 for |r| <= pi/4 (Taylor to r^23 / r^22: error < 1e-24);
# 1 / k! by Python's correctly rounded int / int division, the same everywhere
_SIN = _series((-1) ** n / math.factorial(2 * n + 1) for n in range(12))
_COS = _series((-1) ** n / math.factorial(2 * n) for n in range(12))
# e^r for |r| <= ln2 / 2, to r^20 (error < 1e-27)
_EXP = _series(1 / math.factorial(n) for n in range(21))
# atan(t) / t in t^2 for |t| <= tan(pi/8), 24 terms (error < 1e-19)
_ATAN = _series((-1) ** n / (2 * n + 1) for n in range(24))
# log(m) = 2 atanh(s) = s * sum 2 s^2n / (2n + 1), |s| <= 0.1716, 14 terms
_ATANH2 = _series(2 / (2 * n + 1) for n in range(14))


def sincos(x: ArrayLike) -> Tuple[ArrayLike, ArrayLike]:
    """(sin x, cos x), the same bits on every CPU, for |x| < 1e5."""
    x64 = _f64(x)
    k = np.rint(x64 / HALF_PI)
    r = x64 - k * _HALF_PI_1
    r = r - k * _HALF_PI_2
    r = r - k * _HALF_PI_3
    r2 = r * r
    s = _horner(r2, _SIN) * r
    c = _horner(r2, _COS)
    quadrant = np.mod(k, 4).astype(np.int64)
    sin = np.choose(quadrant, [s, c, -s, -c])
    cos = np.choose(quadrant, [c, -s, -c, s])
    return _like(sin, x), _like(cos, x)


def sin(x: ArrayLike) -> ArrayLike:
    return sincos(x)[0]


def cos(x: ArrayLike) -> ArrayLike:
    return sincos(x)[1]


def arctan2(y: ArrayLike, x: ArrayLike) -> ArrayLike:
    """atan2(y, x) in [-pi, pi], the same bits on every CPU (0 at the origin)."""
    y64, x64 = np.broadcast_arrays(_f64(y), _f64(x))
    ay, ax = np.abs(y64), np.abs(x64)
    big, small = np.maximum(ay, ax), np.minimum(ay, ax)
    t = np.divide(small, big, out=np.zeros_like(big), where=big > 0)  # in [0, 1]
    reduce = t > _TAN_PI_8
    t = np.where(reduce, (t - 1.0) / (t + 1.0), t)
    angle = _horner(t * t, _ATAN) * t
    angle = np.where(reduce, angle + PI / 4, angle)
    angle = np.where(ay > ax, HALF_PI - angle, angle)
    angle = np.where(x64 < 0, PI - angle, angle)
    angle = np.where(y64 < 0, -angle, angle)
    return _like(angle, y, x)


def exp(x: ArrayLike) -> ArrayLike:
    """e^x, the same bits on every CPU, for |x| < 700."""
    x64 = _f64(x)
    k = np.rint(x64 / LN2)
    r = x64 - k * _LN2_HI
    r = r - k * _LN2_LO                              # |r| <= ln2 / 2
    return _like(np.ldexp(_horner(r, _EXP), k.astype(np.int64)), x)


def log(x: ArrayLike) -> ArrayLike:
    """Natural logarithm of x > 0, the same bits on every CPU."""
    x64 = _f64(x)
    if np.any(~(x64 > 0)):
        raise ValueError(f'log of a value <= 0 or nan: {x!r}')
    m, e = np.frexp(x64)                             # x = m 2^e, m in [0.5, 1)
    low = m < 0.7071067811865476
    m = np.where(low, m * 2.0, m)                    # m in [sqrt(1/2), sqrt(2))
    e = np.where(low, e - 1, e).astype(np.float64)
    s = (m - 1.0) / (m + 1.0)
    series = _horner(s * s, _ATANH2) * s
    return _like(e * _LN2_HI + (e * _LN2_LO + series), x)


def hypot(x: ArrayLike, y: ArrayLike) -> ArrayLike:
    """sqrt(x^2 + y^2) in one fixed order (no overflow care needed for metres)."""
    x64, y64 = _f64(x), _f64(y)
    return _like(np.sqrt(x64 * x64 + y64 * y64), x, y)


def norm(v: np.ndarray, axis: int = -1) -> ArrayLike:
    """Euclidean norm along ``axis``, summing the squares left to right."""
    v64 = _f64(v)
    parts = np.moveaxis(v64, axis, 0)
    total = parts[0] * parts[0]
    for part in parts[1:]:
        total = total + part * part
    return _like(np.sqrt(total), total)


def dot(a: np.ndarray, b: np.ndarray) -> ArrayLike:
    """Sum over the last axis of a * b, left to right (vectors or stacks of them)."""
    a64, b64 = np.broadcast_arrays(_f64(a), _f64(b))
    total = a64[..., 0] * b64[..., 0]
    for i in range(1, a64.shape[-1]):
        total = total + a64[..., i] * b64[..., i]
    return _like(total, total)


def matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` for small matrices / a stack of row vectors times a matrix, summing
    each product left to right instead of in BLAS's order."""
    a64, b64 = _f64(a), _f64(b)
    if b64.ndim == 1:
        return dot(a64, b64[None, :] if a64.ndim > 1 else b64)
    columns = [dot(a64, b64[:, j] if a64.ndim > 1 else b64[:, j]) for j in range(b64.shape[1])]
    return np.stack(columns, axis=-1)


def cross(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cross product of 3-vectors."""
    a64, b64 = _f64(a), _f64(b)
    return np.array([a64[1] * b64[2] - a64[2] * b64[1],
                     a64[2] * b64[0] - a64[0] * b64[2],
                     a64[0] * b64[1] - a64[1] * b64[0]])


def rigid_inverse(m: np.ndarray) -> np.ndarray:
    """Inverse of a 4x4 rigid transform [R t; 0 1] as [R^T -R^T t; 0 1] (no LAPACK).

    Raises:
        ValueError: ``m`` is not a rotation plus a translation (to 1e-6).
    """
    m64 = _f64(m)
    rotation = m64[:3, :3]
    if m64.shape != (4, 4) or np.abs(matmul(rotation.T, rotation) - np.eye(3)).max() > 1e-6 \
            or np.abs(m64[3] - [0, 0, 0, 1]).max() > 1e-12:
        raise ValueError(f'not a rigid 4x4 transform: {m!r}')
    out = np.eye(4)
    out[:3, :3] = rotation.T
    out[:3, 3] = -matmul(rotation.T, m64[:3, 3])
    return out
