"""Matrix decompositions and solvers against CPU, values and gradients.

Where PyTorch's result is not unique (signs of singular vectors, eigenvectors, Q's columns) the
tests compare what is unique, as PyTorch's OpInfos do: reconstructions and sign-free functions
of the factors. (On CPU JAX calls the same LAPACK routines as PyTorch, so the raw factors agree
too and are checked as well; another backend may choose other signs.)
"""
import pytest
import torch

from tests.reference import check

pytestmark = pytest.mark.usefixtures("no_fallback")

FLOATS = [torch.float32, torch.float64]


def _tol(dtype):
    return {"rtol": 1e-4, "atol": 1e-4} if dtype == torch.float32 else {}


def _grad(dtype):
    """Gradients too, for float64 only: each backward compiles a dozen more ops."""
    return {**_tol(dtype), "grad": dtype == torch.float64}


def _spd(*shape, dtype):
    a = torch.randn(*shape, dtype=dtype)
    return a @ a.mT + shape[-1] * torch.eye(shape[-1], dtype=dtype)


def _wellcond(*shape, dtype):
    return torch.randn(*shape, dtype=dtype) + shape[-1] * torch.eye(shape[-1], dtype=dtype)


def _qr_product(a, mode):
    q, r = torch.linalg.qr(a, mode=mode)
    return q @ r


def _svd_product(a):
    u, s, vh = torch.linalg.svd(a, full_matrices=False)
    return (u * s[..., None, :]) @ vh


def _eigh_product(h):
    w, v = torch.linalg.eigh(h)
    return (v * w[..., None, :]) @ v.mT


def _eig_product(a):
    w, v = torch.linalg.eig(a)
    return (v * w[..., None, :]) @ torch.linalg.inv(v)


def _lu_solve(lu, b, piv, left, adjoint):
    return torch.linalg.lu_solve(lu, piv.to(lu.device), b, left=left, adjoint=adjoint)


@pytest.mark.parametrize("dtype", FLOATS)
def test_cholesky_family(dtype):
    tol = _tol(dtype)
    A = _spd(2, 4, 4, dtype=dtype)
    check(torch.linalg.cholesky, A, **_grad(dtype))
    check(torch.linalg.cholesky_ex, A, upper=True, **tol)
    check(torch.cholesky, A, **tol)
    L = torch.linalg.cholesky(A)
    check(torch.cholesky_inverse, L, **_grad(dtype))
    check(torch.cholesky_inverse, L.mT.contiguous(), upper=True, **tol)
    B = torch.randn(4, 3, dtype=dtype)
    check(torch.cholesky_solve, B, L, **_grad(dtype))  # broadcast batch
    check(torch.cholesky_solve, B, L.mT.contiguous(), upper=True, **tol)


def test_cholesky_ex_info_not_positive_definite():
    A = torch.diag(torch.tensor([2.0, 1.0, -1.0, 3.0]))
    bad = torch.stack([torch.eye(4), A])
    info_cpu = torch.linalg.cholesky_ex(bad).info
    info_dev = torch.linalg.cholesky_ex(bad.to("neuron")).info
    assert info_dev.dtype == torch.int32 and info_dev.cpu().tolist() == info_cpu.tolist() == [0, 3]
    with pytest.raises(torch.linalg.LinAlgError, match="order 3"):
        torch.linalg.cholesky(A.to("neuron"))


@pytest.mark.parametrize("dtype", FLOATS)
def test_solve_triangular(dtype):
    tol = _tol(dtype)
    A = _wellcond(2, 4, 4, dtype=dtype)  # the other triangle holds values that must be ignored
    B = torch.randn(2, 4, 3, dtype=dtype)
    check(torch.linalg.solve_triangular, A, B, upper=True, **_grad(dtype))
    check(torch.linalg.solve_triangular, A, B, upper=False, unitriangular=True, **_grad(dtype))
    check(torch.linalg.solve_triangular, A, B.mT, upper=False, left=False, **tol)
    check(torch.triangular_solve, B, A, transpose=True, **tol)


