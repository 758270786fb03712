"""nn.functional.ctc_loss: the connectionist temporal classification loss, as PyTorch's CPU kernel.

Each target is extended with blanks around every label (l' of length 2L + 1); the forward
variables alpha (log-space, recursion over time in a `lax.scan`) sum the probabilities of every
alignment that reaches position s of l' at time t, and the loss is minus the log of the two
alignments that end the target. Backward runs the matching beta recursion and returns CPU's
gradient, which is with respect to the activations before log_softmax: exp(log_probs) minus the
posterior of each label. The composite above applies zero_infinity's masking of the loss and the
reduction.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from . import aten, lowers


def _log_sum3(a, b, c):
    """log(e^a + e^b + e^c) as CPU writes it: shifted by the maximum, or by 0 when all are -inf."""
    top = jnp.maximum(jnp.maximum(a, b), c)
    top = jnp.where(top == -jnp.inf, 0, top)
    return jnp.log(jnp.exp(a - top) + jnp.exp(b - top) + jnp.exp(c - top)) + top


def _shift(x, k, fill=-jnp.inf):
    """x[..., s - k] along the last axis (k may be negative), `fill` where that leaves the range."""
    pad = jnp.full(x.shape[:-1] + (abs(k),), fill, x.dtype)
    if k > 0:
        return jnp.concatenate([pad, x[..., :-k]], axis=-1)
    return jnp.concatenate([x[..., -k:], pad], axis=-1)


class _Problem:
    """The extended targets and masks of a batch, from static lengths."""

    def __init__(self, log_probs, targets, input_lengths, target_lengths, blank):
        self.T, self.N, _ = log_probs.shape
        self.il = np.asarray(input_lengths, np.int64).reshape(self.N)
        self.tl = np.asarray(target_lengths, np.int64).reshape(self.N)
        max_length = int(self.tl.max(initial=0))
        self.S = 2 * max_length + 1
        if targets.ndim == 1:  # concatenated targets: batch b's start at the sum of earlier lengths
            starts = np.concatenate([[0], np.cumsum(self.tl)[:-1]]).astype(np.int64)
            where = starts[:, None] + np.arange(max_length)[None, :]
            labels = jnp.take(targets, jnp.asarray(np.minimum(where, max(targets.shape[0] - 1, 0))), axis=0)
        else:
            labels = targets[:, :max_length]
        labels = labels.astype(jnp.int64)
        s = np.arange(self.S)
        self.real = jnp.asarray(s[None, :] < 2 * self.tl[:, None] + 1)  # (N, S): positions of each l'
        ext = jnp.full((self.N, self.S), blank, jnp.int64)
        ext = ext.at[:, 1::2].set(labels) if max_length else ext
        self.ext = jnp.where(self.real, ext, blank)
        # alpha may skip from s - 2 to s (beta from s + 2) between different labels
        self.skip = jnp.asarray(s >= 2)[None, :] & (self.ext != _shift(self.ext, 2, blank))
        self.skip_back = _shift(self.skip, -2, False)
        # log_probs of each l' position: (T, N, S)
        self.emit = jnp.take_along_axis(log_probs, jnp.broadcast_to(self.ext[None], (self.T, self.N, self.S)), axis=2)

    def alphas(self):
        """log alpha (T, N, S): -inf off each batch's l' and from its input length on."""
        ninf = jnp.full((self.N, self.S), -jnp.inf, self.emit.dtype)
        first = jnp.where(jnp.asarray(np.arange(self.S) < 2)[None] & self.real, self.emit[0], ninf)

        def step(prev, emit):
            a = _log_sum3(prev, _shift(prev, 1), jnp.where(self.skip, _shift(prev, 2), -jnp.inf)) + emit
            a = jnp.where(self.real, a, -jnp.inf)
            return a, a

        _, rest = lax.scan(step, first, self.emit[1:])
        alpha = jnp.concatenate([first[None], rest], axis=0)
        live = jnp.asarray(np.arange(self.T)[:, None] < self.il[None, :])[..., None]
        return jnp.where(live, alpha, -jnp.inf)

    def neg_log_likelihood(self, alpha):
        last = jnp.asarray(np.maximum(self.il - 1, 0))
        final = alpha[last, jnp.arange(self.N)]  # (N, S)
        end = jnp.asarray(2 * self.tl)
        a = jnp.take_along_axis(final, end[:, None], axis=1)[:, 0]
        b = jnp.take_along_axis(final, jnp.maximum(end - 1, 0)[:, None], axis=1)[:, 0]
        b = jnp.where(jnp.asarray(self.tl > 0), b, -jnp.inf)
        top = jnp.maximum(a, b)
        top = jnp.where(top == -jnp.inf, 0, top)
        nll = -(jnp.log(jnp.exp(a - top) + jnp.exp(b - top)) + top)
        empty = jnp.asarray(self.il == 0)  # no input: certain for an empty target, impossible otherwise
        return jnp.where(empty, jnp.where(jnp.asarray(self.tl == 0), 0.0, jnp.inf).astype(nll.dtype), nll)

    def betas(self):
        """log beta (T, N, S), the alignments from (t, s) to the end, each including step t."""
        s = np.arange(self.S)[None, :]
        end = (s == 2 * self.tl[:, None]) | ((s == 2 * self.tl[:, None] - 1) & (self.tl[:, None] > 0))
        end = jnp.asarray(end)
        t_last = jnp.asarray(self.il - 1)[:, None]

        def step(nxt, xs):
            t, emit = xs
            b = _log_sum3(nxt, _shift(nxt, -1), jnp.where(self.skip_back, _shift(nxt, -2), -jnp.inf)) + emit
            b = jnp.where(t < t_last, b, jnp.where((t == t_last) & end, emit, -jnp.inf))
            b = jnp.where(self.real, b, -jnp.inf)
            return b, b

        ninf = jnp.full((self.N, self.S), -jnp.inf, self.emit.dtype)
        _, beta = lax.scan(step, ninf, (jnp.arange(self.T), self.emit), reverse=True)
        return beta


def _as_lengths(x):
    return np.asarray(x).astype(np.int64).reshape(-1).tolist()


def _forward(log_probs, targets, input_lengths, target_lengths, blank):
    problem = _Problem(log_probs, targets, input_lengths, target_lengths, blank)
    alpha = problem.alphas()
    return problem.neg_log_likelihood(alpha), jnp.transpose(alpha, (1, 0, 2))


@lowers(aten._ctc_loss.default)
def ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
    return _forward(log_probs, targets, input_lengths, target_lengths, blank)


# The Tensor-lengths overload: log_alpha's last size is 2 max(target_lengths) + 1, known only from values
@lowers(aten._ctc_loss.Tensor, data_dependent=True)
def ctc_loss_tensor(log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
    return _forward(log_probs, targets, _as_lengths(input_lengths), _as_lengths(target_lengths), blank)


def _backward(grad, log_probs, targets, input_lengths, target_lengths, neg_log_likelihood, log_alpha, blank,
              zero_infinity):
    problem = _Problem(log_probs, targets, input_lengths, target_lengths, blank)
    alpha = jnp.transpose(log_alpha, (1, 0, 2))
    both = jnp.where(problem.real[None], alpha + problem.betas(), -jnp.inf)  # (T, N, S)
    # At the last input step CPU assigns the two end positions' terms instead of adding them, so
    # a target ending in the blank's label (invalid, but accepted) keeps only position 2L - 1
    last_label = jnp.take_along_axis(problem.ext, jnp.asarray(np.maximum(2 * problem.tl - 1, 0))[:, None], 1)
    overwritten = (last_label[:, 0] == blank) & jnp.asarray(problem.tl > 0)
    at_end = jnp.asarray((np.arange(problem.T)[:, None, None] == problem.il[None, :, None] - 1)
                         & (np.arange(problem.S)[None, None, :] == 2 * problem.tl[None, :, None]))
    both = jnp.where(at_end & overwritten[None, :, None], -jnp.inf, both)
    # log of the summed alpha * beta over the positions of l' that carry each label
    T, N, C = log_probs.shape
    t_index = jnp.arange(T)[:, None, None]
    n_index = jnp.arange(N)[None, :, None]
    label = jnp.broadcast_to(problem.ext[None], both.shape)
    top = jnp.full((T, N, C), -jnp.inf, both.dtype).at[t_index, n_index, label].max(both)
    safe_top = jnp.where(top == -jnp.inf, 0, top)
    total = jnp.zeros((T, N, C), both.dtype).at[t_index, n_index, label].add(
        jnp.exp(both - safe_top[t_index, n_index, label]))
    posterior_log = jnp.where(top == -jnp.inf, -jnp.inf, jnp.log(total) + safe_top)
    nll = neg_log_likelihood[None, :, None]
    out = (jnp.exp(log_probs) - jnp.exp(posterior_log + nll - log_probs)) * grad[None, :, None]
    live = jnp.asarray(np.arange(T)[:, None] < problem.il[None, :])[..., None]
    out = jnp.where(live, out, 0)
    if zero_infinity:
        out = jnp.where(nll == jnp.inf, 0, out)
    return out.astype(log_probs.dtype)


@lowers(aten._ctc_loss_backward.default)
def ctc_loss_backward(grad, log_probs, targets, input_lengths, target_lengths, neg_log_likelihood, log_alpha,
                      blank, zero_infinity=False):
    return _backward(grad, log_probs, targets, input_lengths, target_lengths, neg_log_likelihood, log_alpha,
                     blank, zero_infinity)


@lowers(aten._ctc_loss_backward.Tensor, data_dependent=True)
def ctc_loss_backward_tensor(grad, log_probs, targets, input_lengths, target_lengths, neg_log_likelihood,
                             log_alpha, blank, zero_infinity=False):
    return _backward(grad, log_probs, targets, _as_lengths(input_lengths), _as_lengths(target_lengths),
                     neg_log_likelihood, log_alpha, blank, zero_infinity)
