"""Paper figures as reproduce targets: :mod:`.registry` holds the machinery, one module per paper registers its own."""
from fastfair.reproduce.figures import registry  # noqa: F401  (each paper's module is imported below)
from fastfair.reproduce.figures import benz  # noqa: F401
from fastfair.reproduce.figures import cfa  # noqa: F401
from fastfair.reproduce.figures import me  # noqa: F401
from fastfair.reproduce.figures import tian_iclr  # noqa: F401
from fastfair.reproduce.figures import tian_kdd  # noqa: F401
