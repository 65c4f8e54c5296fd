"""Model registry. Every model is a :class:`Classifier`: normalisation inside, penultimate
features from :meth:`Classifier.forward_features`, and a linear ``head`` that methods such as
HE may replace."""
from __future__ import annotations

from fastfair.models.base import MODELS, NORMS, Classifier, build, uses_norm
from fastfair.models.heads import HEADS
from fastfair.models import resnet, preact_resnet, wide_resnet, small_cnn, bin_norm  # noqa: F401  (register models, norms)
from fastfair.models import lenet, vgg, densenet, googlenet, inception  # noqa: F401  (Benz et al.'s architectures)

__all__ = ["MODELS", "NORMS", "HEADS", "Classifier", "build", "uses_norm"]
