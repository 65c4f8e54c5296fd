"""Natural corruptions of CIFAR-10-C (Hendrycks & Dietterich 2019, "Benchmarking Neural Network Robustness to
Common Corruptions and Perturbations", ICLR, Sec. 3 and App. B), evaluated per class as ``corrupt:NAME@S``
(Benz et al. 2021, Sec. 3.4).

Each corruption is the function of the same name in the authors' ``ImageNet-C/create_c/make_cifar_c.py``
(hendrycks/robustness@8190fe3) with its CIFAR parameter table (smaller than ImageNet-C's, which the pip package
``imagecorruptions`` carries), rewritten in torch: batched, on the images' device, in float64 as numpy computes,
and drawn from torch's generator, which the evaluation seeds per batch (:mod:`fastfair.evaluation.seeds`), so the
same seed gives the same corrupted images. Every result is truncated to 8-bit levels as the reference's
``np.uint8`` stores CIFAR-10-C. ``jpeg_compression`` runs Pillow's encoder on the host, as the reference does.

``motion_blur`` and ``snow`` call ImageMagick 6's motion blur through Wand in the reference; fastfair computes
its kernel and offsets in torch. Not implemented (refused by name with the reason, :data:`REFUSED`): ``frost``
blends in the reference's frost photographs, ``spatter`` draws its water with OpenCV's Canny edges, distance
transform and histogram equalisation.

The random draws go through a :class:`TorchDraws` (or a test's replay of the reference's draws), so the formulas
can be held to the reference's output on the reference's own random numbers.
"""
from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from PIL import Image

from fastfair.attacks.image_ops import (bilinear_sample, cv2_gaussian_blur, filter2d, gaussian, hsv_to_rgb,
                                        pil_resize_box, rgb_to_hsv, zoom_linear)
from fastfair.errors import UserError

SEVERITIES = (1, 2, 3, 4, 5)


class TorchDraws:
    """The random numbers of a corruption, from torch's default generator on ``device`` (float64)."""

    def __init__(self, device):
        self.device = device

    def normal(self, shape, loc: float = 0.0, scale: float = 1.0) -> torch.Tensor:
        return torch.randn(shape, device=self.device, dtype=torch.float64) * scale + loc

    def uniform(self, shape, low: float, high: float) -> torch.Tensor:
        return torch.rand(shape, device=self.device, dtype=torch.float64) * (high - low) + low

    def random(self, shape) -> torch.Tensor:
        return torch.rand(shape, device=self.device, dtype=torch.float64)

    def poisson(self, rate: torch.Tensor) -> torch.Tensor:
        return torch.poisson(rate)

    def integers(self, low: int, high: int, shape) -> torch.Tensor:
        """Integers in [low, high), as numpy's randint."""
        return torch.randint(low, high, shape, device=self.device)


# ---- noise (Hendrycks & Dietterich 2019, Sec. 3, 'Noise') ----------------------------------------------------

def gaussian_noise(x, c: float, draws):
    """x + N(0, c^2) per pixel (Hendrycks & Dietterich 2019, Sec. 3, Gaussian noise; make_cifar_c.py)."""
    return x + draws.normal(x.shape, scale=c)


def shot_noise(x, c: float, draws):
    """Poisson(c x) / c per pixel, photon counts at c per unit intensity (Sec. 3, shot noise; make_cifar_c.py)."""
    return draws.poisson(x * c) / c


def impulse_noise(x, c: float, draws):
    """Salt and pepper: each pixel with probability c set to 1 or 0 with equal odds, as scikit-image's
    ``random_noise(mode='s&p', amount=c)`` (Sec. 3, impulse noise; make_cifar_c.py)."""
    flipped = draws.random(x.shape) <= c
    salted = draws.random(x.shape) <= 0.5
    return torch.where(flipped, salted.to(x.dtype), x)


def speckle_noise(x, c: float, draws):
    """x + x N(0, c^2) per pixel (App. B, speckle noise, one of the four extra corruptions; make_cifar_c.py)."""
    return x + x * draws.normal(x.shape, scale=c)


# ---- blur (Sec. 3, 'Blur') -----------------------------------------------------------------------------------