@pytest.mark.parametrize("dtype", FLOATS)
def test_lu_family(dtype):
    tol = _tol(dtype)
    A = torch.randn(2, 4, 4, dtype=dtype)
    check(torch.linalg.lu_factor_ex, A, **tol)
    check(torch.linalg.lu, A, **_grad(dtype))
    check(torch.linalg.lu, torch.randn(5, 3, dtype=dtype), **tol)  # tall
    check(torch.linalg.lu, torch.randn(3, 5, dtype=dtype), **tol)  # wide
    LU, piv = torch.linalg.lu_factor(A)
    check(torch.lu_unpack, LU, piv, **_grad(dtype))
    check(torch.lu_unpack, LU, piv, unpack_pivots=False, **tol)
    check(torch.lu_unpack, LU, piv, unpack_data=False, **tol)
    B = torch.randn(2, 4, 3, dtype=dtype)
    check(_lu_solve, LU, B, piv=piv, left=True, adjoint=False, **_grad(dtype))
    check(_lu_solve, LU, B, piv=piv, left=True, adjoint=True, **tol)
    check(_lu_solve, LU, B.mT, piv=piv, left=False, adjoint=False, **tol)
    check(_lu_solve, LU, B.mT, piv=piv, left=False, adjoint=True, **tol)


@pytest.mark.parametrize("dtype", FLOATS)
def test_solve_inv_det(dtype):
    tol = _tol(dtype)
    A = _wellcond(2, 4, 4, dtype=dtype)
    check(torch.linalg.solve, A, torch.randn(2, 4, 3, dtype=dtype), **_grad(dtype))
    check(torch.linalg.solve, A, torch.randn(2, 4, dtype=dtype), **tol)  # vector rhs
    check(torch.linalg.solve, A[0], torch.randn(3, 4, 2, dtype=dtype), **tol)  # broadcast batch
    check(torch.linalg.solve, A, torch.randn(2, 3, 4, dtype=dtype), left=False, **tol)
    check(torch.linalg.inv_ex, A, **tol)
    check(torch.linalg.inv, A, **_grad(dtype))
    check(torch.linalg.det, A, **_grad(dtype))
    check(torch.linalg.slogdet, A, **_grad(dtype))
    check(torch.logdet, A @ A.mT, **tol)


def test_empty_matrices():
    E = torch.randn(2, 0, 0)
    for fn in (torch.linalg.cholesky_ex, torch.linalg.inv_ex, torch.linalg.slogdet, torch.linalg.lu_factor_ex):
        check(fn, E)


def test_singular_info_and_det():
    S = torch.tensor([[1.0, 2.0], [2.0, 4.0]])
    check(torch.linalg.inv_ex, S)
    check(torch.linalg.lu_factor_ex, S)
    check(torch.linalg.det, S)
    check(torch.linalg.slogdet, S)


def test_det_gradient_of_noncontiguous_matrix():
    # PyTorch factors A^T for a contiguous real A and its backward asks A.is_contiguous() again:
    # the lowering assumes contiguous, so A.mT gets the transposed gradient.
    check(lambda a: torch.linalg.det(a.mT), _wellcond(3, 3, dtype=torch.float64), grad=True)


@pytest.mark.parametrize("dtype", FLOATS)
def test_qr_geqrf_householder(dtype):
    tol = _tol(dtype)
    A = torch.randn(2, 5, 3, dtype=dtype)
    check(torch.linalg.qr, A, **tol)
    check(_qr_product, A, mode="reduced", **_grad(dtype))
    check(torch.linalg.qr, A.mT, mode="complete", **tol)  # wide
    check(lambda a: torch.linalg.qr(a, mode="r").R, A, **tol)
    check(torch.geqrf, A, **tol)
    a, tau = torch.geqrf(A)
    check(torch.linalg.householder_product, a, tau, **tol)  # its backward: a long loop of small ops
    check(torch.ormqr, a, tau, torch.randn(2, 5, 2, dtype=dtype), transpose=True, **tol)


@pytest.mark.parametrize("dtype", FLOATS)
def test_svd_eigh(dtype):
    tol = _tol(dtype)
    A = torch.randn(2, 5, 3, dtype=dtype)
    check(torch.linalg.svdvals, A, **_grad(dtype))
    check(torch.linalg.svd, A, full_matrices=False, **tol)  # raw factors: LAPACK's signs on CPU
    check(_svd_product, A, **_grad(dtype))
    check(torch.linalg.pinv, A, **tol)
    H = _spd(2, 4, 4, dtype=dtype)
    check(torch.linalg.eigvalsh, H, **_grad(dtype))
    check(torch.linalg.eigvalsh, torch.randn(4, 4, dtype=dtype), UPLO="U", **tol)
    check(lambda h: [x.abs() for x in torch.linalg.eigh(h)], H, **tol)  # eigenvectors up to sign
    check(_eigh_product, H, **_grad(dtype))


