import pytest
import torch

from tests.reference import check

pytestmark = pytest.mark.usefixtures("no_fallback")

FLOATS = [torch.float32, torch.float64]


def _tol(dtype):
    return {"rtol": 1e-4, "atol": 1e-4} if dtype in (torch.float32, torch.complex64) else {}


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("norm", [None, "ortho", "forward"])
def test_fft_1d(dtype, norm):
    x = torch.randn(3, 8, dtype=dtype)
    z = torch.randn(3, 8, dtype=dtype) + 1j * torch.randn(3, 8, dtype=dtype)
    tol = _tol(dtype)
    check(lambda t: torch.fft.fft(t, norm=norm), x, grad=True, **tol)  # real input: r2c
    check(lambda t: torch.fft.fft(t, n=5, dim=0, norm=norm), x, grad=True, **tol)  # trimmed
    check(lambda t: torch.fft.fft(t, n=11, norm=norm), x, grad=True, **tol)  # padded
    for fn in (torch.fft.fft, torch.fft.ifft):
        check(fn, z, norm=norm, **tol)  # complex input: c2c
        check(fn, z, n=5, dim=0, norm=norm, **tol)
    check(lambda t: torch.fft.rfft(t, norm=norm), x, grad=True, **tol)
    check(lambda t: torch.fft.rfft(t, n=7, dim=0, norm=norm), x, grad=True, **tol)
    for n in (None, 8, 9):  # even, odd output sizes
        check(torch.fft.irfft, z, n=n, norm=norm, **tol)


@pytest.mark.parametrize("dtype", FLOATS)
def test_fft_nd(dtype):
    x = torch.randn(2, 4, 6, dtype=dtype)
    z = torch.randn(2, 4, 6, dtype=dtype) * (1 + 1j)
    tol = _tol(dtype)
    check(torch.fft.fft2, x, grad=True, **tol)
    check(torch.fft.ifft2, z, **tol)
    check(lambda t: torch.fft.fftn(t, norm="ortho"), x, grad=True, **tol)
    check(lambda t: torch.fft.fftn(t, s=(3, 5), dim=(2, 0)), x, grad=True, **tol)
    check(lambda t: torch.fft.ifftn(t, dim=(0, 2)), z, **tol)
    check(torch.fft.rfft2, x, grad=True, **tol)
    check(lambda t: torch.fft.rfftn(t, norm="forward"), x, grad=True, **tol)
    check(lambda t: torch.fft.irfftn(t, s=(4, 9)), z, **tol)
    check(torch.fft.irfft2, z, **tol)


@pytest.mark.parametrize("dtype", FLOATS)
def test_fft_complex_grads(dtype):
    # gradients through c2c and c2r, reached from a real leaf
    x = torch.randn(4, 6, dtype=dtype)
    tol = _tol(dtype)
    check(lambda t: torch.fft.ifft(torch.fft.fft(t) * 2).real, x, grad=True, **tol)
    check(lambda t: torch.fft.irfft(torch.fft.rfft(t) * 3, n=6), x, grad=True, **tol)
    check(lambda t: torch.fft.irfftn(torch.fft.fftn(t), s=(4, 7)).sin(), x, grad=True, **tol)


def test_fft_helpers_and_out():
    x = torch.randn(4, 6)
    check(lambda t: torch.fft.fftshift(torch.fft.fft2(t)), x, rtol=1e-4, atol=1e-4)
    check(lambda t: torch.fft.fft(t, out=torch.empty(0, dtype=torch.complex64, device=t.device)), x,
          rtol=1e-4, atol=1e-4)
    check(lambda t: torch.stft(t, 4, center=False, return_complex=True, window=torch.ones(4, device=t.device)), x[0],
          rtol=1e-4, atol=1e-4)


# hfft / ihfft conjugate their input / output with a conj *view* (the conj bit): copies resolve it.
def test_hfft_ihfft_conj_views():
    x = torch.randn(3, 8)
    check(torch.fft.ihfft, x, rtol=1e-4, atol=1e-4)


def test_ifft_of_real_input_conj_view():
    check(torch.fft.ifft, torch.randn(3, 8), rtol=1e-4, atol=1e-4)  # conj(r2c(x)) as a conj view