def gaussian_blur(x, c: float, draws):
    """Gaussian filter of standard deviation c pixels, border repeated (App. B, Gaussian blur; make_cifar_c.py)."""
    return gaussian(x, c)


def glass_blur(x, c: tuple, draws):
    """Gaussian blur, 8-bit, then ``iterations`` passes that move pixels locally, then Gaussian blur again (Sec. 3,
    glass blur; make_cifar_c.py). The reference's loop "swaps" x[h, w] and x[h + dy, w + dx] (dx, dy drawn from
    [-delta, delta), h, w from H - delta down to delta + 1) through numpy views, which copies the neighbour into
    x[h, w] and leaves the neighbour as it was; with delta 1 (every CIFAR severity) each read lies above or left of
    every pixel written before it in the pass, so a pass is one gather from the image before it."""
    sigma, delta, iterations = c
    x = torch.floor(gaussian(x, sigma) * 255)
    n, _, h, w = x.shape
    rows = torch.arange(h - delta, delta, -1, device=x.device)  # the reference's loop order
    cols = torch.arange(w - delta, delta, -1, device=x.device)
    for _ in range(iterations):
        step = draws.integers(-delta, delta, (n, len(rows), len(cols), 2))  # (dx, dy) per position, loop order
        src_r = rows[None, :, None] + step[..., 1]
        src_c = cols[None, None, :] + step[..., 0]
        flat = x.flatten(2)
        moved = flat.gather(2, (src_r * w + src_c).flatten(1)[:, None].expand(-1, x.shape[1], -1))
        dst = (rows[:, None] * w + cols[None, :]).flatten()
        flat = flat.clone()
        flat[:, :, dst] = moved
        x = flat.view_as(x)
    return gaussian(x / 255, sigma)


def _disk(radius: float, alias_blur: float) -> np.ndarray:
    """The reference's ``disk``: the pixels within ``radius`` of the centre of a 17 x 17 grid, summing to 1, then
    anti-aliased by OpenCV's 3 x 3 Gaussian blur of standard deviation ``alias_blur`` (radii up to 8)."""
    grid = np.arange(-8, 9)
    xx, yy = np.meshgrid(grid, grid)
    disk = (xx ** 2 + yy ** 2 <= radius ** 2).astype(np.float64)
    kernel = cv2_gaussian_blur(disk / disk.sum(), 3, alias_blur).astype(np.float32)  # the reference's dtype
    r = int(np.abs(np.argwhere(kernel) - 8).max())  # the zero border adds nothing: a 5 x 5 to 7 x 7 kernel is left
    return kernel[8 - r:9 + r, 8 - r:9 + r]


def defocus_blur(x, c: tuple, draws):
    """Correlation with an anti-aliased disk of radius c[0] (alias blur c[1]), border mirrored (Sec. 3, defocus
    blur; make_cifar_c.py: cv2.filter2D per channel)."""
    return filter2d(x, _disk(*c))


def _clipped_zoom(x, z: float):
    """The centre 1/z of the image zoomed by z by linear interpolation, its centre cut to the image's size
    (make_cifar_c.py ``clipped_zoom``)."""
    h, w = x.shape[-2:]
    ch, cw = int(np.ceil(h / z)), int(np.ceil(w / z))
    top, left = (h - ch) // 2, (w - cw) // 2
    big = zoom_linear(x[..., top:top + ch, left:left + cw], float(z))
    trim_top, trim_left = (big.shape[-2] - h) // 2, (big.shape[-1] - w) // 2
    return big[..., trim_top:trim_top + h, trim_left:trim_left + w]


def zoom_blur(x, c: np.ndarray, draws):
    """The mean of the image and its centre zoomed by each factor in c (1, 1.01, ...) (Sec. 3, zoom blur;
    make_cifar_c.py)."""
    return (x + sum(_clipped_zoom(x, z) for z in c)) / (len(c) + 1)