@pytest.mark.parametrize("dtype", FLOATS)
def test_matrix_exp_cross(dtype):
    tol = _tol(dtype)
    check(torch.linalg.matrix_exp, torch.randn(2, 4, 4, dtype=dtype) / 2, **_grad(dtype))
    check(torch.linalg.cross, torch.randn(4, 3, dtype=dtype), torch.randn(1, 3, dtype=dtype), **_grad(dtype))
    check(torch.cross, torch.randn(3, 2, dtype=dtype), torch.randn(3, 2, dtype=dtype), dim=0, **tol)


@pytest.mark.parametrize("norm", [1e-5, 0.03, 0.3, 1.0, 2.0, 20.0])
def test_matrix_exp_follows_cpus_taylor_degrees(norm):
    # CPU picks a Taylor degree (1..18) by the 1-norm of one matrix, and degree 18 with scaling and
    # squaring for a batch; the same steps agree to float32 rounding, where a Pade scheme did not.
    # Rounding grows with the squarings: float32 entries are held to 2e-5 of the result's largest
    # (over 300 random inputs of norm 20 the largest difference was 1.0e-5 of it).
    torch.manual_seed(0)
    a = torch.randn(4, 4)
    a = a * (norm / torch.linalg.matrix_norm(a, 1))
    for x in (a, torch.stack([a, a / 10, a * 3])):
        scale = torch.linalg.matrix_exp(x).abs().max().item()
        check(torch.linalg.matrix_exp, x, rtol=1e-5, atol=max(1e-6, 2e-5 * scale))
    check(torch.linalg.matrix_exp, a.double(), rtol=1e-12, atol=1e-14)
    check(torch.linalg.matrix_exp, torch.full((3, 3), float("nan")))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_matrix_exp_half(dtype):
    # Computed in float32 and rounded once. CPU's own half kernel gives NaN for this input (its
    # squaring steps overflow in half), so the reference is CPU's float32 result, rounded.
    a = (torch.randn(5, 5) * 2).to(dtype)
    actual = torch.linalg.matrix_exp(a.to("neuron")).cpu()
    torch.testing.assert_close(actual, torch.linalg.matrix_exp(a.float()).to(dtype))


def test_eig():
    # General eigenproblem: XLA has no kernel of its own; JAX runs LAPACK's geev on CPU. The
    # eigenvectors agree with PyTorch's up to a unit factor per column (complex pairs can differ
    # in sign), so compare |V| and the reconstruction.
    A = torch.randn(2, 4, 4, dtype=torch.float64)
    check(torch.linalg.eigvals, A)
    check(lambda a: torch.linalg.eig(a).eigenvectors.abs(), A)
    check(_eig_product, A)


def test_out_variants():
    A = _spd(3, 3, dtype=torch.float32)
    out = torch.empty(0)
    check(lambda a, o: torch.linalg.cholesky(a, out=o), A, out)
    check(lambda a, o: torch.linalg.inv(a, out=o), A, out)
    check(lambda a, o: torch.linalg.eigvalsh(a, out=o), A, out)


