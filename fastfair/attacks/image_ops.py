"""The image operations the natural corruptions are made of, batched in torch on (N, C, H, W) images: the filters,
resamplers and colour conversions of scipy.ndimage, scikit-image, OpenCV and Pillow that Hendrycks & Dietterich's
``make_cifar_c.py`` calls, each with the border rule and rounding of the library it stands for (named per function),
so a corruption reads as the reference does and ``tests/test_corruptions.py`` can hold it to the reference's output.

Kernels and resampling weights are built in float64 numpy from the parameters alone (no image data), then used on the
images' device in their dtype.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

# Pillow's fixed point for 8-bit resampling (libImaging/Resample.c): weights in units of 2^-22, sums rounded half up
_PIL_PRECISION_BITS = 32 - 8 - 2


def border_index(n: int, pad: int, mode: str, device=None) -> torch.Tensor:
    """Indices of an axis of length ``n`` extended by ``pad`` on each side: ``nearest`` (aa|abcd|dd, scipy and
    scikit-image's default), ``reflect`` (ba|abcd|dc, scipy's half-sample symmetric) or ``mirror`` (cb|abcd|cb,
    OpenCV's BORDER_REFLECT_101)."""
    i = np.arange(-pad, n + pad)
    if mode == "nearest":
        i = i.clip(0, n - 1)
    elif mode == "reflect":
        i = i % (2 * n)
        i = np.where(i < n, i, 2 * n - 1 - i)
    elif mode == "mirror":
        i = i % max(2 * n - 2, 1)
        i = np.where(i < n, i, 2 * n - 2 - i)
    else:
        raise ValueError(f"unknown border mode {mode!r}")
    return torch.as_tensor(i, device=device)


def correlate1d(x: torch.Tensor, weights: np.ndarray, dim: int, mode: str) -> torch.Tensor:
    """scipy.ndimage.correlate1d of ``x`` along ``dim`` with an odd-length kernel, border by ``mode``."""
    r = len(weights) // 2
    n = x.shape[dim]
    padded = x.index_select(dim, border_index(n, r, mode, x.device))
    return sum(float(w) * padded.narrow(dim, k, n) for k, w in enumerate(weights))


def gaussian_weights(sigma: float, truncate: float) -> np.ndarray:
    """scipy.ndimage's 1-D Gaussian: exp(-x^2 / 2 sigma^2) on x in [-r, r], r = int(truncate sigma + 0.5), summing
    to 1."""
    r = int(truncate * sigma + 0.5)
    phi = np.exp(-0.5 / sigma ** 2 * np.arange(-r, r + 1, dtype=np.float64) ** 2)
    return phi / phi.sum()


def gaussian(x: torch.Tensor, sigma: float, mode: str = "nearest", truncate: float = 4.0) -> torch.Tensor:
    """skimage.filters.gaussian over the last two axes (scipy.ndimage.gaussian_filter, default border ``nearest``);
    sigma 0 leaves the image as it is, as scipy does."""
    if sigma <= 1e-15:
        return x
    w = gaussian_weights(sigma, truncate)
    return correlate1d(correlate1d(x, w, -2, mode), w, -1, mode)


def cv2_gaussian_kernel(size: int, sigma: float) -> np.ndarray:
    """cv2.getGaussianKernel(size, sigma): exp(-(i - (size - 1)/2)^2 / 2 sigma^2), summing to 1."""
    i = np.arange(size, dtype=np.float64) - (size - 1) / 2
    k = np.exp(-i ** 2 / (2 * sigma ** 2))
    return k / k.sum()


def cv2_gaussian_blur(image: np.ndarray, size: int, sigma: float) -> np.ndarray:
    """cv2.GaussianBlur of a 2-D float array with a square ``size`` kernel (border BORDER_REFLECT_101), in numpy:
    for the kernels built from parameters."""
    k = cv2_gaussian_kernel(size, sigma)
    r = size // 2
    for axis in (0, 1):
        idx = border_index(image.shape[axis], r, "mirror").numpy()
        padded = np.take(image, idx, axis=axis)
        image = sum(w * np.take(padded, np.arange(j, j + image.shape[axis]), axis=axis) for j, w in enumerate(k))
    return image


def filter2d(x: torch.Tensor, kernel: np.ndarray) -> torch.Tensor:
    """cv2.filter2D(channel, -1, kernel) on every channel: correlation with a square odd kernel, border
    BORDER_REFLECT_101 (torch's ``reflect`` padding)."""
    r = kernel.shape[0] // 2
    c = x.shape[1]
    weight = torch.as_tensor(kernel, dtype=x.dtype, device=x.device).expand(c, 1, *kernel.shape)
    return F.conv2d(F.pad(x, (r, r, r, r), mode="reflect"), weight, groups=c)


def zoom_linear(x: torch.Tensor, zoom: float) -> torch.Tensor:
    """scipy.ndimage.zoom(..., order=1) over the last two axes: output side round(side zoom), output pixel o read at
    o (side - 1) / (out - 1) (corners aligned), linear interpolation."""
    size = [int(round(s * zoom)) for s in x.shape[-2:]]
    return F.interpolate(x, size=size, mode="bilinear", align_corners=True)


def rgb_to_hsv(x: torch.Tensor) -> torch.Tensor:
    """skimage.color.rgb2hsv on (N, 3, H, W): V = max, S = (max - min) / max (0 at black), H in [0, 1) from the
    channel that is largest (blue before green before red on ties, as scikit-image assigns them last), 0 on grey."""
    r, g, b = x.unbind(1)
    v = x.amax(1)
    delta = v - x.amin(1)
    s = torch.where(v == 0, torch.zeros_like(v), delta / torch.where(v == 0, torch.ones_like(v), v))
    safe = torch.where(delta == 0, torch.ones_like(delta), delta)
    h = torch.where(b == v, 4 + (r - g) / safe, torch.where(g == v, 2 + (b - r) / safe, (g - b) / safe))
    h = torch.where(delta == 0, torch.zeros_like(h), (h / 6) % 1)
    return torch.stack([h, s, v], 1)


def hsv_to_rgb(hsv: torch.Tensor) -> torch.Tensor:
    """skimage.color.hsv2rgb on (N, 3, H, W): sector i = floor(6 H) mod 6, f = 6 H - floor(6 H), the usual
    (v, t, p), (q, v, p), ... table with p = v (1 - s), q = v (1 - f s), t = v (1 - (1 - f) s)."""
    h, s, v = hsv.unbind(1)
    hi = torch.floor(h * 6)
    f = h * 6 - hi
    hi = (hi % 6).long()
    p, q, t = v * (1 - s), v * (1 - f * s), v * (1 - (1 - f) * s)
    table = torch.stack([torch.stack(c, 1) for c in ((v, t, p), (q, v, p), (p, v, t), (p, q, v), (t, p, v),
                                                     (v, p, q))], 0)  # (6, N, 3, H, W)
    return table.gather(0, hi[None, :, None].expand(1, -1, 3, -1, -1)).squeeze(0)


def pil_box_weights(n_in: int, n_out: int) -> np.ndarray:
    """Pillow's Image.resize(BOX) weights of one axis (Resample.c ``precompute_coeffs`` and
    ``normalize_coeffs_8bpc``): output pixel o averages the inputs i with (i + 0.5 - center) / scale in (-0.5, 0.5],
    center = (o + 0.5) n_in / n_out, scale = max(n_in / n_out, 1), as integers in units of 2^-22 (rounded half
    up). An (n_out, n_in) float64 array of those integers."""
    scale = n_in / n_out
    filterscale = max(scale, 1.0)
    support = 0.5 * filterscale
    out = np.zeros((n_out, n_in))
    for o in range(n_out):
        center = (o + 0.5) * scale
        lo = max(int(center - support + 0.5), 0)
        hi = min(int(center + support + 0.5), n_in)
        t = (np.arange(lo, hi) - center + 0.5) / filterscale
        w = ((t > -0.5) & (t <= 0.5)).astype(np.float64)
        if w.sum():
            out[o, lo:hi] = np.floor(0.5 + w / w.sum() * (1 << _PIL_PRECISION_BITS))
    return out


def pil_resize_box(levels: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Pillow's Image.resize((width, height), BOX) of an 8-bit image given as float64 levels 0..255 (N, C, H, W):
    the horizontal pass, rounded to 8 bits, then the vertical pass, in exact integer arithmetic (float64 holds the
    sums of products of 8-bit levels and 22-bit weights exactly)."""
    def one_axis(t: torch.Tensor, weights: np.ndarray) -> torch.Tensor:
        s = t @ torch.as_tensor(weights.T, dtype=torch.float64, device=t.device)
        return torch.floor((s + (1 << (_PIL_PRECISION_BITS - 1))) / (1 << _PIL_PRECISION_BITS)).clamp(0, 255)

    wide = one_axis(levels, pil_box_weights(levels.shape[-1], width))
    return one_axis(wide.transpose(-1, -2), pil_box_weights(levels.shape[-2], height)).transpose(-1, -2)


def bilinear_sample(x: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, border: str) -> torch.Tensor:
    """x (N, C, H, W) read at pixel coordinates ``rows``, ``cols`` (N, H', W') by bilinear interpolation; beyond the
    image ``mirror`` extends it as OpenCV's BORDER_REFLECT_101 and ``reflect`` as scipy's half-sample symmetric
    mode (grid_sample's reflection about the border pixels' centres or their outer edges)."""
    h, w = x.shape[-2:]
    corners = border == "mirror"
    if corners:  # align_corners=True: -1 and 1 are the centres of the first and last pixels
        grid = torch.stack([2 * cols / (w - 1) - 1, 2 * rows / (h - 1) - 1], -1)
    else:  # align_corners=False: -1 and 1 are the outer edges of the first and last pixels
        grid = torch.stack([(2 * cols + 1) / w - 1, (2 * rows + 1) / h - 1], -1)
    return F.grid_sample(x, grid.to(x.dtype), mode="bilinear", padding_mode="reflection", align_corners=corners)