def _motion_blur(x, radius: float, sigma: float, angle: torch.Tensor):
    """ImageMagick 6's MotionBlurImage as Wand calls it, truncated to 8 bits as the reference's PNG round trip: a
    one-sided Gaussian exp(-i^2 / 2 sigma^2), i = 0 .. 2 ceil(radius), summing to 1, over the pixels at
    (ceil(i cos a - 1/2), ceil(i sin a - 1/2)) from each pixel (a in degrees per image), edge pixels repeated."""
    width = int(2 * np.ceil(radius) + 1)
    weights = np.exp(-np.arange(width) ** 2 / (2 * sigma ** 2))
    weights /= weights.sum()
    a = torch.deg2rad(angle)
    px, py = width * torch.sin(a), width * torch.cos(a)
    hyp = torch.hypot(px, py)
    i = torch.arange(width, dtype=torch.float64, device=x.device)
    off_col = torch.ceil(i * py[:, None] / hyp[:, None] - 0.5).long()  # (n, width)
    off_row = torch.ceil(i * px[:, None] / hyp[:, None] - 0.5).long()
    n, c, h, w = x.shape
    rows, cols = torch.arange(h, device=x.device), torch.arange(w, device=x.device)
    out = torch.zeros_like(x)
    for k in range(width):
        r = (rows[None] + off_row[:, k, None]).clamp(0, h - 1)  # (n, h)
        q = (cols[None] + off_col[:, k, None]).clamp(0, w - 1)  # (n, w)
        moved = x.gather(2, r[:, None, :, None].expand(n, c, h, w)).gather(3, q[:, None, None, :].expand(n, c, h, w))
        out = out + float(weights[k]) * moved
    return torch.floor(out.clamp(0, 1) * 255) / 255  # 8-bit PNG out of Wand: truncated (measured, Q16)


def motion_blur(x, c: tuple, draws):
    """ImageMagick's motion blur of radius c[0], sigma c[1] along an angle U(-45, 45) degrees per image (Sec. 3,
    motion blur; make_cifar_c.py through Wand)."""
    return _motion_blur(x, *c, draws.uniform((len(x),), -45, 45))


# ---- weather (Sec. 3, 'Weather') -----------------------------------------------------------------------------

def plasma_fractal(n: int, size: int, decay: float, draws) -> torch.Tensor:
    """(n, size, size) height maps in [0, 1] by the diamond-square algorithm, ``size`` a power of two: each level
    sets the centres of its squares, then of its diamonds, to the mean of their 4 corners plus w U(-w, w), w
    starting at 100 and divided by ``decay`` per level (make_cifar_c.py ``plasma_fractal``, after FLHerne/mapgen)."""
    m = torch.zeros(n, size, size, dtype=torch.float64, device=draws.device)
    step, wibble = size, 100.0

    def wibbled_mean(total):
        return total / 4 + wibble * draws.uniform(total.shape, -wibble, wibble)

    while step >= 2:
        half = step // 2
        corner = m[:, 0::step, 0::step]
        square = corner + corner.roll(-1, 1)
        m[:, half::step, half::step] = wibbled_mean(square + square.roll(-1, 2))
        centre, corner = m[:, half::step, half::step], m[:, 0::step, 0::step]
        m[:, 0::step, half::step] = wibbled_mean((centre + centre.roll(1, 1)) + (corner + corner.roll(-1, 2)))
        m[:, half::step, 0::step] = wibbled_mean((centre + centre.roll(1, 2)) + (corner + corner.roll(-1, 1)))
        step, wibble = half, wibble / decay
    m = m - m.amin((1, 2), keepdim=True)
    return m / m.amax((1, 2), keepdim=True)


def snow(x, c: tuple, draws):
    """A snow layer N(c[0], c[1]^2) per pixel, its centre zoomed by c[2], zeroed below c[3], 8-bit, motion-blurred
    (radius c[4], sigma c[5], angle U(-135, -45) degrees); the image brightened towards 1.5 grey + 0.5 with weight
    1 - c[6], grey = 0.299 R + 0.587 G + 0.114 B (OpenCV's RGB2GRAY), plus the layer and the layer turned by 180
    degrees (Sec. 3, snow; make_cifar_c.py)."""
    loc, scale, zoom, threshold, radius, sigma, keep = c
    n, _, h, w = x.shape
    layer = draws.normal((n, 1, h, w), loc=loc, scale=scale)
    layer = _clipped_zoom(layer, zoom)
    layer = torch.where(layer < threshold, torch.zeros_like(layer), layer)
    layer = torch.floor(layer.clamp(0, 1) * 255) / 255
    layer = _motion_blur(layer, radius, sigma, draws.uniform((n,), -135, -45))
    grey = (x * torch.tensor([0.299, 0.587, 0.114], dtype=x.dtype, device=x.device)[:, None, None]).sum(1, keepdim=True)
    x = keep * x + (1 - keep) * torch.maximum(x, grey * 1.5 + 0.5)
    return x + layer + layer.flip(-1, -2)