def test_geqrf_out_resized_like_cpu():
    """geqrf has no meta kernel: its out= tensors are resized from our own result layout."""
    A = torch.randn(2, 5, 3)
    def geqrf_out(a):
        outs = (torch.empty(0, device=a.device), torch.empty(0, device=a.device))
        torch.geqrf(a, out=outs)
        return outs
    cpu, dev = geqrf_out(A), geqrf_out(A.to("neuron"))
    for c, d in zip(cpu, dev):
        assert d.stride() == c.stride()
        torch.testing.assert_close(d.cpu(), c, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("driver", [None, "gels", "gelsd", "gelss"])
def test_lstsq_output_conventions(driver):
    """Which outputs are empty depends on the driver, the shape and the rank, as on CPU."""
    torch.manual_seed(0)
    for a, b in [(torch.randn(5, 3), torch.randn(5, 2)), (torch.randn(2, 5, 3), torch.randn(2, 5, 2)),
                 (torch.randn(3, 5), torch.randn(3, 2)), (torch.randn(5, 3), torch.randn(5))]:
        check(lambda a, b: torch.linalg.lstsq(a, b, driver=driver), a, b, rtol=1e-4, atol=1e-4)


def _indefinite(batch, n, dtype, hermitian=False):
    """Symmetric (Hermitian) matrices whose pivots cover every Bunch-Kaufman case: zero diagonals
    (2x2 blocks), graded rows (1x1 interchanges), a zero matrix and a zero column (info > 0); the
    upper triangle holds junk that must be ignored."""
    a = torch.randn(batch, n, n, dtype=dtype)
    a = a + (a.mH if hermitian else a.mT)
    if n > 2:
        a[0].diagonal().zero_()
        a[1] = a[1] * torch.logspace(-2, 2, n, dtype=torch.float64).to(dtype)
        a[1] = a[1] + (a[1].mH if hermitian else a[1].mT)
        a[2] = 0
        a[3, :, 1] = 0
        a[3, 1, :] = 0
    return a + torch.triu(torch.randn(n, n, dtype=dtype), 1)


@pytest.mark.usefixtures("lowered_only")
@pytest.mark.parametrize("dtype, hermitian", [(torch.float32, False), (torch.float64, True),
                                              (torch.complex64, False), (torch.complex128, True)])
def test_ldl_factor_and_solve_follow_lapack(dtype, hermitian):
    # The factor is not unique: the lowering follows LAPACK's sytf2/hetf2 step by step, so LD, the
    # 1-based pivots (negative for 2x2 blocks) and info equal CPU's exactly in convention.
    torch.manual_seed(0)
    single = dtype in (torch.float32, torch.complex64)
    tol = {"rtol": 1e-4, "atol": 1e-4} if single else {}
    solve_tol = {"rtol": 1e-3, "atol": 1e-3} if single else {}
    for n in (0, 1, 2, 5, 8) if dtype.is_complex else range(9):  # each size compiles anew
        A = _indefinite(5, n, dtype, hermitian)
        LD, pivots, info = check(torch.linalg.ldl_factor_ex, A, hermitian=hermitian, **tol)
        if n > 2:
            assert (pivots.cpu() < 0).any() and info.cpu()[2] == 1
        ok = info.cpu() == 0
        LD_c, piv_c = LD.cpu()[ok], pivots.cpu()[ok]
        B = torch.randn(int(ok.sum()), n, 3, dtype=dtype)
        check(torch.linalg.ldl_solve, LD_c, piv_c, B, hermitian=hermitian, **solve_tol)
    A = _indefinite(4, 6, dtype, hermitian)[:2]
    LD, pivots = check(torch.linalg.ldl_factor, A, hermitian=hermitian, **tol)
    B = torch.randn(3, 2, 6, 2, dtype=dtype)
    check(torch.linalg.ldl_solve, LD.cpu()[0], pivots.cpu()[0], B, hermitian=hermitian, **solve_tol)  # broadcast


def test_ldl_out_variants_and_errors():
    A = _indefinite(4, 5, torch.float64)
    check(lambda a: torch.linalg.ldl_factor_ex(a, out=(torch.empty(0, device=a.device, dtype=a.dtype),
                                                       torch.empty(0, device=a.device, dtype=torch.int32),
                                                       torch.empty(0, device=a.device, dtype=torch.int32))), A)
    LD, pivots = torch.linalg.ldl_factor(A[:2])
    B = torch.randn(2, 5, 2, dtype=torch.float64)
    check(lambda ld, p, b: torch.linalg.ldl_solve(ld, p, b, out=torch.empty(0, device=b.device, dtype=b.dtype)),
          LD, pivots, B)
    # A singular D raises as on CPU (PyTorch reports sytrf's info > 0 as an unknown error code)
    with pytest.raises(RuntimeError, match="ldl_factor: Unknown error code: 1"):
        torch.linalg.ldl_factor(A[2].to("neuron"))


@pytest.mark.parametrize("driver", [None, "gels", "gelsd"])
def test_lstsq_complex_residuals_are_real(driver):
    torch.manual_seed(0)
    for m in (5, 3):  # residuals computed (m > n) and empty
        a, b = torch.randn(m, 3, dtype=torch.complex64), torch.randn(m, 2, dtype=torch.complex64)
        check(lambda a, b: torch.linalg.lstsq(a, b, driver=driver), a, b, rtol=1e-4, atol=1e-4)
