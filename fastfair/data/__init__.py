"""Data: data sets as uint8 tensors, class subsets, and the loaders that batch them on the device."""
from fastfair.data.datasets import DATASETS, DataBundle, load, split, subset_note
from fastfair.data.loaders import LOADERS, DeviceLoader, random_crop_flip
from fastfair.data import ffcv, folder  # noqa: F401  (register the ffcv and folder loaders and imagenet; ffcv loads only when used)
from fastfair.data import background  # noqa: F401  (registers mnist-background, Tian et al. KDD Fig. 5)

__all__ = ["DATASETS", "LOADERS", "DataBundle", "DeviceLoader", "load", "random_crop_flip", "split", "subset_note"]