def fog(x, c: tuple, draws):
    """x + c[0] P, P a plasma fractal of decay c[1] shared by the channels, rescaled by max x / (max x + c[0]) (Sec.
    3, fog; make_cifar_c.py). The map is 32 x 32 on CIFAR; larger images take the next power of two, cropped."""
    strength, decay = c
    h, w = x.shape[-2:]
    size = 1 << (max(h, w) - 1).bit_length()
    top = x.amax((1, 2, 3), keepdim=True)
    x = x + strength * plasma_fractal(len(x), size, decay, draws)[:, None, :h, :w]
    return x * top / (top + strength)


# ---- digital (Sec. 3, 'Digital') -----------------------------------------------------------------------------

def _hsv_channel(x, channel: int, change: Callable):
    """x with one HSV channel changed (scikit-image's rgb2hsv, then hsv2rgb)."""
    hsv = rgb_to_hsv(x)
    hsv = torch.cat([hsv[:, :channel], change(hsv[:, channel:channel + 1]), hsv[:, channel + 1:]], 1)
    return hsv_to_rgb(hsv)


def brightness(x, c: float, draws):
    """V + c in HSV, clipped to [0, 1] (Sec. 3, brightness; make_cifar_c.py, scikit-image's rgb2hsv/hsv2rgb)."""
    return _hsv_channel(x, 2, lambda v: (v + c).clamp(0, 1))


def saturate(x, c: tuple, draws):
    """S c[0] + c[1] in HSV, clipped to [0, 1] (App. B, saturate, one of the four extra corruptions;
    make_cifar_c.py)."""
    return _hsv_channel(x, 1, lambda s: (s * c[0] + c[1]).clamp(0, 1))


def contrast(x, c: float, draws):
    """(x - m) c + m, m each channel's mean over the image (Sec. 3, contrast; make_cifar_c.py)."""
    mean = x.mean((2, 3), keepdim=True)
    return (x - mean) * c + mean


def elastic_transform(x, c: tuple, draws):
    """A random affine map (the three points 16 +- 10 moved by U(-c[2], c[2])), OpenCV's bilinear warp with mirrored
    border, then a displacement field c[0] G_c[1] * U(-1, 1) per axis (Gaussian of standard deviation c[1],
    truncated at 3, half-sample symmetric border) read by linear interpolation (Sec. 3, elastic; make_cifar_c.py,
    after erniejunior's gist). The table is in units of the image side (32 on CIFAR), which larger images scale by."""
    alpha, sigma, affine = c
    n, _, h, w = x.shape
    side = h
    alpha, sigma, affine = alpha * side, sigma * side, affine * side
    cy, cx, sq = h // 2, w // 2, min(h, w) // 3
    # OpenCV points are (x, y); the reference builds them from (rows, cols) of a square image
    src = torch.tensor([[cy + sq, cx + sq], [cy + sq, cx - sq], [cy - sq, cx - sq]], dtype=torch.float64,
                       device=x.device)
    dst = src + draws.uniform((n, 3, 2), -affine, affine)
    ones = torch.ones(3, 1, dtype=torch.float64, device=x.device)
    forward = torch.linalg.solve(torch.cat([src, ones], 1), dst).transpose(1, 2)  # (n, 2, 3): dst = M [src; 1]
    inverse = torch.linalg.inv(torch.cat([forward, torch.tensor([[[0.0, 0.0, 1.0]]], dtype=torch.float64,
                                                                  device=x.device).expand(n, 1, 3)], 1))[:, :2]
    rr, cc = torch.meshgrid(torch.arange(h, dtype=torch.float64, device=x.device),
                            torch.arange(w, dtype=torch.float64, device=x.device), indexing="ij")
    grid = torch.stack([cc, rr, torch.ones_like(rr)], 0).flatten(1)  # (3, h w) as (x, y, 1)
    at = inverse @ grid  # OpenCV 5 interpolates at these points; OpenCV 4 and before rounded them to 1/32 pixel
    warped = bilinear_sample(x, at[:, 1].view(n, h, w), at[:, 0].view(n, h, w), "mirror")
    dx = gaussian(draws.uniform((n, h, w), -1, 1), sigma, mode="reflect", truncate=3) * alpha
    dy = gaussian(draws.uniform((n, h, w), -1, 1), sigma, mode="reflect", truncate=3) * alpha
    return bilinear_sample(warped, rr + dy, cc + dx, "reflect")


