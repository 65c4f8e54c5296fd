"""Golden values of the CIFAR-10-C corruptions: the authors' ``make_cifar_c.py`` (hendrycks/robustness, pinned below)
run on the first two images of ``inputs.npz``, every implemented corruption at severities 1-5, each call after
``np.random.seed(SEED(corruption, severity, image))``. ``tests/test_corruptions.py`` replays numpy's legacy
generator from the same seeds in the same order, so fastfair's formulas see the reference's random numbers.

Not a ``gen_*.py`` of make.py: the reference needs scikit-image and OpenCV, which fastfair does not depend on, so it
runs in an environment of its own (CPU, a minute; motion_blur and snow call ImageMagick through Wand):

    apt-get install imagemagick     # ImageMagick 6 (6.9.11 made the stored values)
    python -m venv /tmp/ref && /tmp/ref/bin/pip install numpy scipy scikit-image opencv-python-headless pillow wand
    git clone https://github.com/hendrycks/robustness /tmp/robustness
    /tmp/ref/bin/python tests/golden/corruptions_reference.py /tmp/robustness

The reference's functions are imported from the checkout's text with the shims today's libraries need (none
changes a formula): ``multichannel=True`` -> ``channel_axis=-1`` (scikit-image 0.19), ``np.float_`` ->
``np.float64`` and ``np.fromstring`` -> ``np.frombuffer`` (numpy 2), ``scipy.ndimage.interpolation`` ->
``scipy.ndimage``; torch/torchvision (the data set loop's) left out;
scikit-image's ``random_noise(mode='s&p')`` given its two Bernoulli draws from ``np.random`` (its own generator
cannot be seeded from the script; the algorithm is scikit-image 0.26's ``_bernoulli``: uniform <= p); the script's
module-level data loop cut off.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
from PIL import Image

HERE = Path(__file__).resolve().parent
REPO = "hendrycks/robustness"
PINNED = "8190fe329f5f072a06e3a2aea02bb5dda69aed9f"
FILE = "ImageNet-C/create_c/make_cifar_c.py"
NAMES = ["gaussian_noise", "shot_noise", "impulse_noise", "defocus_blur", "glass_blur", "zoom_blur", "fog",
         "brightness", "contrast", "elastic_transform", "pixelate", "jpeg_compression", "speckle_noise",
         "gaussian_blur", "saturate", "motion_blur", "snow"]
IMAGES = 2


def seed(name: str, severity: int, image: int) -> int:
    """The numpy seed of one reference call (the test uses the same)."""
    return 1000 * NAMES.index(name) + 10 * severity + image


def reference(checkout: Path) -> dict:
    """The reference's functions, from its text with the shims named in the module docstring."""
    text = (checkout / FILE).read_text()
    text = text[:text.index("# /////////////// End Distortions ///////////////")]
    text = "\n".join(line for line in text.splitlines() if "torch" not in line)  # the data set loop's imports
    for old, new in (("multichannel=True", "channel_axis=-1"), ("np.float_", "np.float64"),
                     ("scipy.ndimage.interpolation", "scipy.ndimage"),
                     ("np.fromstring", "np.frombuffer")):
        text = text.replace(old, new)
    namespace: dict = {}
    exec(compile(text, FILE, "exec"), namespace)

    def salt_and_pepper(image, mode, amount, salt_vs_pepper=0.5):
        assert mode == "s&p"
        out = image.copy()
        flipped = np.random.random_sample(image.shape) <= amount
        salted = np.random.random_sample(image.shape) <= salt_vs_pepper
        out[flipped & salted] = 1
        out[flipped & ~salted] = 0
        return out

    namespace["sk"].util.random_noise = salt_and_pepper
    return namespace


def main(checkout: Path) -> None:
    commit = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True,
                            check=True).stdout.strip()
    if commit != PINNED:
        raise SystemExit(f"{checkout} is at {commit}; git -C {checkout} checkout {PINNED}")
    ref = reference(checkout)
    x = np.load(HERE / "inputs.npz")["x_uint8"][:IMAGES]  # (N, 3, 32, 32) uint8
    out = {}
    for name in NAMES:
        rows = []
        for severity in range(1, 6):
            row = []
            for i, image in enumerate(x):
                np.random.seed(seed(name, severity, i))
                pil = Image.fromarray(image.transpose(1, 2, 0))
                row.append(np.uint8(ref[name](pil, severity)).transpose(2, 0, 1))  # stored as CIFAR-10-C stores it
            rows.append(row)
        out[name] = np.stack([np.stack(r) for r in rows])  # (5 severities, N, 3, 32, 32)
    np.savez_compressed(HERE / "corruptions.npz", **out)
    import cv2
    import scipy
    import skimage
    import wand.version
    meta = {"repository": REPO, "commit": commit, "file": FILE, "images": f"inputs.npz x_uint8[:{IMAGES}]",
            "seed": "1000 * NAMES.index(name) + 10 * severity + image", "names": NAMES,
            "versions": {"numpy": np.__version__, "scipy": scipy.__version__, "scikit-image": skimage.__version__,
                         "opencv": cv2.__version__, "pillow": Image.__version__,
                         "imagemagick": wand.version.MAGICK_VERSION}}
    (HERE / "corruptions.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"wrote corruptions.npz ({len(out)} corruptions) at {REPO}@{commit[:7]}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
