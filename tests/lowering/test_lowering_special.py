import math

import pytest
import torch

from tests.reference import check

pytestmark = pytest.mark.usefixtures("lowered_only")

BESSEL = [torch.special.bessel_j0, torch.special.bessel_j1, torch.special.bessel_y0, torch.special.bessel_y1,
          torch.special.modified_bessel_k0, torch.special.modified_bessel_k1,
          torch.special.scaled_modified_bessel_k0, torch.special.scaled_modified_bessel_k1,
          torch.special.airy_ai]
EDGES = [0.0, -0.0, math.inf, -math.inf, math.nan, 1e-6, 2.0, 2.09, -2.09, 5.0, -5.0, 8.3203353, 103.892, 104.0,
         1e30, -1e30]


def arguments(dtype):
    """Every branch of the approximations: both sides of each cut-over, large |x| (where the phase of
    the asymptotic forms amplifies rounding), negatives, and the special values."""
    x = torch.cat([torch.linspace(-30, 30, 1201, dtype=torch.float64),
                   torch.logspace(-8, 6, 300, dtype=torch.float64),
                   -torch.logspace(-8, 6, 300, dtype=torch.float64),
                   torch.tensor(EDGES, dtype=torch.float64)])
    return x.to(dtype)


@pytest.mark.parametrize("fn", BESSEL, ids=lambda f: f.__name__)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_bessel_and_airy_match_cpu(fn, dtype):
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 1e-12, "atol": 1e-12}
    check(fn, arguments(dtype), **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_spherical_bessel_j0_at_extremes(dtype):
    # CPU: 0 at +-inf, a Taylor polynomial below 0.5, sin(x)/x beyond (large |x| included);
    # (not where sin(x)/x is subnormal in float32: XLA:CPU flushes those to zero)
    extremes = torch.tensor([1e20, -1e20, 4988429.2, 1e-30, -1e-38, 0.49999, 0.5, 1e300], dtype=torch.float64)
    x = torch.cat([arguments(torch.float64), extremes]).to(dtype)
    tol = {"rtol": 1e-6, "atol": 1e-7} if dtype == torch.float32 else {"rtol": 1e-13, "atol": 1e-15}
    check(torch.special.spherical_bessel_j0, x, **tol)


@pytest.mark.parametrize("fn", BESSEL, ids=lambda f: f.__name__)
def test_integer_arguments_promote_to_float(fn):
    check(fn, torch.arange(-6, 7), rtol=1e-5, atol=1e-5)


def test_out_and_views():
    x = arguments(torch.float32)[:200].reshape(20, 10).t()
    check(lambda x: torch.special.bessel_j0(x, out=torch.empty_like(x)), x)
    check(lambda x: torch.special.airy_ai(x[::2]), x)