def _levels(x) -> torch.Tensor:
    """The 8-bit levels of images in [0, 1] (CIFAR's own pixels, as the reference's PIL images hold them)."""
    return torch.round(x * 255)


def pixelate(x, c: float, draws):
    """Pillow's BOX resize to int(side c), then back (Sec. 3, pixelate; make_cifar_c.py), in Pillow's 8-bit fixed
    point."""
    h, w = x.shape[-2:]
    small = pil_resize_box(_levels(x), int(h * c), int(w * c))
    return pil_resize_box(small, h, w) / 255


def jpeg_compression(x, c: int, draws):
    """Pillow's JPEG encoder at quality c, decoded again (Sec. 3, JPEG; make_cifar_c.py); on the host, one image at
    a time, since no device runs Pillow's codec."""
    levels = _levels(x).to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()
    out = []
    for image in levels:
        buffer = io.BytesIO()
        Image.fromarray(image[..., 0] if image.shape[-1] == 1 else image).save(buffer, "JPEG", quality=c)
        decoded = np.asarray(Image.open(buffer))
        out.append(decoded.reshape(image.shape))
    return torch.as_tensor(np.stack(out), device=x.device).permute(0, 3, 1, 2).to(x.dtype) / 255


# ---- the table -------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Corruption:
    """A corruption with CIFAR's parameters for severities 1 to 5 (make_cifar_c.py)."""

    apply: Callable  # (x in [0, 1] float64, parameters, draws) -> x, before clipping and 8-bit truncation
    parameters: tuple
    family: str  # Hendrycks & Dietterich's grouping: noise, blur, weather, digital
    benchmark: bool  # one of CIFAR-10-C's 15 (Sec. 3), else one of the 4 extra (App. B)


CORRUPTIONS: dict[str, Corruption] = {
    "gaussian_noise": Corruption(gaussian_noise, (0.04, 0.06, .08, .09, .10), "noise", True),
    "shot_noise": Corruption(shot_noise, (500, 250, 100, 75, 50), "noise", True),
    "impulse_noise": Corruption(impulse_noise, (.01, .02, .03, .05, .07), "noise", True),
    "defocus_blur": Corruption(defocus_blur, ((0.3, 0.4), (0.4, 0.5), (0.5, 0.6), (1, 0.2), (1.5, 0.1)), "blur",
                               True),
    "glass_blur": Corruption(glass_blur, ((0.05, 1, 1), (0.25, 1, 1), (0.4, 1, 1), (0.25, 1, 2), (0.4, 1, 2)),
                             "blur", True),
    "motion_blur": Corruption(motion_blur, ((6, 1), (6, 1.5), (6, 2), (8, 2), (9, 2.5)), "blur", True),
    # np.arange as the reference writes it: 7, 12, 16, 21 and 26 factors
    "zoom_blur": Corruption(zoom_blur, tuple(np.arange(1, top, 0.01) for top in (1.06, 1.11, 1.16, 1.21, 1.26)),
                            "blur", True),
    "snow": Corruption(snow, ((0.1, 0.2, 1, 0.6, 8, 3, 0.95), (0.1, 0.2, 1, 0.5, 10, 4, 0.9),
                              (0.15, 0.3, 1.75, 0.55, 10, 4, 0.9), (0.25, 0.3, 2.25, 0.6, 12, 6, 0.85),
                              (0.3, 0.3, 1.25, 0.65, 14, 12, 0.8)), "weather", True),
    "fog": Corruption(fog, ((.2, 3), (.5, 3), (0.75, 2.5), (1, 2), (1.5, 1.75)), "weather", True),
    "brightness": Corruption(brightness, (.05, .1, .15, .2, .3), "weather", True),
    "contrast": Corruption(contrast, (.75, .5, .4, .3, 0.15), "digital", True),
    # (alpha, sigma, affine) in units of the image side: the reference's IMSIZE * (...) with IMSIZE 32
    "elastic_transform": Corruption(elastic_transform, ((0, 0, 0.08), (0.05, 0.2, 0.07), (0.08, 0.06, 0.06),
                                                        (0.1, 0.04, 0.05), (0.1, 0.03, 0.03)), "digital", True),
    "pixelate": Corruption(pixelate, (0.95, 0.9, 0.85, 0.75, 0.65), "digital", True),
    "jpeg_compression": Corruption(jpeg_compression, (80, 65, 58, 50, 40), "digital", True),
    "speckle_noise": Corruption(speckle_noise, (.06, .1, .12, .16, .2), "noise", False),
    "gaussian_blur": Corruption(gaussian_blur, (.4, .6, 0.7, .8, 1), "blur", False),
    "saturate": Corruption(saturate, ((0.3, 0), (0.1, 0), (1.5, 0), (2, 0.1), (2.5, 0.2)), "digital", False),
}
REFUSED = {
    "frost": "blends in crops of the authors' six frost photographs (frost1.png ... frost6.jpg), which fastfair does "
             "not ship",
    "spatter": "draws its water (severities 1-3) with OpenCV's Canny edges, distance transform and histogram "
               "equalisation, which fastfair does not reimplement",
}
# what users call them: CIFAR-10-C's own labels (make_cifar_c.py's table) and short forms
ALIASES = {"elastic": "elastic_transform", "jpeg": "jpeg_compression", "gaussian": "gaussian_noise or gaussian_blur",
           "shot": "shot_noise", "impulse": "impulse_noise", "salt-and-pepper": "impulse_noise", "s&p": "impulse_noise",
           "speckle": "speckle_noise", "defocus": "defocus_blur", "glass": "glass_blur", "zoom": "zoom_blur",
           "motion": "motion_blur", "saturation": "saturate", "noise": "gaussian_noise, shot_noise or impulse_noise"}
# groups a name may stand for: corrupt:all@S runs each of them and adds their mean
GROUPS = {"all": [n for n, c in CORRUPTIONS.items() if c.benchmark],
          "extra": [n for n, c in CORRUPTIONS.items() if not c.benchmark]}


def corrupt(x: torch.Tensor, name: str, severity: int, draws=None) -> torch.Tensor:
    """``name`` at ``severity`` (1 to 5) on images ``x`` in [0, 1] (N, C, H, W), read as 8-bit levels (the reference
    corrupts PIL images): computed in float64 outside any autocast, clipped and truncated to 8-bit levels as
    CIFAR-10-C is stored, returned in x's dtype. ``draws``: the random numbers (default torch's generator)."""
    entry = CORRUPTIONS[name]
    check_channels(name, x.shape[1])
    with torch.no_grad(), torch.autocast(x.device.type, enabled=False):
        levels = torch.round(x.double() * 255) / 255  # the reference corrupts 8-bit images
        out = entry.apply(levels, entry.parameters[severity - 1], draws or TorchDraws(x.device))
        return (torch.floor(out.clamp(0, 1) * 255) / 255).to(x.dtype)


@dataclass(frozen=True)
class Corrupt:
    """An evaluation entry that corrupts the images instead of attacking the model: ``corrupt:NAME@S``."""

    corruption: str
    severity: int

    def __call__(self, model, x, y, eps_c) -> torch.Tensor:
        return corrupt(x, self.corruption, self.severity)


def check_channels(name: str, channels: int) -> None:
    """brightness and saturate need RGB images: a UserError before any evaluation runs."""
    if name in ("brightness", "saturate") and channels != 3:
        raise UserError(f"corrupt:{name} changes an RGB image in HSV; these images have {channels} channel(s): leave "
                        "it out (corrupt:all takes it too)")
